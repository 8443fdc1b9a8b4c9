#!/usr/bin/env python3
"""Longer reliability runs with the machinery of tests/reliability, and a table of figures.

    .venv/bin/python scripts/stress.py [--minutes 10] [--modes crash-wt,crash-wb,...] [--seed N]

Modes (run in turn until the time is up, each at least once):
  crash-wt     write storms from several processes, SIGKILL of the daemon, remount on the same
               disk tier, --write-through: every acknowledged page must come back bit-exact
  crash-wb     the same without --write-through: nothing corrupt, no temporary file survives
  corruption   bytes flipped in the arena file while unmounted and while mounted
  contention   8 processes writing and reading shared and per-rank pages
  bad-input    random names and 10 MB malformed exists requests
  model        the Hypothesis stateful test, with more examples (runs pytest)

Every mount is made and removed by tests/mounting.py; daemons are stopped by PID. The exit
status is 1 if any figure that must be zero is not, or a daemon logged an unexpected error.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "reliability"))

from hicachefs.testing import mounting  # noqa: E402
import scenarios  # noqa: E402
from workload import serving  # noqa: E402

MODES = ["crash-wt", "crash-wb", "corruption", "contention", "bad-input", "model"]
COLUMNS = ["runs", "kills survived", "pages checked", "corruptions injected", "corruptions caught",
           "inputs tried", "pages lost", "wrong bytes served"]


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


def run_mode(mode: str, workdir: Path, seed: int, figures: dict, notes: list[str]) -> None:
    mounts = Mounts(workdir)
    row = figures.setdefault(mode, dict.fromkeys(COLUMNS, 0))
    try:
        if mode in ("crash-wt", "crash-wb"):
            result = scenarios.crash_rounds(mounts, workdir, rounds=6, write_through=mode == "crash-wt", seed=seed,
                                            window=(0.05, 2.5), disk_size=512 << 20)
            row["runs"] += result.runs
            row["kills survived"] += result.kills if not result.unusable else 0
            row["pages checked"] += result.pages_checked
            row["pages lost"] += result.lost
            row["wrong bytes served"] += result.corrupt + result.stale + result.temp_visible
            notes += [f"{mode}: {e}" for e in result.examples]
            if result.unusable:
                notes.append(f"{mode}: store unusable after {result.unusable} restarts")
        elif mode == "corruption":
            for scenario in (scenarios.corruption_unmounted, scenarios.corruption_mounted):
                result = scenario(mounts, workdir, seed=seed, victims=3)
                row["runs"] += 1
                row["pages checked"] += result.pages_checked
                row["corruptions injected"] += result.injected
                row["corruptions caught"] += min(result.caught, result.counted)
                row["pages lost"] += result.bystanders_lost
                row["wrong bytes served"] += result.served_wrong
                notes += [f"{mode}: {e}" for e in result.examples]
        elif mode == "contention":
            mount = mounts("--memory", "64M")
            totals = scenarios.contention(mount.path, ranks=8, seconds=20, seed=seed)
            row["runs"] += 1
            row["pages checked"] += totals.get("reads", 0)
            row["wrong bytes served"] += totals.get("bad", 0)
            notes += [f"{mode}: {e}" for e in totals["examples"]]
            if totals.get("errors"):
                notes.append(f"{mode}: {totals['errors']} I/O errors")
        elif mode == "bad-input":
            mount = mounts("--memory", "64M")
            rng = random.Random(seed)
            tried, failures = scenarios.fuzz_names(mount.path, mount.page_dir(), rng, 500)
            more, exists_failures = scenarios.fuzz_exists(mount.path, rng, 5)
            row["runs"] += 1
            row["inputs tried"] += tried + more
            alive = mounting.alive(mount.pid) and serving(mount.path)
            row["wrong bytes served"] += len(exists_failures)
            notes += [f"{mode}: {f}" for f in (failures + exists_failures)[:10]]
            if failures:
                notes.append(f"{mode}: {len(failures)} of {tried} random-name requests answered EIO")
            if not alive:
                notes.append(f"{mode}: the daemon stopped serving")
        elif mode == "model":
            env = {**os.environ, "HICACHEFS_MODEL_EXAMPLES": "25", "HICACHEFS_MODEL_STEPS": "40",
                   "HICACHEFS_MODEL_RANDOM": "1"}
            result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                     str(ROOT / "tests" / "reliability" / "test_model_based.py")],
                                    cwd=ROOT, env=env, capture_output=True, text=True)
            row["runs"] += 25
            if result.returncode != 0:
                row["wrong bytes served"] += 1
                notes.append(f"model: {result.stdout[-1500:]}")
    except Exception as exc:  # a scenario that blew up is a failure to report, not to hide
        notes.append(f"{mode}: {type(exc).__name__}: {exc}")
        row["wrong bytes served"] += 1
    finally:
        notes += [f"{mode}: daemon log: {line}" for line in mounts.close()[:10]]


def table(figures: dict) -> str:
    rows = [["mode", *COLUMNS]] + [[mode, *(str(v) for v in row.values())] for mode, row in figures.items()]
    totals = ["total", *(str(sum(row[c] for row in figures.values())) for c in COLUMNS)]
    rows.append(totals)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths)) for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="time budget (default 10)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    parser.add_argument("--seed", type=int, default=int(time.time()))
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = set(modes) - set(MODES)
    if unknown:
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    print(f"seed {args.seed}; modes {', '.join(modes)}; {args.minutes:g} minutes", flush=True)
    figures: dict = {}
    notes: list[str] = []
    deadline = time.monotonic() + args.minutes * 60
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="hicachefs-stress-") as tmp:
        cycle = 0
        while cycle == 0 or time.monotonic() < deadline:
            for mode in modes:
                if cycle and time.monotonic() >= deadline:
                    break
                workdir = Path(tmp) / f"{mode}-{cycle}"
                workdir.mkdir()
                started = time.monotonic()
                run_mode(mode, workdir, rng.getrandbits(32), figures, notes)
                print(f"  {mode} #{cycle}: {time.monotonic() - started:.1f} s", flush=True)
            cycle += 1
    print()
    print(table(figures))
    must_be_zero = sum(row["pages lost"] + row["wrong bytes served"] for row in figures.values())
    missed = sum(row["corruptions injected"] - row["corruptions caught"] for row in figures.values())
    if notes:
        print("\nproblems:")
        for note in notes[:50]:
            print("  " + note)
    return 1 if must_be_zero or missed or notes else 0


if __name__ == "__main__":
    sys.exit(main())
