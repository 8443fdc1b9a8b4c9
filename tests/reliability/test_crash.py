"""SIGKILL of the daemon during write storms from several processes, then a remount on the
same disk tier: nothing acknowledged is lost where the mode promises it, nothing is corrupt,
no temporary file survives, and the store is usable at once."""

from __future__ import annotations

import os

import pytest

from hicachefs_testing.scenarios import crash_rounds

SEED = int(os.environ.get("HICACHEFS_TEST_SEED", "7"))


def _report(figures) -> str:
    return "\n".join([str({k: v for k, v in vars(figures).items() if k != "examples"}), *figures.examples])


def test_write_through_keeps_every_acknowledged_page_across_kills(mount_factory, tmp_path):
    figures = crash_rounds(mount_factory, tmp_path, rounds=4, write_through=True, seed=SEED)
    print(_report(figures))
    assert figures.kills == 4 and figures.runs == 4
    assert figures.published > 50, "the storm published too little to test anything"
    assert figures.promised_checked >= figures.published // 2
    assert (figures.lost, figures.corrupt, figures.stale, figures.temp_visible, figures.unusable) == (0, 0, 0, 0, 0), \
        _report(figures)


def test_write_back_never_serves_a_corrupt_page_after_kills(mount_factory, tmp_path):
    figures = crash_rounds(mount_factory, tmp_path, rounds=3, write_through=False, seed=SEED + 1,
                           window=(0.8, 2.5))
    print(_report(figures))
    assert figures.kills == 3
    assert figures.published > 50
    assert figures.pages_checked > 0, "nothing reached the disk tier: the RAM tier was not under pressure"
    assert (figures.corrupt, figures.stale, figures.temp_visible, figures.unusable) == (0, 0, 0, 0), _report(figures)
