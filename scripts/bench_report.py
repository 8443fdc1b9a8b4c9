"""``bench.py``'s results: what one measurement holds, the issue's targets, the table and the
chart; not a benchmark by itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

HICACHEFS, FILE = "hicachefs", "HiCacheFile"
BATCH = 128  # pages per call, SGLang's STORAGE_BATCH_SIZE

# (case, op) -> minimum throughput ratio hicachefs/HiCacheFile (issue 10's targets).
TARGETS = {
    ("RAM 8 MiB", "write"): 1.5, ("RAM 1 MiB", "write"): 1.2,
    ("RAM 8 MiB", "first read"): 1.0, ("RAM 1 MiB", "first read"): 0.8,
    ("RAM 8 MiB", "repeated read"): 1.5, ("RAM 1 MiB", "repeated read"): 1.1,
    ("SSD cold 8 MiB", "cold read"): 0.9, ("SSD cold 1 MiB", "cold read"): 0.9,
    ("cross-host 1 MiB", "exists + read on B"): 1.0,
}
RANKS_AGGREGATE_TARGET = 1.0  # at the most ranks, hicachefs's aggregate / HiCacheFile's
RANKS_TARGET_OPS = ("repeated read",)
# case -> batch_exists p50 target (issue 10: 100,000 pages stored; issue 11: misses on B with
# the shared tier on)
EXISTS_P50_TARGETS_MS = {"exists": 1.0, "cross-host 1 MiB": 2.0}


@dataclass
class Result:
    """One backend doing one operation in one case. Throughput is bytes over the summed
    per-call time, or over ``wall`` (first start to last end) when several ranks ran at once."""

    case: str          # "RAM 1 MiB", "SSD cold 8 MiB", "exists", "ranks 1 MiB"
    op: str            # write / first read / repeated read / cold read / exists
    backend: str
    seconds: List[float] = field(default_factory=list)  # per call (batch)
    pages: int = 0
    page_bytes: int = 0
    bad_pages: int = 0
    failed: int = 0
    requests: Dict[str, int] = field(default_factory=dict)
    note: str = ""
    ranks: int = 1
    wall: Optional[float] = None
    invalid: str = ""  # why the measurement does not show what it claims to
    cpu: float = 0.0         # CPU seconds of the calling process(es) in the calls
    daemon_cpu: float = 0.0  # CPU seconds of the hicachefs daemon meanwhile

    @property
    def daemon_busy(self) -> float:
        """The daemon's CPU time over the elapsed time (1.0: one core, all the time)."""
        return self.daemon_cpu / self.total if self.total else float("nan")

    @property
    def cpu_per_gb(self) -> float:
        """CPU seconds (caller and daemon) per GB moved: unlike GB/s, barely changed by other
        work on the machine."""
        moved = self.pages * self.page_bytes / 1e9
        return (self.cpu + self.daemon_cpu) / moved if moved else float("nan")

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

    def requests_per_page(self) -> Optional[float]:
        if not self.requests or not self.pages:
            return None
        return sum(self.requests.values()) / self.pages


def pair(results: List[Result], case: str, op: str, ranks: int = 1
         ) -> Tuple[Optional[Result], Optional[Result]]:
    found = {r.backend: r for r in results if (r.case, r.op, r.ranks) == (case, op, ranks)}
    return found.get(HICACHEFS), found.get(FILE)


def _ordered(results: List[Result], keep) -> List[Tuple[str, str]]:
    seen: List[Tuple[str, str]] = []
    for r in results:
        if keep(r) and (r.case, r.op) not in seen:
            seen.append((r.case, r.op))
    return seen


def _verdict(ok: bool) -> str:
    return "ok" if ok else "MISS"


