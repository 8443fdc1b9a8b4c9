"""Pages and waits for the shared tier's tests."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

import xxhash

from hicachefs.store.pages import PageMeta
from hicachefs.store.shared.device import DirectoryDevice
from hicachefs_testing.workload import content
from pages import wait_until

KiB, MiB = 1 << 10, 1 << 20
#: Short periods and deadlines, so that faults and recoveries play out in a fraction of a second.
FAST = dict(deadline_s=0.25, tick_s=0.02, poll_s=0.02, retry_s=0.1, sweep_interval_s=0.3, sweep_budget_s=0.05)
POOL = "m/bf16-page_first-64/tp0of1/kv"


def page_name(i: int, pool: str = POOL) -> str:
    return f"{pool}/{hashlib.sha256(str(i).encode()).hexdigest()}"


def make_page(i: int, size: int = 64 * KiB, pool: str = POOL) -> tuple[PageMeta, bytes]:
    data = content(i, size)
    return PageMeta(page_name(i, pool), size, xxhash.xxh3_64_intdigest(data), time.time_ns()), data


def wait_for_sweeps(tiers: list, cycles: int = 2, timeout: float = 10.0) -> None:
    """Wait until each tier has finished ``cycles`` more sweeps of the whole shared directory,
    with an eviction round at every tick between: whatever its bound would still remove is gone."""
    start = [tier.statistics().sweep.sweep_cycles for tier in tiers]
    wait_until(lambda: all(tier.statistics().sweep.sweep_cycles >= first + cycles for tier, first in zip(tiers, start)),
               timeout)


class Releases:
    """Counts ``release`` calls per offered page, to check each is called exactly once."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}

    def __call__(self, name: str) -> Callable[[], None]:
        def release() -> None:
            self.calls[name] = self.calls.get(name, 0) + 1

        return release


def read_page(tier, name: str) -> bytes | None:
    """find + read_into, as the engine does; None for any miss."""
    from hicachefs.store.tier import ReadResult

    page = tier.find(name)
    if page is None:
        return None
    out = bytearray(page.size)
    return bytes(out) if tier.read_into(page, 0, memoryview(out)) is ReadResult.OK else None


def read_stored(store, name: str) -> bytes:
    """The whole page ``name`` as the page store's ``open`` gives it (PageNotFound on a miss)."""
    with store.open(name) as reader:
        return bytes(reader.read(0, reader.size + 1))


class SlowJournal(DirectoryDevice):
    """Its journal's appends (the only ``write``) take 0.1 s: its announcements reach the volume
    well after the page file they announce."""

    def write(self, data, fd):
        time.sleep(0.1)
        return super().write(data, fd)
