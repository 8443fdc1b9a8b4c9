"""``bench.py``'s results: what one measurement holds, the issues' targets, the tables and the
chart; not a benchmark by itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

HICACHEFS, FILE, FAST_FILE = "hicachefs", "HiCacheFile", "fast_file core"
BACKENDS = (HICACHEFS, FILE, FAST_FILE)
FAST_FILE_LABEL = ("core of SGLang PR #39880 (not in 0.5.23): pwritev/preadv between the pool's "
                   "page buffers and tmpfs files, temporary file + rename")
WRITE, FIRST, SECOND, LATER = "write", "first read", "second read", "later reads"
OPS_EXPLAINED = (
    f"'{WRITE}': batch_set_v1 (hicachefs) / batch_set (HiCacheFile) of new pages; "
    f"'{FIRST}': the first read of pages after their write; "
    f"'{SECOND}': the next read of the same pages: hicachefs reads them through its fetch file "
    "again and then opens, reads and keeps each page's file on a thread of its own (the "
    "background keep, waited for after each call, outside the call's time; its CPU time and "
    "requests count in this row); "
    f"'{LATER}': every read after that: hicachefs reads through the kept files, from the "
    "kernel's page cache, with no request to the daemon but a report of those reads every 0.5 s.")
HOST_RANKS = 8  # a host of 8 TP ranks: the daemon's ceiling is set beside 8 HiCacheFile ranks
MIB = 1 << 20

# Issue 17's targets, hicachefs/HiCacheFile throughput, same run: page size -> op -> minimum.
# Its "repeated read" is checked on the later-reads row (the second read is shown beside it).
RAM_TARGETS = {
    "128 KiB": {WRITE: 1.0, FIRST: 1.0, LATER: 1.0},
    "256 KiB": {WRITE: 1.0, FIRST: 1.0, LATER: 1.0},
    "1 MiB": {WRITE: 1.2, FIRST: 1.0, LATER: 1.5},
    "8 MiB": {WRITE: 1.5, LATER: 2.0},
}
# Issue 10's (SSD) and issue 11's (cross-host) targets: (case, op) -> minimum ratio.
OTHER_TARGETS = {
    ("SSD cold 8 MiB x128", "cold read"): 0.9, ("SSD cold 1 MiB x128", "cold read"): 0.9,
    ("cross-host 1 MiB x128", "exists + read on B"): 1.0,
}
# Issue 17, the daemon's own counters: FUSE requests per MiB published, per page read (pages up
# to 1 MiB: a READ carries at most 1 MiB, so a larger page read from the daemon takes more),
# CPU per 1 MiB page published.
PUBLISH_REQUESTS_PER_MIB, READ_REQUESTS_PER_PAGE, PUBLISH_US_PER_MIB_PAGE = 2.0, 1.0, 300.0
# Issue 17: from 1 to 2 ranks, hicachefs scales at least as HiCacheFile does, on these ops.
SCALING_OPS = (WRITE, LATER)
# case -> batch_exists p50 target (issue 10: 100,000 pages stored; issue 11: misses on B with
# the shared tier on)
EXISTS_P50_TARGETS_MS = {"exists": 1.0, "cross-host 1 MiB x128": 2.0}


def size_label(page_bytes: int) -> str:
    kib = page_bytes >> 10
    return f"{kib >> 10} MiB" if kib % 1024 == 0 else f"{kib} KiB"


@dataclass
class Result:
    """One backend doing one operation in one case. Throughput is bytes over the summed
    per-call time, or over ``wall`` (first start to last end) when several ranks ran at once."""

    case: str          # "RAM 1 MiB x128", "SSD cold 8 MiB x128", "exists", "ranks 1 MiB x128"
    op: str            # write / first read / second read / later reads / cold read / exists
    backend: str
    seconds: List[float] = field(default_factory=list)  # per call
    pages: int = 0
    page_bytes: int = 0
    batch: int = 128   # pages per call
    bad_pages: int = 0
    checked: int = 0   # sampled pages compared byte for byte after the reads
    failed: int = 0
    requests: Dict[str, int] = field(default_factory=dict)  # the daemon's, for hicachefs
    note: str = ""
    ranks: int = 1
    wall: Optional[float] = None
    invalid: str = ""  # why the measurement does not show what it claims to
    cpu: float = 0.0         # CPU seconds of the calling process(es) in the calls
    daemon_cpu: float = 0.0  # CPU seconds of the hicachefs daemon meanwhile
    owner_cpu: float = 0.0   # of those, its own process's (the ranks case: with workers, not all)
    keep_seconds: float = 0.0  # waited for the background keep after the calls (second read)
    kept_reads: int = 0        # pages read through files the client keeps open

    def add(self, call) -> None:
        """Count one call (a ``bench_sglang.Call``)."""
        self.seconds.append(call.seconds)
        self.cpu += call.cpu
        self.pages += call.pages
        self.failed += call.failed
        self.checked += call.checked
        self.bad_pages += call.bad

    @property
    def total(self) -> float:
        return self.wall if self.wall is not None else sum(self.seconds)

    @property
    def gbps(self) -> float:
        return self.pages * self.page_bytes / self.total / 1e9 if self.total else float("nan")

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.total if self.total else float("nan")

    def ms(self, q: float) -> float:
        if not self.seconds:
            return float("nan")
        return float(np.percentile(np.asarray(self.seconds), q)) * 1e3

    @property
    def cpu_per_gb(self) -> float:
        """CPU seconds (caller and daemon) per GB moved: unlike GB/s, barely changed by other
        work on the machine."""
        moved = self.pages * self.page_bytes / 1e9
        return (self.cpu + self.daemon_cpu) / moved if moved else float("nan")

    @property
    def daemon_busy(self) -> float:
        """The daemon's CPU time over the elapsed time, the background keep's included (1.0:
        one core, all the time)."""
        elapsed = self.total + self.keep_seconds
        return self.daemon_cpu / elapsed if elapsed else float("nan")

    @property
    def owner_busy(self) -> float:
        """``daemon_busy`` of the daemon's own process alone: with workers, the owner of the
        store answers all of them, and its one thread is the ceiling."""
        elapsed = self.total + self.keep_seconds
        return self.owner_cpu / elapsed if elapsed else float("nan")

    @property
    def requests_per_page(self) -> float:
        return sum(self.requests.values()) / self.pages if self.pages else float("nan")

    @property
    def requests_per_mib(self) -> float:
        return self.requests_per_page * MIB / self.page_bytes if self.page_bytes else float("nan")

    @property
    def daemon_us_per_page(self) -> float:
        return self.daemon_cpu / self.pages * 1e6 if self.pages else float("nan")


def find(results: List[Result], case: str, op: str, backend: str, ranks: int = 1
         ) -> Optional[Result]:
    for r in results:
        if (r.case, r.op, r.backend, r.ranks) == (case, op, backend, ranks):
            return r
    return None


def _ordered(results: List[Result], keep) -> List[Tuple[str, str]]:
    seen: List[Tuple[str, str]] = []
    for r in results:
        if keep(r) and (r.case, r.op) not in seen:
            seen.append((r.case, r.op))
    return seen


def _ratio(fs: Optional[Result], hf: Optional[Result]) -> Optional[float]:
    if fs is None or hf is None or not (hf.gbps > 0):
        return None
    return fs.gbps / hf.gbps


@dataclass(frozen=True)
class Check:
    """One target on one row: what it asks, what was measured, whether it was met."""

    want: str
    measured: str
    ok: bool

    def cell(self) -> str:
        return f"{self.want} {'ok' if self.ok else 'MISS'}"


# Where a check is shown: (table, case, op, ranks) -> its checks.
Checks = Dict[Tuple[str, str, str, int], List[Check]]


def checks(results: List[Result]) -> Checks:
    """Every issue's target that this run measured, by the row that shows it."""
    found: Checks = {}

    def add(where: Tuple[str, str, str, int], check: Check) -> None:
        found.setdefault(where, []).append(check)

    for r in results:
        if r.backend != HICACHEFS:
            continue
        if r.wall is None:
            hf = find(results, r.case, r.op, FILE)
            if r.op == "exists":
                want = EXISTS_P50_TARGETS_MS.get(r.case)
                if want is not None:
                    add(("pages", r.case, r.op, 1),
                        Check(f"p50<={want:g}ms", f"{r.ms(50):.2f} ms", r.ms(50) <= want))
                continue
            want, ratio = _ratio_target(r.case, r.op, r.page_bytes), _ratio(r, hf)
            if want is not None and ratio is not None:
                add(("pages", r.case, r.op, 1), Check(f">={want:g}x", f"{ratio:.3f}x", ratio >= want))
        elif r.ranks == 1 and r.op in SCALING_OPS:
            scaling = _scaling(results, r)
            if scaling is not None:
                add(("ranks", r.case, r.op, 1), scaling)
        if r.requests and (r.case.startswith("RAM ") or r.case.startswith("ranks ")):
            for check in _daemon_checks(r):
                add(("host", r.case, r.op, r.ranks), check)
    return found


