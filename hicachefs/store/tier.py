"""The one interface every tier of the store implements (RAM, SSD, shared).

The store is given a chain of tiers (``chain.py`` builds it from the configuration) and moves
pages between them through these methods alone; a tier owns its bytes, its space accounting,
its counters and its recovery, so a new kind of tier is one new module and a line where the
chain is built.

The top of every chain is a ``TopTier`` (RAM): pages are read in place there and written into
slots the engine hands out, so it adds slots, pins and an eviction order to the interface;
what a slot is (the arena's slabs) stays inside ``store/ram``.

Two kinds of tier:
- an *indexed* tier (RAM, SSD) holds pages at locations it chooses (a RAM slot, an SSD record
  offset); the engine's index keeps, per page, its location in each indexed tier;
- a tier that is not indexed finds pages by name itself, because others put pages there too (the
  shared tier, which other hosts write): the engine asks it ``contains_many`` (from memory) and
  ``find`` (blocking), offers it every page published here (``offer``), and ignores locations.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple, Protocol

from hicachefs.store.pages import PageMeta
from hicachefs.store.statistics import TierCounters, TierStatistics

#: Longer than any valid page name (five components of 200 bytes and their slashes): what a tier
#: is asked to hold where the name is not known yet (``fits``), and what its records must take.
LONGEST_NAME_BYTES = 4096

if TYPE_CHECKING:
    from hicachefs.store.index import PageColumns


class ReadResult(enum.Enum):
    OK = "ok"
    MISMATCH = "mismatch"  # not the expected page there (reclaimed, replaced, removed): a miss; where
    # the index still holds it there, a damaged header (the store counts it, as a corrupt page)
    CORRUPT = "corrupt"  # the expected page, but its bytes fail the checksum (the tier counted it)


class RecoveryProgress(NamedTuple):
    """How far rebuilding a tier's index has come: by ``method`` 'snapshot' or 'scan' (then
    ``reason`` says why no snapshot served); ``pages`` found so far; for a scan, bytes scanned of
    ``total_bytes``; ``seconds`` since it began. The last report has ``finished``. Method 'fill':
    the RAM tier's memory faulted in at start, ``scanned_bytes`` of ``total_bytes`` so far."""

    method: str
    reason: str
    pages: int
    scanned_bytes: int
    total_bytes: int
    seconds: float
    finished: bool


RecoveryListener = Callable[[RecoveryProgress], None]


class RecoverySink(Protocol):
    """Where a tier puts the pages it finds at start (the engine's index, for this tier)."""

    def load(self, pages: PageColumns) -> None:
        """All of the tier's pages at once (from a snapshot), into an index still empty."""

    def found(self, page: PageMeta, location: int) -> tuple[PageMeta, int] | None:
        """One page found by a scan. A name found before is kept in its newer copy: the older
        one and its location are returned, for the tier to drop; else None."""


class TierEvents(Protocol):
    """What a tier tells the engine it is bound to."""

    def reclaiming(self, start: int, end: int) -> int:
        """The tier is about to overwrite locations [start, end): the engine forgets what it
        held there; the answer is how many of those pages left the store (no copy elsewhere)."""

    def changed(self, name: str) -> None:
        """Another host wrote or removed the page ``name`` on this (named) tier: what the engine
        keeps of its facts may describe another version."""


