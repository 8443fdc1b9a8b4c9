"""``bench.py``'s results: what one measurement holds, issue 28's targets, the tables and the
chart; not a benchmark by itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

HICACHEFS, FILE, FAST_FILE, MEMCPY = "hicachefs", "HiCacheFile", "fast_file core", "memcpy"
BACKENDS = (HICACHEFS, FILE, FAST_FILE, MEMCPY)
FAST_FILE_LABEL = ("core of SGLang PR #39880 (not in 0.5.23): pwritev/preadv between the pool's "
                   "page buffers and tmpfs files, temporary file + rename")
WRITE, FIRST, AGAIN = "write", "first read", "read again"
READS = (FIRST, AGAIN)
OPS_EXPLAINED = (
    f"'{WRITE}': batch_set_v1 (hicachefs) / batch_set (HiCacheFile) of new pages; "
    f"'{FIRST}': the first read of the pages after their write; '{AGAIN}': every read after that. "
    "hicachefs reads both through its data plane (the client finds each page in the daemon's "
    "shared index and copies it from the RAM arena itself, asking the daemon nothing; it reports "
    "the pages it read every 0.5 s, in one request); its writes reserve slots, pwritev into "
    "them and commit the batch in one request.")
HOST_RANKS = 8  # a host of 8 TP ranks: the daemon's ceiling is set beside 8 HiCacheFile ranks
MIB = 1 << 20

# Issue 28's targets, hicachefs/HiCacheFile throughput, same run: RAM case -> op -> minimum.
RAM_TARGETS = {
    "RAM 128 KiB x8": {WRITE: 1.5, FIRST: 2.0},
    "RAM 256 KiB x8": {FIRST: 2.0},
    "RAM 768 KiB x32": {FIRST: 2.0},
    "RAM 1 MiB x128": {WRITE: 2.0, FIRST: 2.0},
    "RAM 8 MiB x128": {WRITE: 2.0, FIRST: 2.0},
}
#: Issue 28: plane first reads of 1 MiB pages reach this fraction of memcpy into the pool.
MEMCPY_TARGETS = {("RAM 1 MiB x128", FIRST): 0.8}
#: Issue 28: a read again is not slower than a first read: its p50 call time at most 1/this of
#: the first read's (p50: a few calls slowed by other load do not decide it).
AGAIN_SLACK = 0.95
# Issue 10's (SSD) and issue 11's (cross-host) targets: (case, op) -> minimum ratio.
OTHER_TARGETS = {
    ("SSD cold 8 MiB x128", "cold read"): 0.9, ("SSD cold 1 MiB x128", "cold read"): 0.9,
    ("cross-host 1 MiB x128", "exists + read on B"): 1.0,
}
# Issue 28, the daemon's own counters: requests per page read (its reports of the reads, batched
# and sent every 0.5 s, shown apart), requests per write batch, CPU per page published.
READ_REQUESTS_PER_PAGE, WRITE_REQUESTS_PER_BATCH, PUBLISH_US_PER_PAGE = 0.0, 1.0, 30.0
# Issue 28: from 1 to 2 ranks, the aggregate grows at least this much, on these ops.
SCALING_OPS, SCALING_TARGET = (WRITE, FIRST), 1.6
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
    op: str            # write / first read / read again / cold read / exists
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
    reports: int = 0         # hicachefs: the client's plane requests in a read pass (its reports)
    plane_pages: int = 0     # hicachefs: pages the client moved through the data plane
    # hicachefs writes from each pass's second batch on: the daemon's requests and CPU seconds,
    # the calls and pages (a pass's first batch also opens a second thread's handle on the plane
    # file and reserves what the warm-up page did not)
    steady_requests: int = 0
    steady_cpu: float = 0.0
    steady_calls: int = 0
    steady_pages: int = 0
    steady_evictions: int = 0  # pages the daemon evicted meanwhile (room for the pages published)

    def add(self, call) -> None:
        """Count one call (a ``bench_sglang.Call``)."""
        self.seconds.append(call.seconds)
        self.cpu += call.cpu
        self.pages += call.pages
        self.failed += call.failed
        self.checked += call.checked
        self.bad_pages += call.bad

    @property
    def calls(self) -> int:
        return len(self.seconds)

    @property
    def total(self) -> float:
        return self.wall if self.wall is not None else sum(self.seconds)

    @property
    def gbps(self) -> float:
        return self.pages * self.page_bytes / self.total / 1e9 if self.total else float("nan")

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.total if self.total else float("nan")

    def ms(self, q: Optional[float] = None) -> float:
        """The q-th percentile of the per-call times (the mean when q is None), ms."""
        if not self.seconds:
            return float("nan")
        values = np.asarray(self.seconds)
        return float(values.mean() if q is None else np.percentile(values, q)) * 1e3

    @property
    def cpu_per_gb(self) -> float:
        """CPU seconds (caller and daemon) per GB moved: unlike GB/s, barely changed by other
        work on the machine."""
        moved = self.pages * self.page_bytes / 1e9
        return (self.cpu + self.daemon_cpu) / moved if moved else float("nan")

    @property
    def daemon_busy(self) -> float:
        """The daemon's CPU time over the elapsed time (1.0: one core, all the time)."""
        return self.daemon_cpu / self.total if self.total else float("nan")

    @property
    def all_requests(self) -> int:
        return sum(self.requests.values())

    @property
    def requests_per_page(self) -> float:
        """The daemon's requests per page, its reports of reads left out."""
        return max(0, self.all_requests - self.reports) / self.pages if self.pages else float("nan")

    @property
    def reports_per_page(self) -> float:
        return self.reports / self.pages if self.pages else float("nan")

    @property
    def requests_per_call(self) -> float:
        return self.all_requests / self.calls if self.calls else float("nan")

    @property
    def daemon_us_per_page(self) -> float:
        return self.daemon_cpu / self.pages * 1e6 if self.pages else float("nan")

    @property
    def steady_requests_per_call(self) -> float:
        return self.steady_requests / self.steady_calls if self.steady_calls else float("nan")

    @property
    def steady_us_per_page(self) -> float:
        return self.steady_cpu / self.steady_pages * 1e6 if self.steady_pages else float("nan")


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
    why: str = ""  # of a MISS: the bound this run shows it hit

    def cell(self) -> str:
        return f"{self.want} {'ok' if self.ok else 'MISS'}" + (f" ({self.why})" if self.why else "")