def _ratio_target(case: str, op: str, page_bytes: int) -> Optional[float]:
    """The minimum hicachefs/HiCacheFile ratio of this row, if an issue sets one."""
    if case.startswith("RAM "):
        return RAM_TARGETS.get(size_label(page_bytes), {}).get(op)
    return OTHER_TARGETS.get((case, op))


def _daemon_checks(r: Result) -> List[Check]:
    """Issue 17's targets on the daemon's own counters that apply to this row."""
    found = []
    if r.op == WRITE:
        found.append(Check(f"<={PUBLISH_REQUESTS_PER_MIB:g} req/MiB", f"{r.requests_per_mib:.3f}",
                           r.requests_per_mib <= PUBLISH_REQUESTS_PER_MIB))
        if r.page_bytes == MIB and r.case.startswith("RAM "):
            found.append(Check(f"<={PUBLISH_US_PER_MIB_PAGE:g} us/page",
                               f"{r.daemon_us_per_page:.0f} us",
                               r.daemon_us_per_page <= PUBLISH_US_PER_MIB_PAGE))
    elif r.op in (FIRST, SECOND, LATER) and r.page_bytes <= MIB:
        found.append(Check(f"<={READ_REQUESTS_PER_PAGE:g} req/page", f"{r.requests_per_page:.3f}",
                           r.requests_per_page <= READ_REQUESTS_PER_PAGE))
    return found


