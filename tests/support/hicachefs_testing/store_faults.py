"""Randomised rounds against the store alone (no FUSE), fast enough to run by the thousand.

- ``device_fault_round``: a PageStore whose SSD arena sits on a ``FaultyDevice``, driven by
  random puts, reads (some held open), deletes and existence queries while faults are injected
  at random (EIO and ENOSPC on writes, reads and fsync, short writes, flipped bits on read,
  latency). Every answer is checked: a read gives the newest acknowledged version of its page
  or fails with the store's own error, never other bytes; the counts add up; when everything is
  deleted, no RAM slot or disk record is left; after a restart on a sound device, every page
  that comes back is a whole write of its name.
- ``corruption_round``: pages written through to the arena file, the store closed, then one
  kind of damage done to the file (bits flipped in payloads or in a record header, a torn last
  record, the file cut short), the store opened again: no damaged page is served, and every
  page the damage spares reads back.

Each returns figures for ``scripts/stress.py`` and the tests; nothing is raised for a failed
check, it is counted, with examples. Single-threaded; blocks on file I/O.
"""

from __future__ import annotations

import errno
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from hicachefs.store import DeviceError, PageCorrupt, PageNotFound, PageStore, StoreConfig, StoreError
from hicachefs.store.ssd.device import FileDevice
from hicachefs_testing.faults import Fault, FaultyDevice
from hicachefs_testing.store_tools import private_room_for
from hicachefs.store.ssd.region_log import HEADER
from hicachefs.store.ssd.ssd_tier import ARENA_NAME
from hicachefs_testing.workload import find_all, identify, labelled_content

KiB, MiB = 1 << 10, 1 << 20
SIZES = (4 * KiB, 16 * KiB, 64 * KiB, 150_000)
MAX_PAGE = 256 * KiB


@dataclass
class RoundFigures:
    operations: int = 0
    faults_injected: int = 0  # faults the FaultyDevice applied (device rounds)
    corruptions_injected: int = 0  # damages done to the arena file (corruption rounds)
    corruptions_caught: int = 0  # of those, never served: dropped at recovery or failing the read
    pages_checked: int = 0
    inconsistencies: int = 0  # wrong or stale bytes, counts that do not add up, leaks (must be 0)
    bystanders_lost: int = 0  # undamaged pages gone after a damage that spares them (must be 0)
    lost_by_design: int = 0  # pages after a cut or a bad header: dropped, never served
    resurrected: int = 0  # an older version back after a restart
    examples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(text)

    def add(self, other: RoundFigures) -> None:
        for name, value in vars(other).items():
            if name == "examples":
                for example in value:
                    self.note(example)
            else:
                setattr(self, name, getattr(self, name) + value)


def _config(disk: Path, write_through: bool, memory: int = 2 * MiB, disk_bytes: int = 24 * MiB) -> StoreConfig:
    return StoreConfig(memory_bytes=memory, disk_dir=disk, disk_bytes=disk_bytes,
                       write_through=write_through, max_page_size=MAX_PAGE)


# ---- device faults ------------------------------------------------------------------


def _random_fault(rng: random.Random) -> Fault:
    op = rng.choice(["pwritev", "pwritev", "pwrite", "preadv", "preadv", "pread", "fsync"])
    count = rng.randint(1, 3)
    kind = rng.random()
    if op == "pwritev" and kind < 0.25:
        return Fault(op, short=True, count=count)
    if op == "preadv" and kind < 0.3:
        return Fault(op, flip=True, count=count)
    if kind > 0.9:
        return Fault(op, delay_s=0.002, count=count)
    return Fault(op, errno=rng.choice([errno.EIO, errno.EIO, errno.ENOSPC]), count=count,
                 probability=rng.choice([1.0, 0.5]))


