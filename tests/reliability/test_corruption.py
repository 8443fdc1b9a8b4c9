"""Bytes flipped in the SSD arena file, with the daemon stopped and while it runs: a damaged
page is never served; it is dropped or fails with EIO, and stats count it."""

from __future__ import annotations

import pytest

from hicachefs_testing.scenarios import corruption_mounted, corruption_unmounted


def _report(figures) -> str:
    return "\n".join([str({k: v for k, v in vars(figures).items() if k != "examples"}), *figures.examples])


@pytest.mark.parametrize("scenario, seed", [
    (corruption_unmounted, 1),  # flipped while unmounted: caught at mount or at read
    (corruption_mounted, 2),  # flipped under a running daemon: a disk-only page is never served
])
def test_flipped_bytes_on_disk_are_never_served(mount_factory, tmp_path, scenario, seed):
    figures = scenario(mount_factory, tmp_path, seed=seed, victims=3)
    print(_report(figures))
    assert figures.injected == 3, _report(figures)
    assert figures.served_wrong == 0, _report(figures)
    assert figures.caught == 3, _report(figures)
    assert figures.counted >= 3, _report(figures)
    assert figures.bystanders_lost == 0, _report(figures)
