"""Bytes flipped in the SSD arena file, with the daemon stopped and while it runs: a damaged
page is never served; it is dropped or fails with EIO, and stats count it."""

from __future__ import annotations

from scenarios import corruption_mounted, corruption_unmounted


def _report(figures) -> str:
    return "\n".join([str({k: v for k, v in vars(figures).items() if k != "examples"}), *figures.examples])


def test_flipped_bytes_on_disk_while_unmounted_are_caught_at_mount(mount_factory, tmp_path):
    figures = corruption_unmounted(mount_factory, tmp_path, seed=1, victims=3)
    print(_report(figures))
    assert figures.injected == 3, _report(figures)
    assert figures.served_wrong == 0, _report(figures)
    assert figures.caught == 3, _report(figures)
    assert figures.counted >= 3, _report(figures)
    assert figures.bystanders_lost == 0, _report(figures)


def test_flipped_bytes_of_a_disk_page_while_mounted_are_never_served(mount_factory, tmp_path):
    figures = corruption_mounted(mount_factory, tmp_path, seed=2, victims=3)
    print(_report(figures))
    assert figures.injected == 3, _report(figures)
    assert figures.served_wrong == 0, _report(figures)
    assert figures.caught == 3, _report(figures)
    assert figures.counted >= 3, _report(figures)
    assert figures.bystanders_lost == 0, _report(figures)