# Where a check is shown: (table, case, op, ranks) -> its checks.
Checks = Dict[Tuple[str, str, str, int], List[Check]]


def checks(results: List[Result], memcpy_together: Dict[int, float], ahead_bytes: int) -> Checks:
    """Every issue's target that this run measured, by the row that shows it. A MISS says which
    bound it hit, where the run shows one: memory bandwidth (``memcpy_together``: memcpy in N
    processes at once, GB/s) or the daemon's share of slots reserved ahead (``ahead_bytes``)."""
    found: Checks = {}

    def add(where: Tuple[str, str, str, int], check: Check) -> None:
        found.setdefault(where, []).append(check)

    for r in results:
        if r.backend != HICACHEFS:
            continue
        if r.wall is None:
            where = ("pages", r.case, r.op, 1)
            if r.op == "exists":
                want = EXISTS_P50_TARGETS_MS.get(r.case)
                if want is not None:
                    add(where, Check(f"p50<={want:g}ms", f"{r.ms(50):.2f} ms", r.ms(50) <= want))
                continue
            want, ratio = _ratio_target(r.case, r.op), _ratio(r, find(results, r.case, r.op, FILE))
            if want is not None and ratio is not None:
                add(where, Check(f">={want:g}x HF", f"{ratio:.3f}x", ratio >= want))
            want = MEMCPY_TARGETS.get((r.case, r.op))
            fraction = _ratio(r, find(results, r.case, r.op, MEMCPY))
            if want is not None and fraction is not None:
                add(where, Check(f">={want:g} memcpy", f"{fraction:.3f}", fraction >= want))
            first = find(results, r.case, FIRST, HICACHEFS)
            if r.op == AGAIN and first is not None and first.seconds:
                speed = first.ms(50) / r.ms(50)
                add(where, Check(f"p50 >={AGAIN_SLACK:g}x first read's speed", f"{speed:.3f}x",
                                 speed >= AGAIN_SLACK))
        elif r.ranks == 1 and r.op in SCALING_OPS:
            scaling = _scaling(results, r, memcpy_together)
            if scaling is not None:
                add(("ranks", r.case, r.op, 1), scaling)
        if r.case.startswith("RAM "):
            for check in _daemon_checks(r, ahead_bytes):
                add(("host", r.case, r.op, r.ranks), check)
    return found