def _scaling(results: List[Result], one: Result) -> Optional[Check]:
    """Issue 17: hicachefs's scaling from 1 to 2 ranks at least HiCacheFile's."""
    pairs = [(find(results, one.case, one.op, b, 1), find(results, one.case, one.op, b, 2))
             for b in (HICACHEFS, FILE)]
    if not all(a and b and a.gbps > 0 for a, b in pairs):
        return None
    (fs1, fs2), (hf1, hf2) = pairs
    ours, theirs = fs2.gbps / fs1.gbps, hf2.gbps / hf1.gbps
    return Check(f"scaling >= HiCacheFile's {theirs:.2f}x", f"{ours:.2f}x", ours >= theirs)


def _ranks_label(case: str, ranks: int) -> str:
    return f"{case} ({ranks} rank{'s' * (ranks > 1)})"


def _label(r: Result) -> str:
    """The row's case, with its rank count when ranks ran at once."""
    return _ranks_label(r.case, r.ranks) if r.wall is not None else r.case


def _row_name(where: Tuple[str, str, str, int]) -> str:
    table_name, case, op, ranks = where
    return f"{_ranks_label(case, ranks) if table_name == 'host' and case.startswith('ranks ') else case} {op}"


def _cell(found: Checks, where: Tuple[str, str, str, int]) -> str:
    return "; ".join(c.cell() for c in found.get(where, []))