def pages_table(results: List[Result], memcpy: float) -> List[str]:
    head = (f"{'case':<16}{'op':<15}{'backend':<13}{'GB/s':>7}{'pages/s':>10}{'p50 ms':>9}"
            f"{'p99 ms':>9}{'ratio':>7}{'memcpy':>8}{'CPU s/GB':>9}{'req/pg':>8}  target")
    lines = [head, "-" * len(head)]
    ranked = {r.case for r in results if r.ranks > 1}  # shown in the ranks table
    for case, op in _ordered(results, lambda r: r.case not in ranked):
        fs, hf = pair(results, case, op)
        for r in (fs, hf):
            if r is None:
                continue
            first = r is fs
            if op == "exists":
                gb, frac, cpu = "-", "-", "-"
                ratio = hf.ms(50) / fs.ms(50) if first and hf else None
                want = EXISTS_P50_TARGETS_MS.get(case)
                target = (f"p50<={want:g}ms {_verdict(fs.ms(50) <= want)}") if first and want else ""
            else:
                gb, frac, cpu = f"{r.gbps:.2f}", f"{r.gbps / memcpy:.0%}", f"{r.cpu_per_gb:.2f}"
                ratio = fs.gbps / hf.gbps if first and hf else None
                want = TARGETS.get((case, op))
                target = (f">={want:g}x {_verdict(ratio >= want)}"
                          if first and want is not None and ratio is not None else "")
            rpp = r.requests_per_page()
            lines.append(
                f"{case if first else '':<16}{op if first else '':<15}{r.backend:<13}{gb:>7}"
                f"{r.pages_per_s:>10,.0f}{r.ms(50):>9.2f}{r.ms(99):>9.2f}"
                f"{(f'{ratio:.2f}x' if ratio else ''):>7}{frac:>8}{cpu:>9}"
                f"{(f'{rpp:.2f}' if rpp is not None else ''):>8}  {target}")
    return lines


def ranks_table(results: List[Result]) -> List[str]:
    ranked = [r for r in results if r.ranks > 1]
    if not ranked:
        return []
    most = max(r.ranks for r in ranked)
    head = (f"{'case':<16}{'op':<15}{'backend':<13}{'1 rank':>8}{f'{most} ranks':>9}"
            f"{'scaling':>9}{'ratio':>7}{'CPU s/GB':>9}{'daemon':>8}  target (at {most} ranks)")
    lines = [head, "-" * len(head)]
    for case, op in _ordered(ranked, lambda r: True):
        fs1, hf1 = pair(results, case, op, 1)
        fsn, hfn = pair(results, case, op, most)
        if not (fs1 and hf1 and fsn and hfn):
            continue
        scale_fs, scale_hf = fsn.gbps / fs1.gbps, hfn.gbps / hf1.gbps
        ratio = fsn.gbps / hfn.gbps
        target = ""
        if op in RANKS_TARGET_OPS:
            target = (f"aggregate >={RANKS_AGGREGATE_TARGET:g}x "
                      f"{_verdict(ratio >= RANKS_AGGREGATE_TARGET)}, scaling >= HiCacheFile's "
                      f"{_verdict(scale_fs >= scale_hf)}")
        for r1, rn, scale, first in ((fs1, fsn, scale_fs, True), (hf1, hfn, scale_hf, False)):
            lines.append(f"{case if first else '':<16}{op if first else '':<15}{r1.backend:<13}"
                         f"{r1.gbps:>8.2f}{rn.gbps:>9.2f}{scale:>8.2f}x"
                         f"{(f'{ratio:.2f}x' if first else ''):>7}{rn.cpu_per_gb:>9.2f}"
                         f"{(f'{rn.daemon_busy:.0%}' if first else ''):>8}  "
                         f"{target if first else ''}")
    return lines


