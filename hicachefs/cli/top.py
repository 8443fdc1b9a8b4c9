"""``hicachefs top``: a live view of one mount, from successive reads of ``.hicachefs/stats``.

Every view shows the levels of the newer read (pages, bytes, capacity per tier) and the rates
between the two reads: bytes in and out per tier, hits, evictions, demotions and promotions
per second, FUSE requests per second by operation, errors; across a restart of the daemon
(``daemon`` in the stats changed), what the new one counted. The first view comes one interval
after the start, so even ``--count 1`` shows real rates.

On a terminal the view is redrawn in place (rich's ``Live``, on the alternate screen) until
Ctrl-C. With ``--count N``, or when the output is not a terminal, views are printed one after
another as plain text, each starting with a ``hicachefs top`` line. Runs in the caller's
thread; blocks in sleeps and in reads of the stats file, each of which has a deadline
(``deadline.NoAnswer`` when the daemon does not answer). ``command`` checks ``--count`` and
``--interval`` first.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import time
from dataclasses import dataclass
from pathlib import Path

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from .arguments import UsageError
from .stats import read_stats

#: Per-tier counters shown as rates.
_TIER_RATES = ("bytes_in", "bytes_out", "hits", "evictions", "demotions", "promotions")
#: Per-tier error counters, named in the errors table.
_TIER_ERRORS = {"io_errors": "I/O errors", "checksum_failures": "checksum failures"}
_TIER_ORDER = {"memory": 0, "disk": 1, "shared": 2}  # top down; the stats file sorts them by name
_PLAIN_WIDTH = 100


class _Console(Console):
    """Raises BrokenPipeError when its reader goes away (``top | head``), for the command line to
    report in one line like every other command; rich's own answer is a silent exit."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "the output was closed")


@dataclass(frozen=True)
class Sample:
    facts: dict
    taken: float  # time.monotonic()


def read_sample(mountpoint: Path) -> Sample:
    return Sample(read_stats(mountpoint), time.monotonic())


def _counted_since(before: dict, after: dict) -> dict:
    """The counters ``after``'s grew from: ``before``'s, or none where another daemon answered
    ``after`` (the daemon restarted in between): all of its counters started from zero. A guess
    counter by counter (one that shrank restarted) took 30 hits after a restart for 20 where
    the old daemon had made 10."""
    return before if before.get("daemon") == after.get("daemon") else {}


def _delta(before: dict, after: dict, key: str) -> int:
    """How much a counter grew (``before`` is ``_counted_since``'s). One that shrank counts from
    zero: a daemon too old to say who it is (no ``daemon``) restarted in between (taken for the
    same daemon, it gave negative rates; found by review)."""
    grown = after.get(key, 0) - before.get(key, 0)
    return after.get(key, 0) if grown < 0 else grown