class Tier(ABC):
    """One level of the page store. See the module docstring.

    ``name`` is what stats and ``user.hicachefs.tier`` show. ``write`` and ``read_into`` may
    block on I/O and raise ``OSError`` when the device fails; the tier counts that, and the
    store leaves its own state as it was.
    """

    name: str
    counters: TierCounters
    indexed: bool = True

    @property
    @abstractmethod
    def capacity_bytes(self) -> int: ...

    @property
    @abstractmethod
    def used_bytes(self) -> int: ...

    @property
    def free_bytes(self) -> int:
        """What can still be written here before a page is dropped to make room; a tier whose
        room goes in slots or regions says what they leave (less than ``capacity - used``)."""
        return max(0, self.capacity_bytes - self.used_bytes)

    def allocated(self, name_length: int, size: int) -> int:
        """Bytes a page of ``size`` (its UTF-8 name ``name_length`` bytes) takes here (``st_blocks``)."""
        return size

    @abstractmethod
    def fits(self, name: bytes, size: int) -> bool:
        """Whether a page of this name and size can ever be placed here."""

    @abstractmethod
    def write(self, page: PageMeta, payload) -> int:
        """Store a copy of ``payload`` (``page.size`` bytes); return its location."""

    @abstractmethod
    def read_into(self, page: PageMeta, location: int, out: memoryview, counted: bool = True) -> ReadResult:
        """Copy the page into ``out`` (exactly ``page.size`` bytes) and check it is that page.
        ``counted=False``: the store's own copy (a promotion of a page whose reader was counted
        already), no hit and no bytes out."""

    @abstractmethod
    def drop(self, page: PageMeta, location: int) -> None:
        """Forget the page at ``location``; no later recovery brings it back. Raises ``OSError``
        when the tier cannot make sure of that (its device fails): the page is there as before."""

    def supersede(self, page: PageMeta, location: int) -> None:
        """Let go of the page at ``location``: a newer copy of its name, written to this tier
        since, replaces it (a recovery keeps the newer). Dropped if the device lets it, else only
        forgotten; never raised (the store warned). A tier that can bring a copy left so back
        marks it dead before it drops its name's newer copy (``drop``)."""
        try:
            self.drop(page, location)
        except OSError:
            pass

    # -- the data plane (tiers whose bytes its clients read themselves) ----------------------

    def shared_fd(self) -> int | None:
        """The descriptor of the file the data plane's clients read this tier's pages from (they
        open it through the mount), or None: the plane does not read this tier."""
        return None

    def byte_offset(self, location, name_length):
        """Where the bytes of the page at ``location`` (whose name has ``name_length`` UTF-8
        bytes) begin in ``shared_fd``'s file; works on numpy arrays of both too."""
        raise NotImplementedError(f"the data plane does not read the {self.name} tier")

    def holds(self, records: Iterable[tuple[int, int]]) -> bool:
        """Whether pages of these (UTF-8 name length, size), written here one after another in
        this order, all fit before the first of them may be dropped to make room (a ring packs
        them into regions, and reclaims its oldest region before it is full); then so do any of
        them written in the same order."""
        return sum(size for _, size in records) <= self.capacity_bytes

    def reclaim_turn(self, location: int) -> int:
        """How soon writing here drops the page at ``location`` to make room, in the order pages
        go (a ring's regions, ahead of the one written now): a lower turn goes first; 0 for a
        page dropped only after what is written now."""
        return 0

    def fence(self, on: bool) -> None:
        """From now on (``on``) until ``fence(False)``, writing here never drops, to make room,
        what it wrote since, nor what the tier held newest before (a ring stops short of the
        region written when the fence was set): a write that would fails (ENOSPC), and ``holds``
        and ``reclaim_turn`` count room up to there. For a clean close's write-down."""

    def passed_over(self) -> int:
        """How many times writing here has passed over room it could not use (a ring's region
        whose first block cannot be written): each time there is less room than ``holds``
        counted before."""
        return 0

    # -- pages found by name (a tier that is not indexed) ---------------------------------

    def contains_many(self, names: list[str]) -> list[bool]:
        """Whether the tier holds each page, from memory: never blocks."""
        return [False] * len(names)

    def has_directory(self, path: str) -> bool:
        """Whether the tier holds pages under directory ``path``, from memory."""
        return False

    def find(self, name: str, reading: bool = False) -> PageMeta | None:
        """The facts of the page ``name`` (blocking); ``reading``: a ``read_into`` follows."""
        return None

    def remove_later(self, name: str) -> bool:
        """The page ``name`` is removed while the tier cannot see its pages (unavailable): True
        when the tier takes it to remove once it can (and answers it absent meanwhile); False
        when it can see them now, so the caller removes it as usual. Never blocks."""
        return False

    def remove(self, name: str) -> bool:
        """Remove the page ``name`` from this named tier (blocking, idempotent); whether there
        was one."""
        page = self.find(name)
        if page is None:
            return False
        self.drop(page, 0)
        return True

    def offer(self, page: PageMeta, payload: memoryview, release: Callable[[], None]) -> bool:
        """A page was just published: keep a copy if this tier takes every page (never blocks).
        ``release`` is called once the payload is no longer needed (at once when refused)."""
        release()
        return False

    # -- life ------------------------------------------------------------------------------

    def bind(self, events: TierEvents) -> None:
        """The engine that holds this tier's index, told of what the tier does on its own."""

    def recover(self, sink: RecoverySink, progress: RecoveryListener | None = None) -> None:
        """Put the pages the tier holds from an earlier run into ``sink`` (nothing to recover
        for a tier that does not outlive the process)."""

    def persist(self, pages: PageColumns) -> None:
        """The engine's index of this tier's pages at a clean close, kept for ``recover``."""

    def count_miss(self, count: int = 1) -> None:
        """``count`` lookups found their name on no tier."""
        self.counters.misses += count

    def count_hit(self, size: int) -> None:
        """A page of this tier (``size`` bytes) was read without its help (the data plane's
        clients read it): a hit, and its bytes read out of the tier."""
        self.counters.hits += 1
        self.counters.bytes_out += size

    def statistics(self) -> TierStatistics:
        return TierStatistics(name=self.name, capacity_bytes=self.capacity_bytes, used_bytes=self.used_bytes,
                              free_bytes=self.free_bytes, **self.counters.snapshot())

    def sync(self) -> None:
        """Make what was written durable, as far as the tier promises."""

    def close(self) -> None:
        """Make what the tier holds durable, as far as it promises, and release it."""


