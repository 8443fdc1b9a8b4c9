"""The one interface every tier of the store implements (RAM, SSD, shared).

A tier owns its bytes, its space accounting, its counters and its recovery. The store decides
which pages live where and moves them between tiers through these methods alone, so a new kind
of tier is one new module. A page is addressed in a tier by the ``location`` the tier chose
when it was written (a RAM slot, an SSD record offset; a tier that finds pages by name, such as
the shared tier, ignores it).
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from typing import NamedTuple

from hicachefs.store.stats import TierCounters


class PageMeta(NamedTuple):
    """What identifies one version of a page: its name, size, xxh3_64 checksum, publish time."""

    name: str
    size: int
    checksum: int
    mtime_ns: int


class ReadResult(enum.Enum):
    OK = "ok"
    MISMATCH = "mismatch"  # not the expected page there (reclaimed, replaced, removed): a miss
    CORRUPT = "corrupt"  # the expected page, but its bytes fail the checksum


class Tier(ABC):
    """One level of the page store. See the module docstring.

    ``name`` is what stats and ``user.hicachefs.tier`` show. ``write`` and ``read_into`` may
    block on I/O and raise ``OSError`` when the device fails; the store counts that and leaves
    its own state as it was.
    """

    name: str
    counters: TierCounters

    @property
    @abstractmethod
    def capacity_bytes(self) -> int: ...

    @property
    @abstractmethod
    def used_bytes(self) -> int: ...

    @abstractmethod
    def fits(self, name: bytes, size: int) -> bool:
        """Whether a page of this name and size can ever be placed here."""

    @abstractmethod
    def write(self, page: PageMeta, payload) -> int:
        """Store a copy of ``payload`` (``page.size`` bytes); return its location."""

    @abstractmethod
    def read_into(self, page: PageMeta, location: int, out: memoryview) -> ReadResult:
        """Copy the page into ``out`` (exactly ``page.size`` bytes) and check it is that page."""

    @abstractmethod
    def drop(self, page: PageMeta, location: int) -> None:
        """Forget the page at ``location``; no later recovery brings it back."""

    def retention_bytes(self) -> int:
        """How many bytes can be written here before the first of them may be dropped to make
        room (a ring reclaims its oldest region before it is full)."""
        return self.capacity_bytes

    def statistics(self) -> dict:
        return {"capacity_bytes": self.capacity_bytes, "used_bytes": self.used_bytes,
                **self.counters.as_dict()}

    def sync(self) -> None:
        """Make what was written durable, as far as the tier promises."""

    def close(self) -> None:
        """Make what the tier holds durable, as far as it promises, and release it."""