def table(results: List[Result], memcpy: float, ranks_note: str, samples_per_call: int) -> str:
    lines = pages_table(results, memcpy)
    lines.append("")
    lines.append(f"'memcpy' is the fraction of {memcpy:.2f} GB/s (numpy copy, start of this run). "
                 "'ratio' is hicachefs/HiCacheFile throughput (exists: HiCacheFile p50 / "
                 f"hicachefs p50); p50/p99 are per call of {BATCH} pages. 'CPU s/GB' is the CPU "
                 "time of the caller (all its threads) and of the hicachefs daemon per GB moved: "
                 "what the work costs, which other load on the machine changes far less than GB/s.")
    ranks = ranks_table(results)
    if ranks:
        most = max(r.ranks for r in results)
        lines += ["", ranks_note, *ranks, "",
                  "GB/s are aggregate: all ranks' bytes over the time from the first rank's "
                  "start to the last rank's end; 'scaling' is that aggregate over one rank's; "
                  f"'CPU s/GB' at {most} ranks; 'daemon' is the daemon's CPU time over that "
                  "time (100% = one core: its one thread is saturated)."]
    lines += ["", "FUSE requests per page seen by the daemon (.hicachefs/stats 'requests'; "
              "exists: per key):"]
    for r in results:
        if r.requests and r.pages:
            per = ", ".join(f"{op} {n / r.pages:.2f}" for op, n in
                            sorted(r.requests.items(), key=lambda kv: -kv[1]))
            lines.append(f"  {r.case}{f' x{r.ranks}' if r.wall is not None else ''} {r.op}: {per}")
    daemon = [r for r in results if r.daemon_cpu and r.pages and r.op != "exists"]
    if daemon:
        lines += ["", "The daemon's own CPU time per GB, and what its one thread could move if it "
                  "did nothing else (a ceiling for more ranks):"]
        for r in daemon:
            moved = r.pages * r.page_bytes / 1e9
            lines.append(f"  {r.case}{f' x{r.ranks}' if r.wall is not None else ''} {r.op}: "
                         f"{r.daemon_cpu / moved:.2f} s/GB, {moved / r.daemon_cpu:.1f} GB/s")
    notes = [r for r in results if r.note]
    if notes:
        lines += ["", "Notes:"]
        lines += [f"  {r.case} {r.op} {r.backend}"
                  f"{f' ({r.ranks} ranks)' if r.ranks > 1 else ''}: {r.note.strip('; ')}"
                  for r in notes]
    lines.append("")
    problems = [r for r in results if r.failed or r.bad_pages or r.invalid]
    for r in problems:
        lines.append(f"PROBLEM {r.case} {r.op} {r.backend} ({r.ranks} ranks): {r.failed} pages "
                     f"failed, {r.bad_pages} sampled pages wrong {r.invalid}".rstrip())
    if not problems:
        checked = sum(len(r.seconds) for r in results if "read" in r.op) * samples_per_call
        lines.append(f"Every call succeeded; {checked} sampled pages read back byte-exact.")
    return "\n".join(lines)


def chart(results: List[Result], memcpy: float, path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = [(c, o, n) for c, o in _ordered(results, lambda r: r.op != "exists")
              for n in sorted({r.ranks for r in results if (r.case, r.op) == (c, o)})]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(max(12, 1.1 * len(groups) + 4), 5.5),
                                  gridspec_kw={"width_ratios": [5, 1]})
    x = np.arange(len(groups))
    width = 0.38
    for offset, backend, color in ((-width / 2, HICACHEFS, "#1f77b4"), (width / 2, FILE, "#ff7f0e")):
        values = []
        for case, op, ranks in groups:
            r = pair(results, case, op, ranks)[0 if backend == HICACHEFS else 1]
            values.append(r.gbps if r else 0)
        bars = ax.bar(x + offset, values, width, label=backend, color=color)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    labels = [f"{n} rank{'s' * (n > 1)}, {c.split(' ', 1)[1]}\n{o}" if c.startswith("ranks")
              else f"{c}\n{o}" for c, o, n in groups]
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel(f"GB/s (calls of {BATCH} pages; ranks: aggregate)")
    ax.set_title(f"{title}; memcpy {memcpy:.1f} GB/s", fontsize=10)
    ax.legend(loc="upper left")
    fs, hf = pair(results, "exists", "exists")
    if fs and hf:
        xs = np.arange(2)
        b1 = ax2.bar(xs - 0.2, [fs.ms(50), hf.ms(50)], 0.4, color=["#1f77b4", "#ff7f0e"])
        b2 = ax2.bar(xs + 0.2, [fs.ms(99), hf.ms(99)], 0.4, color=["#1f77b4", "#ff7f0e"],
                     alpha=0.5)
        ax2.bar_label(b1, fmt="%.2f", fontsize=7)
        ax2.bar_label(b2, fmt="%.2f", fontsize=7)
        ax2.set_xticks(xs, [HICACHEFS, FILE], fontsize=8)
        ax2.set_ylabel(f"ms per batch_exists of {BATCH} keys")
        ax2.set_title(f"existence ({fs.note.split(' pages')[0]} pages stored)\n"
                      "solid p50, light p99", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