class _Checker:
    """The newest acknowledged version of every name, and the checks of what the store says."""

    def __init__(self, store: PageStore, figures: RoundFigures) -> None:
        self.store = store
        self.figures = figures
        self.acked: dict[str, int | None] = {}  # name -> generation whose put returned; None: gone
        self.attempted: dict[str, int] = {}  # name -> newest generation ever written

    def wrong(self, text: str) -> None:
        self.figures.inconsistencies += 1
        self.figures.note(text)

    def read(self, name: str) -> None:
        try:
            with self.store.open(name) as reader:
                data = bytes(reader.read(0, reader.size))
        except PageNotFound:
            if name in self.acked:  # evicted, reclaimed or dropped as corrupt: a cache may lose it
                self.acked[name] = None
            return
        except (PageCorrupt, DeviceError):
            return  # the device failed or lied: refused, counted by the tier
        self.figures.pages_checked += 1
        who = identify(data, name.rsplit("/", 1)[1])
        if who is None:
            self.wrong(f"{name}: {len(data)} bytes that are no write of it")
        elif name not in self.acked:
            self.wrong(f"{name}: generation {who.gen} served, none was ever acknowledged")
        elif self.acked[name] is None:
            self.wrong(f"{name}: generation {who.gen} served after the page was deleted or gone")
        elif who.gen != self.acked[name]:
            self.wrong(f"{name}: generation {who.gen} served, {self.acked[name]} acknowledged")

    def counts_add_up(self, universe: list[str]) -> None:
        stats = self.store.statistics()
        present = sum(self.store.info(name) is not None for name in universe)
        if stats.pages != present:
            self.wrong(f"statistics count {stats.pages} pages, {present} can be looked up")
        for facts in stats.tiers:
            if not 0 <= facts.used_bytes <= facts.capacity_bytes:
                self.wrong(f"{facts.name}: {facts.used_bytes} bytes used of {facts.capacity_bytes}")


def device_fault_round(workdir: Path, seed: int, operations: int = 1500) -> RoundFigures:
    """One store on a FaultyDevice through ``operations`` random operations; see the module."""
    rng = random.Random(seed)
    figures = RoundFigures()
    disk = Path(workdir) / f"faults-{seed}"
    shutil.rmtree(disk, ignore_errors=True)
    disk.mkdir(parents=True)
    device = FaultyDevice(FileDevice(disk / ARENA_NAME), seed=seed)
    config = _config(disk, write_through=rng.random() < 0.5)
    store = PageStore(config, disk_device=device)
    check = _Checker(store, figures)
    universe = [f"m/f/tp0of1/kv/{i:064x}" for i in range(120)]
    held = []
    try:
        for step in range(operations):
            figures.operations += 1
            if rng.random() < 0.08:
                device.inject(_random_fault(rng))
            if rng.random() < 0.02:
                device.clear()
            action = rng.random()
            name = rng.choice(universe)
            try:
                if action < 0.35:
                    generation = check.attempted.get(name, -1) + 1
                    check.attempted[name] = generation
                    data = labelled_content(name.rsplit("/", 1)[1], rng.choice(SIZES), gen=generation)
                    try:
                        store.put(name, data)
                        check.acked[name] = generation
                    except StoreError:
                        pass  # refused: the old page, if any, must still be served (checked on read)
                elif action < 0.75:
                    check.read(rng.choice(list(check.acked) or universe))
                elif action < 0.82:
                    try:
                        store.delete(name)
                    except StoreError:
                        continue  # refused: the page stays as it was (checked on read)
                    if name in check.acked:
                        check.acked[name] = None
                elif action < 0.87:
                    while held and not private_room_for(store, 2 * store.config.max_page_size):
                        held.pop(0).close()  # past the share, the open would wait for one
                    try:
                        held.append(store.open(rng.choice(list(check.acked) or universe)))
                    except StoreError:
                        pass
                elif action < 0.92 and held:
                    held.pop(rng.randrange(len(held))).close()
                else:
                    asked = rng.sample(universe, 10)
                    answers = store.exists_many(asked)
                    if answers != [store.info(n) is not None for n in asked]:
                        check.wrong("exists_many disagrees with info")
            except Exception as exc:  # anything but the store's own errors is a bug
                check.wrong(f"step {step}: {type(exc).__name__}: {exc}")
            if step % 100 == 99:
                check.counts_add_up(universe)
        device.clear()
        for reader in held:
            reader.close()
        held.clear()
        for name in universe:
            check.read(name)
        check.counts_add_up(universe)
    finally:
        for reader in held:
            reader.close()
        figures.faults_injected += sum(device.injected.values())
        store.close()
    _check_restart(config, check, figures, universe)
    shutil.rmtree(disk, ignore_errors=True)
    return figures


def _check_restart(config: StoreConfig, check: _Checker, figures: RoundFigures, universe: list[str]) -> None:
    """Reopen on a sound device: what comes back is whole; deleting everything leaks nothing."""
    store = PageStore(config)
    try:
        for name in universe:
            if store.info(name) is None:
                continue
            try:
                with store.open(name) as reader:
                    data = bytes(reader.read(0, reader.size))
            except StoreError as exc:
                check.wrong(f"{name}: unreadable after a restart on a sound device: {exc}")
                continue
            figures.pages_checked += 1
            who = identify(data, name.rsplit("/", 1)[1])
            if who is None or who.gen > check.attempted.get(name, -1):
                check.wrong(f"{name}: after a restart, {len(data)} bytes that are no write of it")
            elif check.acked.get(name) != who.gen:
                figures.resurrected += 1
        for name in universe:
            store.delete(name)
        for facts in store.statistics().tiers:
            if facts.used_bytes or facts.pages:
                check.wrong(f"{facts.name}: {facts.pages} pages, {facts.used_bytes} bytes left after deleting all")
    finally:
        store.close()