def _ratio_target(case: str, op: str) -> Optional[float]:
    """The minimum hicachefs/HiCacheFile ratio of this row, if an issue sets one."""
    if case.startswith("RAM "):
        return RAM_TARGETS.get(case, {}).get(op)
    return OTHER_TARGETS.get((case, op))


def _daemon_checks(r: Result, ahead_bytes: int) -> List[Check]:
    """Issue 28's targets on the daemon's own counters that apply to this row."""
    if not r.pages:
        return []
    if r.op == WRITE:
        per_call, per_page = ((r.steady_requests_per_call, r.steady_us_per_page) if r.steady_calls
                              else (r.requests_per_call, r.daemon_us_per_page))
        batch_bytes = r.batch * r.page_bytes
        why = (f"a batch of {batch_bytes >> 20} MiB > the {ahead_bytes >> 20} MiB reserved ahead for all "
               "writers: its slots are asked first" if batch_bytes > ahead_bytes else "")
        evicted = r.steady_evictions / r.steady_pages if r.steady_pages else 0.0
        dear = (f"{evicted:.1f} pages evicted a page published: this run's earlier cases' smaller pages, "
                "a slab of them emptied for each new slot" if evicted > 1.5 else "")
        return [Check(f"<={WRITE_REQUESTS_PER_BATCH:g} req/batch", f"{per_call:.3f}",
                      per_call <= WRITE_REQUESTS_PER_BATCH, why),
                Check(f"<={PUBLISH_US_PER_PAGE:g} us/page", f"{per_page:.1f} us",
                      per_page <= PUBLISH_US_PER_PAGE, dear)]
    if r.op in READS:
        return [Check(f"{READ_REQUESTS_PER_PAGE:g} req/page", f"{r.requests_per_page:.4f}",
                      r.requests_per_page <= READ_REQUESTS_PER_PAGE)]
    return []


def _scaling(results: List[Result], one: Result, memcpy_together: Dict[int, float]) -> Optional[Check]:
    """Issue 28: hicachefs's aggregate at 2 ranks at least ``SCALING_TARGET`` x one rank's; a MISS
    whose 2 ranks move as much as memcpy in 2 processes at once (within 5%) is memory's bound."""
    fs1, fs2 = find(results, one.case, one.op, HICACHEFS, 1), find(results, one.case, one.op, HICACHEFS, 2)
    if not (fs1 and fs2 and fs1.gbps > 0):
        return None
    ours = fs2.gbps / fs1.gbps
    memcpy2 = memcpy_together.get(2, 0.0)
    why = (f"memory-bound: 2 ranks {fs2.gbps:.1f} GB/s, memcpy in 2 processes {memcpy2:.1f}"
           if memcpy2 and fs2.gbps >= 0.95 * memcpy2 else "")
    return Check(f"x2 >= {SCALING_TARGET:g}", f"{ours:.2f}x", ours >= SCALING_TARGET, why)


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


def pages_table(results: List[Result], found: Checks) -> List[str]:
    head = (f"{'case':<20}{'op':<12}{'backend':<15}{'GB/s':>7}{'pages/s':>10}{'p50 ms':>9}"
            f"{'mean ms':>9}{'p99 ms':>9}{'vs HF':>7}{'vs memcpy':>10}{'CPU s/GB':>9}  target")
    lines = [head, "-" * len(head)]
    for case, op in _ordered(results, lambda r: r.wall is None):
        hf, mc = find(results, case, op, FILE), find(results, case, op, MEMCPY)
        first = True
        for backend in BACKENDS:
            r = find(results, case, op, backend)
            if r is None:
                continue
            target = _cell(found, ("pages", case, op, 1)) if backend == HICACHEFS else ""
            if op == "exists":
                gb, cpu, frac = "-", "-", None
                ratio = hf.ms(50) / r.ms(50) if hf and r is not hf else None
            else:
                gb, cpu = f"{r.gbps:.2f}", f"{r.cpu_per_gb:.2f}"
                ratio = _ratio(r, hf) if r is not hf else None
                frac = _ratio(r, mc) if r is not mc else None
            lines.append(
                f"{case if first else '':<20}{op if first else '':<12}{backend:<15}{gb:>7}"
                f"{r.pages_per_s:>10,.0f}{r.ms(50):>9.2f}{r.ms():>9.2f}{r.ms(99):>9.2f}"
                f"{(f'{ratio:.2f}x' if ratio else ''):>7}{(f'{frac:.2f}' if frac else ''):>10}"
                f"{cpu:>9}  {target}")
            first = False
    return lines


