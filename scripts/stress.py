#!/usr/bin/env python3
"""Reliability figures in one run: each kind of trouble until its target is reached, then a table.

    .venv/bin/python scripts/stress.py [--minutes 30] [--modes crash-wt,model,...] [--seed N]
                                       [--scale 1.0] [--record FILE] [--json FILE]

Modes and their targets (``--scale`` multiplies every target; 0.05 is a quick look):

  crash-wt       100 SIGKILLs of the daemon under write storms from 3 processes, --write-through,
                 remount on the same disk tier: every acknowledged page back, bit-exact
  crash-wb       10 SIGKILLs without --write-through: nothing corrupt, no temporary file left
  corruption     1,000 damages to the disk arena: bits flipped in payloads and record headers,
                 torn last records, the arena cut short (store rounds), and bytes flipped in the
                 arena of a stopped and of a running daemon: every damaged page is caught
  model          10,000 steps of the Hypothesis state machine (hicachefs_testing.model) against
                 a real mount, from a new seed every 100 steps: no divergence
  bad-input      10,000 bad names through create, mkdir, lookup and rename, and malformed exists
                 requests at and over the maximum size: the daemon keeps serving
  device-faults  1,000 faults injected into the disk tier's device (EIO, ENOSPC, short writes,
                 flipped bits, latency) under random store operations, and a disk that dies under
                 a running daemon (ext4 on a loop device): no inconsistency
  contention     8 processes writing and reading shared and per-rank pages: no torn or foreign read
  mixed          5,000 reads of 6 keys that 2 processes write directly under their names (as cp),
                 removing them first, and 2 replace by renames (as the client), by 3 readers that
                 also read the temporary files: no torn, stale or all-zero read
                 (hicachefs_testing.mixed_load)
  plane          100,000 pages read by 4 readers through the data plane while their pages are
                 replaced, written and removed with rm -r, and demoted and evicted by a filler
                 (a 16 MiB RAM tier over a disk tier): no torn, stale or foreign page taken for
                 read; prints the copies the plane made again (hicachefs_testing.plane_load)
  replaces       20,000 pages read through page files, the data plane and the fetch file while
                 one process replaces them by ingest and by rename in turn: none older than the
                 last replace acknowledged before its read began (hicachefs_testing.replace_load)
  fetch-limits   200 fetch requests at and over the 4 MiB limit, and batch_get_v1 of more pages
                 than fit in one: refused whole (EFBIG, ENOBUFS) or answered with the right
                 bytes, never another page's (hicachefs_testing.fetch_limits)
  plain-user     20,000 small requests of another client timed while uid 65534 attacks, in turn a
                 chunk each: (issue 29, hicachefs_testing.pin_attacks) floods the fetch file with
                 '0 <path>' and wrong-size lines of a page nobody reads, holds 256 fetch handles
                 with a page pinned each while root writes twice the RAM tier, and holds a dead
                 writer's temporary files open: no forged hit, none of root's writes refused
                 ENOSPC, the files discarded at --temp-timeout, root's page readable; (issue 20)
                 lists a pool of 40,000 pages in a loop, sends 8 MiB exists queries from 4
                 processes and holds 100 of them, and temporary files nobody renames fill what
                 files being written may hold: no published page evicted; in both, none of the
                 other client's requests slower than 100 ms

Modes take turns, one chunk each, until every target is reached or the time is up; the model
mode runs alongside them in a second process (``--jobs 1``: in turn with them). Every mount
is made and removed with hicachefs_testing.mounting (daemons are stopped by PID). The exit status
is 1 if a target was not reached, a figure that must be zero is not, or a daemon logged an
unexpected error. Needs root (FUSE, and loop devices for the dying disk).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from hicachefs.control.exists import MAX_EXISTS_REQUEST
from hicachefs_testing import attacks, mixed_load, mounting, pin_attacks, scenarios
from hicachefs_testing.store_faults import CORRUPTIONS, RoundFigures, corruption_round, device_fault_round
from hicachefs_testing.workload import exists_raw, serving


@dataclass
class Row:
    """One line of the table: what a mode counts, how far it got, what must stay zero."""

    counted: str
    target: int
    done: int = 0
    chunks: int = 0
    seconds: float = 0.0
    bad: Counter = field(default_factory=Counter)  # figures that must be zero, by name
    facts: Counter = field(default_factory=Counter)  # other figures worth showing

    @property
    def finished(self) -> bool:
        return self.done >= self.target


class Mounts:
    """``mount_fn`` for the scenarios: every mount is remembered and stopped by ``close``."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.mounts: list[mounting.Mount] = []

    def __call__(self, *flags: str, path: Path | None = None) -> mounting.Mount:
        index = len(self.mounts)
        mount = mounting.start(path or self.workdir / f"mnt{index}", self.workdir / f"daemon{index}.log", list(flags))
        self.mounts.append(mount)
        return mount

    def close(self) -> list[str]:
        problems = []
        for mount in self.mounts:
            mounting.stop(mount)
            problems += mounting.unexpected_log_lines(mount)
        return problems


