"""One RAM budget: the shares of ``--memory`` that what holds RAM may take, given out by one owner
so that together they are at most the tier (docs/contract.md, "Bounds").

Why: before, six shares were set each by its own module (files being written 1/2, plain users'
pins 1/4, the kernel's pushes 1/4, the shared tier's write-behind 1/4, the workers' windows 1/8
and 1/8) and added up to 1.5 tiers, while readers running as root held pins without a bound.

The shares (``SHARES``), each a fraction of ``--memory``:
- ``writing``: files being written, the data plane's reservations and mailboxes, 1/2: SGLang's
  ranks have a batch of pages in flight at once, and the other half stays for pages read;
- ``reserved_ahead``: of those, the slots writers hold for their next batch, 1/16;
- ``pins``: pages pinned by every reader (open pages, fetch handles), 3/16, of which
  ``pins_of_others`` (users other than root and the daemon's) 1/8;
- ``kernel_pushes``: new pages queued for the kernel's page cache (pinned until pushed), 1/16;
- ``write_behind``: pages queued to be copied to the shared tier, 1/8 (at most 1 GiB).
Those that are not inside another add up to 14/16 of the tier. Beside the tier, not in it:
- ``private_reads``: pages read from a lower tier into a reader's own memory (a first read from
  the disk tier, or no RAM slot to spare), 1/8, at least two of the largest pages
  (``private_reads.PrivateReads``), of which ``private_reads_of_others`` (users other than root
  and the daemon's) 1/16, at least one of the largest pages.

Each holder takes and gives back through its ``Share``, and refuses (ENOSPC, ENOBUFS) or lets
go (pins) past it, as its module says; ``statistics`` shows every share's limit and what it
holds, in ``.hicachefs/stats`` and ``hicachefs top``.

Not thread-safe: each share is its holder's, and guarded by the holder's lock.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hicachefs.typed_stats import level

#: A share of the daemon's memory beside the RAM tier, not in it.
BESIDE = "beside the tier"
#: Each share's fraction of ``--memory``, and the share it is part of (None: of the tier).
SHARES = {
    "writing": (1 / 2, None),
    "reserved_ahead": (1 / 16, "writing"),
    "pins": (3 / 16, None),
    "pins_of_others": (1 / 8, "pins"),
    "kernel_pushes": (1 / 16, None),
    "write_behind": (1 / 8, None),
    "private_reads": (1 / 8, BESIDE),
    "private_reads_of_others": (1 / 16, "private_reads"),
}
#: The write-behind queue's most, whatever the tier: seconds of the shared filesystem's writes.
MAX_WRITE_BEHIND = 1 << 30


class Share:
    """What one kind of holder may take of the RAM tier (``limit`` bytes), and holds now."""

    __slots__ = ("name", "limit", "held")

    def __init__(self, name: str, limit: int) -> None:
        self.name, self.limit, self.held = name, limit, 0

    def take(self, size: int) -> bool:
        """Take ``size`` bytes if the share has room; whether it did."""
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def add(self, size: int) -> None:
        """Count ``size`` bytes held, room or not (a holder that lets go past the limit)."""
        self.held += size

    def give_back(self, size: int) -> None:
        self.held -= size

    @property
    def over(self) -> bool:
        return self.held > self.limit


@dataclass(frozen=True)
class ShareStatistics:
    limit_bytes: int = level()
    held_bytes: int = level()


@dataclass(frozen=True)
class BudgetStatistics:
    """Each share of the RAM tier: its limit and what it holds (``SHARES`` says what each is)."""

    shares: dict[str, ShareStatistics] = field(default_factory=dict)


class RamBudget:
    """The shares of one RAM tier (``memory_bytes``); ``share(name)`` is the holder's."""

    def __init__(self, memory_bytes: int, max_page_size: int) -> None:
        limits = {name: int(memory_bytes * fraction) for name, (fraction, _) in SHARES.items()}
        # At most 1 GiB (seconds of a shared filesystem's writes), unless a RAM page is larger
        # (RAM pages are at most a slab, an eighth of the tier: one always fits the share).
        limits["write_behind"] = min(limits["write_behind"], max(MAX_WRITE_BEHIND, max_page_size))
        # Room for a reader holding a page and another reading one, whatever the tier.
        limits["private_reads"] = max(limits["private_reads"], 2 * max_page_size)
        limits["private_reads_of_others"] = max(limits["private_reads_of_others"], max_page_size)
        self._shares = {name: Share(name, limit) for name, limit in limits.items()}
        assert sum(f for f, within in SHARES.values() if within is None) <= 1

    def share(self, name: str) -> Share:
        return self._shares[name]

    def statistics(self) -> BudgetStatistics:
        return BudgetStatistics({name: ShareStatistics(s.limit, s.held) for name, s in self._shares.items()})