# ---------------------------------------------------------------------------- tables


def pages_table(results: List[Result], memcpy: float, found: Checks) -> List[str]:
    head = (f"{'case':<22}{'op':<19}{'backend':<16}{'GB/s':>7}{'pages/s':>10}{'p50 ms':>9}"
            f"{'p99 ms':>9}{'vs HF':>7}{'memcpy':>8}{'CPU s/GB':>9}  target")
    lines = [head, "-" * len(head)]
    for case, op in _ordered(results, lambda r: r.wall is None):
        hf = find(results, case, op, FILE)
        first = True
        for backend in BACKENDS:
            r = find(results, case, op, backend)
            if r is None:
                continue
            target = _cell(found, ("pages", case, op, 1)) if backend == HICACHEFS else ""
            if op == "exists":
                gb, frac, cpu = "-", "-", "-"
                ratio = hf.ms(50) / r.ms(50) if hf and r is not hf else None
            else:
                gb, frac, cpu = f"{r.gbps:.2f}", f"{r.gbps / memcpy:.0%}", f"{r.cpu_per_gb:.2f}"
                ratio = _ratio(r, hf) if r is not hf else None
            lines.append(
                f"{case if first else '':<22}{op if first else '':<19}{backend:<16}{gb:>7}"
                f"{r.pages_per_s:>10,.0f}{r.ms(50):>9.2f}{r.ms(99):>9.2f}"
                f"{(f'{ratio:.2f}x' if ratio else ''):>7}{frac:>8}{cpu:>9}  {target}")
            first = False
    return lines


def host_table(results: List[Result], found: Checks) -> List[str]:
    """Per operation and page size, what a page costs the daemon and what one daemon core could
    therefore serve, beside a host of HiCacheFile ranks at the rate measured in the same run."""
    rows = [r for r in results if r.backend == HICACHEFS and r.pages and r.op != "exists"
            and r.requests]
    if not rows:
        return []
    head = (f"{'case':<30}{'op':<19}{'req/page':>9}{'req/MiB':>8}{'daemon us/page':>15}"
            f"{'1 core pages/s':>15}{f'{HOST_RANKS} HF ranks':>13}{'core/ranks':>11}  target")
    lines = [head, "-" * len(head)]
    for r in rows:
        hf = find(results, r.case, r.op, FILE, r.ranks)
        core = 1e6 / r.daemon_us_per_page if r.daemon_us_per_page > 0 else float("nan")
        host = HOST_RANKS * hf.pages_per_s / hf.ranks if hf else float("nan")
        lines.append(f"{_label(r):<30}{r.op:<19}{r.requests_per_page:>9.2f}{r.requests_per_mib:>8.2f}"
                     f"{r.daemon_us_per_page:>15,.0f}{core:>15,.0f}{host:>13,.0f}"
                     f"{core / host:>10.2f}x  {_cell(found, ('host', r.case, r.op, r.ranks))}")
    return lines