class Stress:
    """The modes, each run a chunk at a time by ``run_chunk``."""

    def __init__(self, workdir: Path, seed: int, scale: float, record: Path):
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.scale = scale
        self.record = record
        self.notes: list[str] = []
        self.rows = {
            "crash-wt": Row("SIGKILLs under write storms, --write-through", max(1, round(100 * scale))),
            "crash-wb": Row("SIGKILLs under write storms, write-back", max(1, round(10 * scale))),
            "corruption": Row("corruptions injected (all caught)", max(1, round(1000 * scale))),
            "model": Row("model-checked random operations", max(1, round(10_000 * scale))),
            "bad-input": Row("bad inputs, daemon still serving", max(1, round(10_000 * scale))),
            "device-faults": Row("device faults injected", max(1, round(1000 * scale))),
            "contention": Row("reads checked under 8-rank contention", max(1, round(1000 * scale))),
            "mixed": Row("reads checked among direct writers and renames", max(1, round(5000 * scale))),
            "plane": Row("pages read through the data plane under replaces, rm -r and eviction",
                          max(1, round(100_000 * scale))),
            "replaces": Row("pages read while another process replaces them", max(1, round(20_000 * scale))),
            "fetch-limits": Row("fetch requests at and over the limit", max(1, round(200 * scale))),
            "plain-user": Row("other clients' requests under a plain user's attacks",
                              max(1, round(20_000 * scale))),
        }
        self._chunk = Counter()
        self.chunk_s = min(20.0, max(2.0, 20.0 * scale))  # how long the timed modes' chunks run

    def run_chunk(self, mode: str) -> None:
        row = self.rows[mode]
        number = self._chunk[mode]
        self._chunk[mode] += 1
        workdir = self.workdir / f"{mode}-{number}"
        workdir.mkdir()
        mounts = Mounts(workdir)
        started = time.monotonic()
        try:
            getattr(self, "_" + mode.replace("-", "_"))(row, mounts, workdir, self.rng.getrandbits(32))
        except Exception as exc:  # a chunk that blew up is a failure to report, not to hide
            row.bad["chunks that failed"] += 1
            self.notes.append(f"{mode}: {type(exc).__name__}: {exc}")
        finally:
            for line in mounts.close()[:10]:
                row.bad["daemon errors logged"] += 1
                self.notes.append(f"{mode}: daemon log: {line}")
            row.chunks += 1
            row.seconds += time.monotonic() - started

    def _note(self, mode: str, examples) -> None:
        self.notes += [f"{mode}: {e}" for e in list(examples)[:5]]

    # ---- modes -------------------------------------------------------------------------

    def _crash(self, row: Row, mounts, workdir, seed, write_through: bool, rounds: int) -> None:
        figures = scenarios.crash_rounds(mounts, workdir, rounds=rounds, write_through=write_through, seed=seed,
                                         window=(0.05, 1.0), disk_size=512 << 20)
        row.done += figures.kills if not figures.unusable else 0
        row.facts["pages published"] += figures.published
        row.facts["pages checked"] += figures.pages_checked
        row.bad["acknowledged pages lost"] += figures.lost if write_through else 0
        row.bad["wrong bytes served"] += figures.corrupt + figures.stale
        row.bad["temporary files left"] += figures.temp_visible
        row.bad["unusable after restart"] += figures.unusable
        self._note("crash", figures.examples)

    def _crash_wt(self, row, mounts, workdir, seed) -> None:
        self._crash(row, mounts, workdir, seed, write_through=True, rounds=10)

    def _crash_wb(self, row, mounts, workdir, seed) -> None:
        self._crash(row, mounts, workdir, seed, write_through=False, rounds=5)

    def _corruption(self, row, mounts, workdir, seed) -> None:
        total = RoundFigures()
        for i in range(60):
            total.add(corruption_round(workdir, seed + i, CORRUPTIONS[(seed + i) % len(CORRUPTIONS)]))
        row.done += total.corruptions_injected
        row.facts["store rounds"] += 60
        row.facts["pages lost with a cut or a bad header"] += total.lost_by_design
        row.bad["not caught"] += total.corruptions_injected - total.corruptions_caught
        row.bad["wrong bytes served"] += total.inconsistencies
        row.bad["undamaged pages lost"] += total.bystanders_lost
        self._note("corruption", total.examples)
        if row.chunks >= 2:
            return
        # Twice, for realism: bytes flipped in the arena of a stopped daemon, then of a running one.
        mounted = scenarios.corruption_mounted if row.chunks else scenarios.corruption_unmounted
        daemon = mounted(mounts, workdir, seed=seed, victims=3)
        row.done += daemon.injected
        row.facts["through a daemon"] += daemon.injected
        row.bad["not caught"] += daemon.injected - min(daemon.caught, daemon.counted)
        row.bad["wrong bytes served"] += daemon.served_wrong
        row.bad["undamaged pages lost"] += daemon.bystanders_lost
        self._note("corruption", daemon.examples)

    def _model(self, row, mounts, workdir, seed) -> None:
        from hicachefs_testing.model import MountModel, run_seeded

        MountModel.record_to = self.record
        MountModel.remount_every, MountModel.pressure_every = 40, 15
        steps, error = run_seeded(seed, examples=1, steps=200)
        row.done += steps
        row.facts["seeds"] += 1
        if error is not None:
            row.bad["divergences"] += 1
            self.notes.append(f"model: seed {seed} failed (steps and error in {self.record}): {error[:300]}")

    def _bad_input(self, row, mounts, workdir, seed) -> None:
        mount = mounts("--memory", "64M")
        rng = random.Random(seed)
        tried, failures = scenarios.fuzz_names(mount.path, mount.page_dir(), rng, 2500)
        more, wrong_answers = scenarios.fuzz_exists(mount.path, rng, 2)
        over = 0
        for size in (MAX_EXISTS_REQUEST + 1, 2 * MAX_EXISTS_REQUEST):
            try:
                exists_raw(mount.path, b"\n" * size)
                wrong_answers.append(f"an exists request of {size} bytes was answered")
            except OSError as exc:
                if exc.errno != 27:  # EFBIG
                    wrong_answers.append(f"an exists request of {size} bytes: {exc}")
            over += 1
        row.done += tried + more + over
        row.bad["EIO answers"] += len(failures)
        row.bad["wrong exists answers"] += len(wrong_answers)
        if not (mounting.alive(mount.pid) and serving(mount.path)):
            row.bad["daemon stopped serving"] += 1
        self._note("bad-input", failures + wrong_answers)

    def _device_faults(self, row, mounts, workdir, seed) -> None:
        total = RoundFigures()
        for i in range(6):
            total.add(device_fault_round(workdir, seed + i))
        row.done += total.faults_injected
        row.facts["store operations"] += total.operations
        row.bad["older version back after a restart"] += total.resurrected
        row.bad["inconsistencies"] += total.inconsistencies
        self._note("device-faults", total.examples)
        dying = scenarios.dying_disk(mounts, workdir, write_through=row.chunks % 2 == 1, seed=seed)
        row.done += 1
        row.facts["disks that died under a daemon"] += 1
        row.facts["daemon I/O errors counted"] += dying.io_errors
        row.bad["inconsistencies"] += dying.ram_pages_wrong + dying.wrong_bytes + dying.misanswered
        row.bad["daemon stopped serving"] += not dying.still_serving
        self._note("dying disk", dying.examples)

    def _plain_user(self, row, mounts, workdir, seed) -> None:
        """Issue 29's attacks (``pin_attacks``) and issue 20's (``attacks``), a chunk each in turn."""
        reachable = Path(tempfile.mkdtemp(prefix="hicachefs-plain-user-"))  # workdir is 0700
        try:
            reachable.chmod(0o755)
            if row.chunks % 2 == 0:
                (reachable / "disk").mkdir()
                mount = mounts(*pin_attacks.FLAGS, "--disk", str(reachable / "disk"), path=reachable / "mnt")
            else:
                mount = mounts("--memory", "256M", path=reachable / "mnt")
            try:
                if row.chunks % 2 == 0:
                    self._pins(row, mount, seed)
                    return
                figures = attacks.plain_user_round(mount, 256 << 20)
            finally:
                mounting.stop(mount)  # before its directory goes; Mounts.close is then a no-op
        finally:
            shutil.rmtree(reachable, ignore_errors=True)
        row.done += figures["requests"]
        row.bad[f"requests slower than {attacks.SLOW_S * 1000:.0f} ms"] += figures["slow"]
        row.bad["published pages evicted"] += figures["evicted"]
        row.bad["temporary files refused other than ENOSPC"] += figures["files failed otherwise"]
        row.facts["attack rounds"] += figures["rounds"]
        row.facts["attack requests refused (ENOBUFS)"] += figures["refused"]
        row.facts["temporary files before ENOSPC"] += figures["files before ENOSPC"]
        row.facts["worst chunk's p99 (us)"] = max(row.facts["worst chunk's p99 (us)"], figures["p99_us"])

    def _pins(self, row, mount, seed) -> None:
        figures, examples = pin_attacks.pins_round(mount, seed, flood_rounds=max(5, min(50, round(50 * self.scale))))
        row.done += figures["requests"]
        row.bad[f"requests slower than {attacks.SLOW_S * 1000:.0f} ms"] += figures["slow"]
        for figure in ("forged hits", "root's writes refused ENOSPC", "root's writes failed otherwise",
                       "dead writer's files pending past the timeout", "dead writer's files failed otherwise",
                       "root's pages unreadable"):
            row.bad[figure] += figures[figure]
        for figure, value in figures.items():
            if figure.startswith("attack requests refused"):
                row.facts[figure] += value
        for figure in ("attack rounds", "fetch handles held", "dead writer's temporary files",
                       "held files read after their discard (EIO)", "root's pages written"):
            row.facts[figure] += figures[figure]
        row.facts["worst chunk's p99 (us)"] = max(row.facts["worst chunk's p99 (us)"], figures["p99_us"])
        self._note("plain-user", examples)

    def _contention(self, row, mounts, workdir, seed) -> None:
        mount = mounts("--memory", "64M")
        totals = scenarios.contention(mount.path, ranks=8, seconds=20, seed=seed)
        row.done += totals.get("reads", 0)
        row.facts["writes"] += totals.get("writes", 0)
        row.bad["torn or foreign reads"] += totals.get("bad", 0)
        row.bad["I/O errors"] += totals.get("errors", 0)
        self._note("contention", totals["examples"])

    def _mixed(self, row, mounts, workdir, seed) -> None:
        mount = mounts("--memory", "64M", "--disk", str(workdir / "disk"), "--disk-size", "512M")
        totals = mixed_load.run(mount.path, workdir, seconds=20, seed=seed)
        row.done += totals.get("reads", 0)
        for figure in ("direct writes", "renames", "direct writes replaced while written", "reads answered EIO"):
            row.facts[figure] += totals.get(figure, 0)
        for figure in ("torn", "stale", "zeros", "unexpected errors", "workers failed"):
            row.bad[figure] += totals.get(figure, 0)
        self._note("mixed", totals["examples"])

    def _plane(self, row, mounts, workdir, seed) -> None:
        from hicachefs_testing import plane_load  # imports torch and the client

        mount = mounts(*plane_load.FLAGS, "--disk", str(workdir / "disk"))
        counts, examples = plane_load.run(mount, self.chunk_s, seed)
        row.done += counts["reads"]
        for figure in ("hits", "plane reads", "plane retries", "replaces", "pool directories removed",
                       "demotions", "evictions", "exists_calls"):
            row.facts[figure.replace("_", " ")] += counts[figure]
        for figure in ("torn", "stale", "foreign", "threads failed", "rm -r failed"):
            row.bad[figure] += counts[figure]
        self._note("plane", examples)

    def _replaces(self, row, mounts, workdir, seed) -> None:
        from hicachefs_testing import replace_load  # imports torch and the client

        mount = mounts("--memory", "64M")
        counts, examples = replace_load.run(mount, workdir, self.chunk_s, seed)
        row.done += counts["plane reads"] + counts["fetch reads"] + counts["file reads"]
        for figure in ("ingest replaces", "rename replaces", "plane reads", "fetch reads", "file reads",
                       "plane retries"):
            row.facts[figure] += counts[figure]
        for figure, value in counts.items():
            if figure in ("torn", "foreign", "readers failed") or figure.startswith("stale through"):
                row.bad[figure] += value
        self._note("replaces", examples)

    def _fetch_limits(self, row, mounts, workdir, seed) -> None:
        from hicachefs_testing import fetch_limits

        mount = mounts("--memory", "256M")
        rounds = max(1, min(20, round(100 * self.chunk_s / 20)))
        counts, examples = fetch_limits.run(mount, rounds, seed, client=row.chunks % 4 == 0)
        row.done += counts["requests"]
        for figure, value in counts.items():
            if "pages answered" in figure or figure in (
                    "at the limit: answered short", "over the limit: taken", "over the limit: answered",
                    "over the limit: writes taken after the refusal", "handles not serving again",
                    "held at the limit: taken, then not answered", "held at the limit: refused, then answered",
                    "stored pages not read by batch_get_v1"):
                row.bad[figure] += value
            elif figure != "requests":
                row.facts[figure] += value
        if not (mounting.alive(mount.pid) and serving(mount.path)):
            row.bad["daemon stopped serving"] += 1
        self._note("fetch-limits", examples)