def _ratio(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"


def _number(value: float) -> str:
    """Three significant digits, no exponent: 0, 0.50, 16.0, 123, 12345."""
    if value == 0:
        return "0"
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _bytes(value: float) -> str:
    if value < 1000:
        return f"{value:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1000 or unit == "TiB":
            break
    return f"{_number(value)} {unit}"


def _table(*columns: str) -> Table:
    """A borderless table; the first column names the rows, the others are numbers."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column(columns[0])
    for title in columns[1:]:
        table.add_column(title, justify="right")
    return table


def render(mountpoint: Path, before: Sample, after: Sample) -> Group:
    """One view, at most 80 columns wide: a summary, the tiers' levels and traffic, the
    requests and the errors."""
    seconds = max(after.taken - before.taken, 1e-9)
    new = after.facts
    old = _counted_since(before.facts, new)
    old_tiers, new_tiers = old.get("tiers", {}), new.get("tiers", {})
    hits = sum(_delta(old_tiers.get(t, {}), counters, "hits") for t, counters in new_tiers.items())
    misses = _delta(old, new, "misses")
    summary = Text.assemble(
        ("hicachefs top ", "bold"), f"{mountpoint}   over {seconds:.2f} s\n",
        f"hit rate {_ratio(hits, hits + misses)}   pages {new.get('pages', 0)}   ",
        f"free {_bytes(new.get('free_bytes', 0))}   files being written {new.get('pending_files', 0)}",
    )
    levels = _table("tier", "pages", "used", "capacity", "hits/s", "hit rate")
    traffic = _table("per second", "in", "out", "evictions", "demotions", "promotions")
    for name, counters in sorted(new_tiers.items(), key=lambda tier: _TIER_ORDER.get(tier[0], len(_TIER_ORDER))):
        previous = old_tiers.get(name, {})
        grown = {key: _delta(previous, counters, key) for key in _TIER_RATES}
        tier_misses = _delta(previous, counters, "misses")
        levels.add_row(name, str(counters.get("pages", 0)), _bytes(counters.get("used_bytes", 0)),
                       _bytes(counters.get("capacity_bytes", 0)), _number(grown["hits"] / seconds),
                       _ratio(grown["hits"], grown["hits"] + tier_misses))
        traffic.add_row(name, _bytes(grown["bytes_in"] / seconds), _bytes(grown["bytes_out"] / seconds),
                        *(_number(grown[key] / seconds) for key in ("evictions", "demotions", "promotions")))

    requests = _table("FUSE request", "per s", "total")
    old_requests, new_requests = old.get("requests", {}), new.get("requests", {})
    by_rate = sorted(new_requests, key=lambda op: (-_delta(old_requests, new_requests, op), op))
    for op in by_rate:
        requests.add_row(op, _number(_delta(old_requests, new_requests, op) / seconds), str(new_requests[op]))

    return Group(summary, levels, traffic, requests, _shares(new), _errors(old, new, seconds))


def _shares(facts: dict) -> Table:
    """The RAM budget: what each share of the RAM tier holds, of what it may."""
    table = _table("RAM share", "held", "of")
    for name, share in facts.get("ram_budget", {}).get("shares", {}).items():
        table.add_row(name, _bytes(share["held_bytes"]), _bytes(share["limit_bytes"]))
    return table


def _errors(old: dict, new: dict, seconds: float) -> Table | Text:
    """Refused requests by errno, and the tiers' own error counters; only those that happened."""
    rows = [(kind, _delta(old.get("errors", {}), new["errors"], kind), total)
            for kind, total in sorted(new.get("errors", {}).items())]
    for tier, counters in new.get("tiers", {}).items():
        for key, label in _TIER_ERRORS.items():
            if counters.get(key):
                rows.append((f"{tier} {label}", _delta(old.get("tiers", {}).get(tier, {}), counters, key),
                             counters[key]))
    rows = [row for row in rows if row[2]]
    if not rows:
        return Text("errors: none")
    table = _table("error", "per s", "total")
    for kind, grown, total in rows:
        table.add_row(kind, _number(grown / seconds), str(total))
    return table


def command(args: argparse.Namespace) -> int:
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be at least 1")
    if not 0.1 <= args.interval <= 3600:
        raise UsageError("--interval must be from 0.1 to 3600 seconds")
    return show(Path(args.mountpoint), args.count, args.interval)


def show(mountpoint: Path, count: int | None, interval: float) -> int:
    """Show views until ``count`` have been printed, or until Ctrl-C. Raises UsageError or
    CommandFailed (the stats file unreadable, ``stats.read_stats``) or deadline.NoAnswer."""
    console = _Console(highlight=False)
    plain = count is not None or not console.is_terminal
    if plain:
        console = _Console(highlight=False, color_system=None, width=max(console.width, _PLAIN_WIDTH))
    previous = read_sample(mountpoint)
    next_at = previous.taken + interval
    shown = 0
    live = None if plain else Live(console=console, screen=True, auto_refresh=False)
    try:
        with live or contextlib.nullcontext():
            while count is None or shown < count:
                time.sleep(max(0.0, next_at - time.monotonic()))
                next_at += interval
                sample = read_sample(mountpoint)
                view = render(mountpoint, previous, sample)
                if plain:
                    console.print(view)
                    console.file.flush()
                else:
                    live.update(view, refresh=True)
                previous = sample
                shown += 1
    except KeyboardInterrupt:
        pass
    return 0