def ranks_table(results: List[Result], found: Checks) -> List[str]:
    ranked = [r for r in results if r.wall is not None]
    if not ranked:
        return []
    counts = sorted({r.ranks for r in ranked})
    most = counts[-1]
    head = (f"{'case':<22}{'op':<13}{'backend':<13}" + "".join(f"{f'{n} GB/s':>8}" for n in counts)
            + "".join(f"{f'x{n}':>7}" for n in counts[1:]) + f"{'vs HF':>7}{'daemon':>8}{'owner':>7}"
            + "  target (scaling 1 -> 2 ranks)")
    lines = [head, "-" * len(head)]
    for case, op in _ordered(ranked, lambda r: True):
        for backend in (HICACHEFS, FILE):
            by_count = {n: find(results, case, op, backend, n) for n in counts}
            if by_count[1] is None:
                continue
            other = {n: find(results, case, op, FILE if backend == HICACHEFS else HICACHEFS, n)
                     for n in counts}
            rates = "".join(f"{r.gbps:>8.2f}" if r else f"{'-':>8}" for r in by_count.values())
            scaling = "".join(f"{by_count[n].gbps / by_count[1].gbps:>6.2f}x" if by_count[n]
                              else f"{'-':>7}" for n in counts[1:])
            last = by_count[most]
            ratio = _ratio(last, other[most]) if backend == HICACHEFS else None
            target = ""
            if backend == HICACHEFS and op in SCALING_OPS:
                target = _cell(found, ("ranks", case, op, 1)) or "not measured (--ranks has no 2)"
            lines.append(f"{case if backend == HICACHEFS else '':<22}"
                         f"{op if backend == HICACHEFS else '':<13}{backend:<13}{rates}{scaling}"
                         f"{(f'{ratio:.2f}x' if ratio else ''):>7}"
                         f"{(f'{last.daemon_busy:.0%}' if backend == HICACHEFS and last else ''):>8}"
                         f"{(f'{last.owner_busy:.0%}' if backend == HICACHEFS and last else ''):>7}"
                         f"  {target}")
    return lines


def table(results: List[Result], memcpy: float, ranks_note: str) -> str:
    found = checks(results)
    lines = pages_table(results, memcpy, found)
    lines += ["", f"'vs HF' is each backend's throughput over HiCacheFile's (exists: HiCacheFile p50 "
              f"/ p50); '{FAST_FILE}' is the {FAST_FILE_LABEL}; p50/p99 are per call "
              "(xN in the case: N pages a call). 'CPU s/GB' is the CPU time of the caller (all its "
              "threads) and of the hicachefs daemon per GB moved: what the work costs, which other "
              f"load on the machine changes far less than GB/s. 'memcpy': the fraction of "
              f"{memcpy:.2f} GB/s (numpy copy, start of this run).", OPS_EXPLAINED,
              "Issue 17's 'repeated read' targets are checked on the later-reads row; the second "
              "read is shown beside it."]
    ranks = ranks_table(results, found)
    if ranks:
        lines += ["", ranks_note, *ranks, "",
                  "GB/s are aggregate: all ranks' bytes over the time from the first rank's "
                  "start to the last rank's end (a second read's background keep is waited for "
                  "after that, and counts in the daemon's CPU time); 'xN' is that aggregate over "
                  "one rank's; 'vs HF' and 'daemon' (its CPU time over that time and the keep's; "
                  "100% = one core) at the most ranks; 'owner': the same of the daemon's own "
                  "process alone, which with --workers answers every worker (near 100%: the "
                  "owner is the ceiling)."]
    host = host_table(results, found)
    if host:
        lines += ["", "Per page, on the daemon's side (its own counters: .hicachefs/stats "
                  "'requests', its CPU time from the kernel), and what one daemon core could "
                  f"therefore serve (1 / CPU per page) beside {HOST_RANKS} ranks of HiCacheFile at "
                  "the per-rank rate measured in the same case and run:", *host]
    lines += ["", "FUSE requests per page seen by the daemon, by kind:"]
    for r in results:
        if r.backend == HICACHEFS and r.requests and r.pages:
            per = ", ".join(f"{op} {n / r.pages:.3f}" for op, n in
                            sorted(r.requests.items(), key=lambda kv: -kv[1]))
            lines.append(f"  {_label(r)} {r.op}: {per}")
    notes = [r for r in results if r.note]
    if notes:
        lines += ["", "Notes:"]
        lines += [f"  {_label(r)} {r.op} {r.backend}: {r.note.strip('; ')}" for r in notes]
    lines.append("")
    problems = [r for r in results if r.failed or r.bad_pages or r.invalid]
    for r in problems:
        lines.append(f"PROBLEM {_label(r)} {r.op} {r.backend}: {r.failed} pages failed, "
                     f"{r.bad_pages} sampled pages wrong {r.invalid}".rstrip())
    if not problems:
        lines.append(f"Every call succeeded; {sum(r.checked for r in results):,} sampled pages "
                     "read back byte-exact.")
    every = [(where, c) for where, cs in found.items() for c in cs]
    missed = [f"{_row_name(where)}: {c.want} (measured {c.measured})" for where, c in every if not c.ok]
    lines.append(f"Targets: {len(every) - len(missed)} ok, {len(missed)} MISS"
                 + (": " + "; ".join(missed) if missed else "."))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- chart