def host_table(results: List[Result], found: Checks) -> List[str]:
    """Per operation and case, what hicachefs's calls cost the daemon, and what one daemon core
    could therefore publish, beside a host of HiCacheFile ranks at the rate measured in the same
    case and run."""
    rows = [r for r in results if r.backend == HICACHEFS and r.pages and r.op in (WRITE, *READS)
            and (r.case.startswith("RAM ") or r.case.startswith("ranks "))]
    if not rows:
        return []
    head = (f"{'case':<30}{'op':<12}{'req/page':>9}{'reports':>9}{'req/call':>9}{'steady':>7}"
            f"{'us/page':>9}{'steady':>8}{'1 core pages/s':>15}{f'{HOST_RANKS} HF ranks':>13}"
            f"{'core/ranks':>11}  target")
    lines = [head, "-" * len(head)]
    for r in rows:
        hf = find(results, r.case, r.op, FILE, r.ranks)
        host = HOST_RANKS * hf.pages_per_s / hf.ranks if hf else float("nan")
        if r.op == WRITE:
            us = r.steady_us_per_page if r.steady_pages else r.daemon_us_per_page
            core = 1e6 / us if us > 0 else float("inf")
            core_cell, ratio_cell = f"{core:>15,.0f}", f"{core / host:>10.2f}x"
            steady = (f"{r.steady_requests_per_call:>7.2f}", f"{r.steady_us_per_page:>8.1f}") \
                if r.steady_calls else (f"{'-':>7}", f"{'-':>8}")
        else:  # a read asks the daemon nothing: no core limits it
            core_cell, ratio_cell = f"{'no limit':>15}", f"{'-':>11}"
            steady = (f"{'-':>7}", f"{'-':>8}")
        lines.append(f"{_label(r):<30}{r.op:<12}{r.requests_per_page:>9.4f}{r.reports_per_page:>9.4f}"
                     f"{r.requests_per_call:>9.2f}{steady[0]}{r.daemon_us_per_page:>9.1f}{steady[1]}"
                     f"{core_cell}{host:>13,.0f}{ratio_cell}  {_cell(found, ('host', r.case, r.op, r.ranks))}")
    return lines


def host_scale_line(results: List[Result]) -> List[str]:
    """Issue 28's "host scale, on paper": pages a second one daemon core serves with the plane,
    beside what 8 HiCacheFile ranks do, per page size written in the RAM cases."""
    lines = []
    for r in results:
        if r.backend != HICACHEFS or r.op != WRITE or not r.case.startswith("RAM ") or not r.pages:
            continue
        hf_w, hf_r = find(results, r.case, WRITE, FILE), find(results, r.case, FIRST, FILE)
        fs_r = find(results, r.case, FIRST, HICACHEFS)
        us = r.steady_us_per_page if r.steady_pages else r.daemon_us_per_page
        core = 1e6 / us if us > 0 else float("inf")
        read_cost = (f"first reads cost it {fs_r.requests_per_page:.4f} requests a page "
                     f"({fs_r.reports_per_page:.4f} more in batched reports) and "
                     f"{fs_r.daemon_us_per_page:.1f} us a page" if fs_r and fs_r.pages else "no reads measured")
        ranks = (f"{HOST_RANKS} HiCacheFile ranks at this run's one-process rate write "
                 f"{HOST_RANKS * hf_w.pages_per_s:,.0f} and read {HOST_RANKS * hf_r.pages_per_s:,.0f} "
                 f"pages/s, so one daemon core publishes {core / (HOST_RANKS * hf_w.pages_per_s):.1f}x "
                 "what they write" if hf_w and hf_r else "")
        lines.append(f"  {r.case}: one daemon core publishes {core:,.0f} pages/s "
                     f"(1e6 / {us:.1f} us a page); {read_cost}; {ranks}")
    return lines