def table(rows: dict[str, Row], elapsed: float) -> str:
    lines = [["mode", "what is counted", "done", "target", "must be 0", "min"]]
    for mode, row in rows.items():
        bad = ", ".join(f"{v} {k}" for k, v in row.bad.items() if v) or "0"
        lines.append([mode, row.counted, f"{row.done:,}", f"{row.target:,}", bad, f"{row.seconds / 60:.1f}"])
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths)))
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    out.append(f"total {elapsed / 60:.1f} minutes")
    for mode, row in rows.items():
        if row.facts:
            out.append(f"  {mode}: " + ", ".join(f"{k} {v:,}" for k, v in row.facts.items()))
    return "\n".join(out)


def run_modes(stress: Stress, modes: list[str], started: float, deadline: float) -> None:
    """Chunks of each unfinished mode in turn, until all are finished or the time is up."""
    while time.monotonic() < deadline:
        todo = [mode for mode in modes if not stress.rows[mode].finished]
        if not todo:
            return
        for mode in todo:
            if time.monotonic() >= deadline:
                return
            stress.run_chunk(mode)
            row = stress.rows[mode]
            print(f"  {mode} #{row.chunks}: {row.done:,} of {row.target:,} ({time.monotonic() - started:.0f} s)",
                  flush=True)