# ---- corruption ---------------------------------------------------------------------

CORRUPTIONS = ("flip", "header", "torn", "truncate")


def _payload_offset(arena: Path, data: bytes) -> int:
    """Where ``data`` (random bytes, unique) starts in the arena file, or -1."""
    probe = len(data) // 2
    hits = find_all(arena, data[probe : probe + 64])
    return hits[0] - probe if len(hits) == 1 else -1


def corruption_round(workdir: Path, seed: int, kind: str, victims: int = 6) -> RoundFigures:
    """Damage the arena file of a closed store one way (``kind`` in CORRUPTIONS) and reopen."""
    rng = random.Random(seed)
    figures = RoundFigures()
    disk = Path(workdir) / f"corrupt-{seed}"
    shutil.rmtree(disk, ignore_errors=True)
    config = _config(disk, write_through=True, memory=8 * MiB)
    pages = {f"m/f/tp0of1/kv/{i:064x}": labelled_content(f"{i:064x}", rng.choice(SIZES), gen=seed) for i in range(24)}
    store = PageStore(config)
    try:
        for name, data in pages.items():
            store.put(name, data)
    finally:
        store.close()
    arena = disk / ARENA_NAME
    names = list(pages)
    damaged: set[str] = set()
    spared: set[str] = set(names)  # pages the damage must not touch
    if kind == "flip":  # bits flipped in the payloads of pages anywhere in the file
        for name in rng.sample(names, victims):
            at = _payload_offset(arena, pages[name])
            if at < 0:
                figures.note(f"{name}: not found once in the arena")
                continue
            with open(arena, "r+b") as f:
                for spot in rng.sample(range(at, at + len(pages[name])), rng.choice([1, 1, 3])):
                    f.seek(spot)
                    byte = f.read(1)[0]
                    f.seek(spot)
                    f.write(bytes([byte ^ (1 << rng.randrange(8))]))
            damaged.add(name)
    elif kind == "header":  # a bit flipped in a record's header or name: the walk of its region
        index = rng.randrange(len(names))  # stops there, so later records of the region go too
        name = names[index]
        at = _payload_offset(arena, pages[name])
        if at >= 0:
            start = at - len(name.encode()) - HEADER.size
            used = [*range(start, start + HEADER.size - 4), *range(start + HEADER.size, at)]  # not the padding
            with open(arena, "r+b") as f:
                spot = rng.choice(used)
                f.seek(spot)
                byte = f.read(1)[0]
                f.seek(spot)
                f.write(bytes([byte ^ (1 << rng.randrange(8))]))
            damaged.add(name)
            spared = set(names[:index])
    elif kind == "torn":  # the last record written stopped partway: the rest of it is zeros
        name = names[-1]
        at = _payload_offset(arena, pages[name])
        if at >= 0:
            cut = rng.randrange(len(pages[name]) - 1)
            with open(arena, "r+b") as f:
                f.seek(at + cut)
                f.write(bytes(len(pages[name]) - cut))
            damaged.add(name)
    else:  # the file cut short in the middle of a page: an arena of another size is not trusted
        name = rng.choice(names)
        at = _payload_offset(arena, pages[name])
        if at >= 0:
            os.truncate(arena, at + rng.randrange(len(pages[name])))
            damaged.add(name)
            spared.clear()
    spared -= damaged
    figures.corruptions_injected += len(damaged)
    store = PageStore(config)
    try:
        for name, data in pages.items():
            figures.pages_checked += 1
            try:
                with store.open(name) as reader:
                    got = bytes(reader.read(0, reader.size))
            except (PageNotFound, PageCorrupt):
                got = None
            except StoreError as exc:
                figures.inconsistencies += 1
                figures.note(f"{kind}: {name}: {type(exc).__name__}: {exc}")
                continue
            if got is not None and got != data:
                figures.inconsistencies += 1
                figures.note(f"{kind}: {name}: wrong bytes served after recovery")
            elif name in damaged:
                figures.corruptions_caught += got is None
            elif got is None and name in spared:
                figures.bystanders_lost += 1
                figures.note(f"{kind}: {name}: undamaged, lost")
            elif got is None:
                figures.lost_by_design += 1
        if kind in ("flip", "torn") and store.statistics().tier("disk").checksum_failures < len(damaged):
            figures.inconsistencies += 1
            figures.note(f"{kind}: {len(damaged)} damaged pages, fewer checksum failures counted")
    finally:
        store.close()
    shutil.rmtree(disk, ignore_errors=True)
    return figures

