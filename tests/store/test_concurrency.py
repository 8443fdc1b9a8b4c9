"""Several threads writing, reading and deleting at once agree with a model."""

import random
import threading

from store_helpers import KiB, MiB, page_name

from hicachefs.store import PageNotFound
from hicachefs_testing.workload import content


def _page(version: int, size: int) -> bytes:
    """Bytes that name their version in the first 8 bytes."""
    return version.to_bytes(8, "little") + content(version, size)


def test_threads_agree_with_a_model(make_store):
    store = make_store(memory=4 * MiB, disk=256 * MiB, max_page_size=160 * KiB)
    shared = [f"shared/{i}" for i in range(8)]
    written: dict[str, set[int]] = {name: set() for name in shared}  # versions ever put, per shared name
    registry = threading.Lock()
    errors: list[str] = []

    def check(name: str, data: bytes, allowed) -> None:
        version = int.from_bytes(data[:8], "little")
        if version not in allowed or data != _page(version, len(data) - 8):
            errors.append(f"{name}: foreign or torn bytes")

    def worker(number: int) -> None:
        rng = random.Random(number)
        model: dict[str, int] = {}  # this thread's own pages: name -> version
        own = [page_name(i, f"t{number}") for i in range(30)]
        for step in range(250):
            version = number * 1_000_000 + step
            op = rng.random()
            name = rng.choice(own)
            try:
                if op < 0.35:
                    store.put(name, _page(version, rng.randrange(100 * KiB)))
                    model[name] = version
                elif op < 0.45:
                    store.delete(name)
                    model.pop(name, None)
                elif op < 0.75:
                    try:
                        with store.open(name) as reader:
                            check(name, bytes(reader.read(0, reader.size)), {model.get(name)})
                    except PageNotFound:
                        if name in model:
                            errors.append(f"{name}: lost")
                elif op < 0.85:
                    name = rng.choice(shared)
                    with registry:
                        written[name].add(version)
                    store.put(name, _page(version, rng.randrange(100 * KiB)))
                elif op < 0.95:
                    name = rng.choice(shared)
                    try:
                        with store.open(name) as reader:
                            data = bytes(reader.read(0, reader.size))
                        with registry:
                            check(name, data, set(written[name]))
                    except PageNotFound:
                        pass
                else:
                    if store.exists_many(own) != [n in model for n in own]:
                        errors.append(f"thread {number}: exists_many disagrees")
            except Exception as e:  # noqa: BLE001 - report it from the main thread
                errors.append(f"{name}: {e!r}")
        for name in own:
            if (store.info(name) is not None) != (name in model):
                errors.append(f"{name}: presence differs from the model")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    memory = store.statistics().tier("memory")
    assert memory.used_bytes <= memory.capacity_bytes
    assert memory.demotions > 0 and memory.promotions > 0


def test_a_page_published_under_the_old_name_while_a_rename_runs_is_kept(make_store):
    """A rename of a page on the disk tier runs in a worker thread (``move``): it read the old
    page, published it under the new name, then deleted the old name, whatever it held by then.
    A page another writer published under the old name meanwhile (a plane commit, answered
    'published') was deleted with it, and neither version was left under that name."""
    store = make_store(memory=1 * MiB, disk=64 * MiB, max_page_size=64 * KiB)
    old, new = page_name(0), page_name(1)
    store.put(old, _page(1, 1000))
    for i in range(2, 40):  # push the old page down to the disk tier
        store.put(page_name(i), _page(i, 60 * KiB))
    assert store.info(old).tier == "disk"
    reserve, raced = store.reserve, []

    def reserve_then_race(size):
        draft = reserve(size)
        if not raced:  # another writer publishes the old name after the move read it
            raced.append(True)
            store.put(old, _page(2, 1000))
        return draft

    store.reserve = reserve_then_race
    work = store.rename(old, new)
    work.finish(work.work())
    store.reserve = reserve
    with store.open(new) as reader:
        assert bytes(reader.view()) == _page(1, 1000)
    assert store.info(old) is not None, "the page published under the old name meanwhile was deleted"
    with store.open(old) as reader:
        assert bytes(reader.view()) == _page(2, 1000)