COLORS = {HICACHEFS: "#1f77b4", FILE: "#ff7f0e", FAST_FILE: "#2ca02c"}


def chart(results: List[Result], memcpy: float, path: Path, title: str) -> None:
    """One panel per case: GB/s per operation and backend (ranks: per rank count, on a panel
    twice as wide)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 4
    cases = list(dict.fromkeys(r.case for r in results))
    spans = [2 if len({r.ranks for r in results if r.case == case}) > 1 else 1 for case in cases]
    places, row, column = [], 0, 0
    for span in spans:
        if column + span > columns:
            row, column = row + 1, 0
        places.append((row, column, span))
        column += span
    fig = plt.figure(figsize=(4.6 * columns, 3.6 * (row + 1)))
    grid = fig.add_gridspec(row + 1, columns)
    for case, (row, column, span) in zip(cases, places):
        ax = fig.add_subplot(grid[row, column:column + span])
        mine = [r for r in results if r.case == case]
        backends = [b for b in BACKENDS if any(r.backend == b for r in mine)]
        if all(r.op == "exists" for r in mine):
            _exists_panel(ax, case, mine, backends)
            continue
        counts = sorted({r.ranks for r in mine})
        groups = [(op, n) for op in dict.fromkeys(r.op for r in mine if r.op != "exists")
                  for n in counts]
        x = np.arange(len(groups))
        width = 0.8 / len(backends)
        for i, backend in enumerate(backends):
            values = [(find(mine, case, op, backend, n) or Result(case, op, backend)).gbps
                      for op, n in groups]
            bars = ax.bar(x + (i - (len(backends) - 1) / 2) * width,
                          [v if v == v else 0 for v in values], width, label=backend,
                          color=COLORS[backend])
            ax.bar_label(bars, fmt="%.2g", fontsize=6)
        ax.set_xticks(x, [op.replace(" ", "\n", 1) + (f"\n{n} rank{'s' * (n > 1)}" if len(counts) > 1 else "")
                          for op, n in groups], fontsize=7)
        ax.set_title(case + (" (aggregate)" if len(counts) > 1 else ""), fontsize=9)
        ax.set_ylabel("GB/s", fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
    shown = [b for b in BACKENDS if any(r.backend == b for r in results)]
    fig.legend([plt.Rectangle((0, 0), 1, 1, color=COLORS[b]) for b in shown], shown,
               loc="upper right", fontsize=8)
    fig.suptitle(f"{title}; memcpy {memcpy:.1f} GB/s", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.93, 0.96))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _exists_panel(ax, case: str, mine: List[Result], backends: List[str]) -> None:
    shown = [r for b in backends for r in mine if r.backend == b and r.op == "exists"]
    xs = np.arange(len(shown))
    colors = [COLORS[r.backend] for r in shown]
    p50 = ax.bar(xs - 0.2, [r.ms(50) for r in shown], 0.4, color=colors)
    p99 = ax.bar(xs + 0.2, [r.ms(99) for r in shown], 0.4, color=colors, alpha=0.5)
    ax.bar_label(p50, fmt="%.2f", fontsize=6)
    ax.bar_label(p99, fmt="%.2f", fontsize=6)
    ax.set_xticks(xs, [r.backend for r in shown], fontsize=7)
    ax.set_ylabel("ms per batch_exists", fontsize=8)
    ax.set_title(f"{case}: batch_exists of 128 keys\nsolid p50, light p99", fontsize=9)