def start_model_job(args, workdir: Path) -> tuple[subprocess.Popen, Path, Path]:
    """The model mode in a process of its own, alongside the others (it waits on mounts and
    remounts more than it computes, so two jobs finish sooner on two cores)."""
    summary, log = workdir / "model-job.json", workdir / "model-job.log"
    command = [sys.executable, __file__, "--modes", "model", "--jobs", "1", "--minutes", str(args.minutes),
               "--seed", str(args.seed + 1), "--scale", str(args.scale), "--record", str(args.record.resolve()),
               "--summary", str(summary)]
    with open(log, "w") as out:
        return subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT), summary, log


def join_model_job(job, summary: Path, log: Path, stress: Stress, deadline: float) -> None:
    try:
        job.wait(timeout=max(60.0, deadline - time.monotonic() + 600))
    except subprocess.TimeoutExpired:
        job.kill()
        job.wait()
    print("  model job:\n" + "".join(f"  {line}" for line in log.read_text().splitlines(True)
                                       if line.startswith("  model #")), flush=True)
    if not summary.exists():
        stress.rows["model"].bad["chunks that failed"] += 1
        stress.notes.append(f"model: the model job ended without a summary (exit {job.returncode}); see its log")
        return
    data = json.loads(summary.read_text())
    stress.rows["model"] = Row(**{**data["row"], "bad": Counter(data["row"]["bad"]),
                                  "facts": Counter(data["row"]["facts"])})
    stress.notes += data["notes"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="time budget (default 30)")
    parser.add_argument("--modes", default=None, help="comma-separated subset of the modes (default all)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every target (default 1)")
    parser.add_argument("--record", type=Path, default=Path("stress-model-failures.txt"),
                        help="where a failing model run's steps are written (default ./stress-model-failures.txt)")
    parser.add_argument("--jobs", type=int, choices=(1, 2), default=2,
                        help="2 (default): the model mode runs in a second process alongside the others")
    parser.add_argument("--summary", type=Path, help=argparse.SUPPRESS)  # a model job's figures, as JSON
    parser.add_argument("--json", type=Path, help="also write every row's figures here, as JSON")
    args = parser.parse_args()
    # The store warns about each fault the rounds inject; a count of errors is what matters here.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    started = time.monotonic()
    deadline = started + args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="hicachefs-stress-") as tmp:
        stress = Stress(Path(tmp), args.seed, args.scale, args.record.resolve())
        modes = [m.strip() for m in args.modes.split(",")] if args.modes else list(stress.rows)
        unknown = set(modes) - set(stress.rows)
        if unknown:
            parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
        stress.rows = {mode: stress.rows[mode] for mode in modes}
        print(f"seed {args.seed}; modes {', '.join(modes)}; at most {args.minutes:g} minutes; "
              f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", flush=True)
        job = None
        if args.jobs == 2 and "model" in modes and len(modes) > 1:
            job = start_model_job(args, Path(tmp))
        run_modes(stress, [m for m in modes if job is None or m != "model"], started, deadline)
        if job is not None:
            join_model_job(*job, stress, deadline)
    if args.summary:
        row = stress.rows["model"]
        args.summary.write_text(json.dumps({"row": {**vars(row), "bad": dict(row.bad), "facts": dict(row.facts)},
                                            "notes": stress.notes}))
    if args.json:
        args.json.write_text(json.dumps({mode: {**vars(row), "bad": dict(row.bad), "facts": dict(row.facts)}
                                         for mode, row in stress.rows.items()} | {"notes": stress.notes}))
    print(f"\nload at the end {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print(table(stress.rows, time.monotonic() - started))
    short = [mode for mode, row in stress.rows.items() if not row.finished]
    bad = sum(sum(row.bad.values()) for row in stress.rows.values())
    if stress.notes:
        print("\nproblems:")
        for note in stress.notes[:50]:
            print("  " + note)
    if short:
        print(f"\ntargets not reached in {args.minutes:g} minutes: {', '.join(short)}")
    return 1 if short or bad or stress.notes else 0


if __name__ == "__main__":
    sys.exit(main())