class TopTier(Tier):
    """The tier at the top of every chain, whose pages are read in place: the engine takes
    slots from it for pages being written or promoted, pins them while they are read, and asks
    it which pages should leave first. A location is a slot, and a slot's offset is its first
    byte in ``shared_fd``'s file. ``write``/``read_into``/``drop`` keep the Tier contract for
    pages the engine has not admitted (the contract tests); the engine uses the slots."""

    @abstractmethod
    def fill(self, progress: RecoveryListener | None = None) -> None:
        """Fault the tier's memory in before the store serves, telling ``progress`` how far it
        has come (method 'fill'); StoreError when the host cannot give it."""

    @abstractmethod
    def allocate(self, size: int) -> int | None:
        """A free slot for ``size`` bytes, or None until the engine evicts something."""

    @abstractmethod
    def view(self, slot: int, size: int) -> memoryview:
        """The slot's first ``size`` bytes, to write or read in place."""

    @abstractmethod
    def merged(self, pieces: list) -> list:
        """A read's ``(slot, start, length)`` pieces, those that lie end to end made one."""

    @abstractmethod
    def admit(self, row: int, slot: int, size: int, promoted: bool = False) -> None:
        """A page (index ``row``) now lives in ``slot``: published into it, or promoted up."""

    @abstractmethod
    def hit(self, row: int, size: int) -> None:
        """The page was read from here (also by a data-plane client, from its report): it is the most recently used."""

    @abstractmethod
    def release(self, row: int, slot: int, demoted: bool) -> None:
        """The page leaves: moved down (``demoted``), or out of the store (evicted)."""

    @abstractmethod
    def forget(self, row: int, slot: int) -> None:
        """The page was removed or replaced at a caller's request."""

    @abstractmethod
    def victims(self) -> Iterator[int]:
        """The rows of its pages, the next to leave first (stop before changing the tier)."""

    @abstractmethod
    def oldest_first(self) -> list[int]:
        """The rows of its pages, least recently used first."""

    @abstractmethod
    def pin(self, slot: int) -> None:
        """A reader holds the slot: it is not freed until the last ``unpin``."""

    @abstractmethod
    def unpin(self, slot: int) -> None: ...

    @abstractmethod
    def is_pinned(self, slot: int) -> bool: ...

    @abstractmethod
    def retire(self, slot: int) -> None:
        """The slot's page (or draft) is gone: free it now, or at its last reader's ``unpin``."""