def ranks_table(results: List[Result], found: Checks, memcpy_together: Dict[int, float]) -> List[str]:
    ranked = [r for r in results if r.wall is not None]
    if not ranked:
        return []
    counts = sorted({r.ranks for r in ranked})
    most = counts[-1]
    head = (f"{'case':<22}{'op':<12}{'backend':<13}" + "".join(f"{f'{n} GB/s':>8}" for n in counts)
            + "".join(f"{f'x{n}':>7}" for n in counts[1:]) + f"{'vs HF':>7}{'daemon':>8}"
            + "  target (x2: aggregate at 2 ranks over 1)")
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
            target = _cell(found, ("ranks", case, op, 1)) if backend == HICACHEFS else ""
            if backend == HICACHEFS and op in SCALING_OPS and not target:
                target = "not measured (--ranks has no 2)"
            lines.append(f"{case if backend == HICACHEFS else '':<22}"
                         f"{op if backend == HICACHEFS else '':<12}{backend:<13}{rates}{scaling}"
                         f"{(f'{ratio:.2f}x' if ratio else ''):>7}"
                         f"{(f'{last.daemon_busy:.0%}' if backend == HICACHEFS and last else ''):>8}"
                         f"  {target}")
    if memcpy_together:
        one = memcpy_together.get(1)
        rates = "".join(f"{memcpy_together[n]:>8.2f}" if n in memcpy_together else f"{'-':>8}"
                        for n in counts)
        scaling = "".join(f"{memcpy_together[n] / one:>6.2f}x" if one and n in memcpy_together
                          else f"{'-':>7}" for n in counts[1:])
        lines.append(f"{'memcpy, N processes':<22}{'at once':<12}{'numpy copy':<13}{rates}{scaling}")
    return lines


def table(results: List[Result], memcpy: float, ranks_note: str,
          memcpy_together: Dict[int, float], ahead_bytes: int) -> str:
    found = checks(results, memcpy_together, ahead_bytes)
    lines = pages_table(results, found)
    lines += ["", f"'vs HF' is each backend's throughput over HiCacheFile's in the same case and run "
              f"(exists: HiCacheFile p50 / p50); 'vs memcpy' over the '{MEMCPY}' row of the same case "
              f"and op (one thread's numpy copy between the pool's page buffers and an array "
              f"holding every page, same run); '{FAST_FILE}' is the {FAST_FILE_LABEL}; p50, mean "
              "and p99 are per call (xN in the case: N pages a call). 'CPU s/GB' is the CPU time of "
              "the caller (all its threads) and of the hicachefs daemon per GB moved: what the work "
              f"costs, which other load on the machine changes far less than GB/s. Plain memcpy of "
              f"large buffers at the start of the run: {memcpy:.2f} GB/s.", OPS_EXPLAINED]
    ranks = ranks_table(results, found, memcpy_together)
    if ranks:
        lines += ["", ranks_note, *ranks, "",
                  "GB/s are aggregate: all ranks' bytes over the time from the first rank's "
                  "start to the last rank's end; 'xN' is that aggregate over one rank's; 'vs HF' "
                  "and 'daemon' (its CPU time over that time; 100% = one core) at the most ranks; "
                  "'memcpy, N processes': memcpy in N processes at once, same run (GB/s in all): "
                  "how far this host's memory lets copies scale."]
    host = host_table(results, found)
    if host:
        lines += ["", "Per page, on the daemon's side (its own counters: .hicachefs/stats "
                  "'requests', its CPU time from the kernel): 'req/page' are its requests per page "
                  "less the client's batched reports of its plane reads, shown apart as 'reports' "
                  "(per page); 'req/call' all of them per call; 'us/page' the daemon's CPU time "
                  "per page; 'steady': the same of writes from each pass's second batch on (the "
                  "first also opens a second thread's handle on the plane file and reserves what "
                  "the warm-up page did not: once per handle), its CPU time counted during hicachefs's "
                  "own calls only (each waits for its commit), on which the targets are checked; "
                  "what one daemon core could therefore publish (1e6 / steady us per page written) beside "
                  f"{HOST_RANKS} ranks of HiCacheFile at the per-rank rate measured in the same "
                  "case and run:", *host]
    scale = host_scale_line(results)
    if scale:
        lines += ["", "Host scale, on paper:", *scale]
    lines += ["", "FUSE requests per page seen by the daemon, by kind:"]
    for r in results:
        if r.backend == HICACHEFS and r.requests and r.pages:
            per = ", ".join(f"{op} {n / r.pages:.4f}" for op, n in
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
    missed = [f"{_row_name(where)}: {c.want} (measured {c.measured}{'; ' + c.why if c.why else ''})"
              for where, c in every if not c.ok]
    lines.append(f"Targets: {len(every) - len(missed)} ok, {len(missed)} MISS"
                 + (": " + "; ".join(missed) if missed else "."))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- chart

COLORS = {HICACHEFS: "#1f77b4", FILE: "#ff7f0e", FAST_FILE: "#2ca02c", MEMCPY: "#7f7f7f"}


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
