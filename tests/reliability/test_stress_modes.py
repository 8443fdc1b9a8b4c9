"""The stress modes of issues 28 and 29 (``plane``; ``replaces``, ``fetch-limits`` and the first
chunk of ``plain-user``, which is issue 29's attacks), each run at a small scale through ``scripts/stress.py``'s
own entry point (one run for all of them: the client's imports cost seconds once, not per
mode): every figure that must be 0 is, and each mode did the work it counts. The one timed
figure, another client's requests slower than 100 ms under the attacks, is the stress run's to
show (``scripts/stress.py`` at full scale), not this test's: here, beside the suite's other lane
on 2 cores, a probe descheduled for 100 ms measures the machine, not the daemon.

And the judge those modes trust (``versions``), shown to catch what it must: a stale, torn or
foreign page."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hicachefs_testing.versions import FOREIGN, STALE, TORN, VersionLog, verdict
from hicachefs_testing.workload import labelled_content

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "stress.py"
#: Per mode, the work figures (facts, or ``done``) that must be above 0.
WORK = {
    "plane": ["done", "hits", "plane reads", "replaces", "pool directories removed", "demotions"],
    "replaces": ["done", "ingest replaces", "rename replaces", "plane reads", "fetch reads", "file reads"],
    "fetch-limits": ["done", "at the limit: answered right", "over the limit: refused (EFBIG)",
                     "batch_get_v1 pages read right"],
    "plain-user": ["done", "attack rounds", "fetch handles held", "dead writer's temporary files"],
}


#: The figures that time another client's requests (see the module docstring).
TIMED = "requests slower than"


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("stress") / "rows.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--modes", ",".join(WORK), "--scale", "0.01",
                           "--minutes", "3", "--seed", "7", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ})
    print(done.stdout[-4000:], done.stderr[-2000:])
    assert out.exists(), f"the stress run wrote no figures (exit {done.returncode})"
    figures = json.loads(out.read_text())
    assert not figures["notes"], figures["notes"]  # the run's exit status also counts the timed figure
    return figures


@pytest.mark.parametrize("mode", list(WORK))
def test_a_stress_mode_keeps_its_must_be_0_figures_at_0_and_does_its_work(rows, mode):
    row = rows[mode]
    assert not {k: v for k, v in row["bad"].items() if v and not k.startswith(TIMED)}, row["bad"]
    assert row["done"] >= row["target"], row
    for figure in WORK[mode]:
        assert (row["done"] if figure == "done" else row["facts"].get(figure, 0)) > 0, (figure, row)


def test_the_judge_tells_stale_torn_and_foreign_pages():
    log = VersionLog()
    log.acked("k", 3, at_ns=100)
    log.acked("k", 5, at_ns=200)
    assert (log.floor("k", 50), log.floor("k", 150), log.floor("k", 300), log.floor("other", 300)) == (-1, 3, 5, -1)
    page = labelled_content("k", 4096, 0, 4)
    assert verdict(page, "k", 0, log.floor("k", 150)) is None
    assert verdict(page, "k", 0, log.floor("k", 300)) == STALE
    assert verdict(page[:100] + bytes(4096 - 100), "k", 0, -1) == TORN
    assert verdict(bytes(4096), "k", 0, -1) == TORN
    assert verdict(labelled_content("j", 4096, 0, 4), "k", 0, -1) == FOREIGN
    assert verdict(labelled_content("k", 4096, 1, 4), "k", 0, -1) == FOREIGN  # another pool's
