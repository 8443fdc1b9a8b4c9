"""The daemon on a disk that dies under it: a real block device (ext4 on a loop device) whose
every read and write starts failing while the daemon runs. The daemon keeps serving from RAM:
RAM pages read back exactly, new pages are published (write-back) or refused with EIO
(write-through, which promises the disk copy), pages that were only on the dead disk fail with
EIO or are gone, never wrong bytes, and the failures are counted."""

from __future__ import annotations

from hicachefs_testing.scenarios import dying_disk


def _report(figures) -> str:
    return "\n".join([str({k: v for k, v in vars(figures).items() if k != "examples"}), *figures.examples])


def test_write_back_keeps_serving_from_ram_while_the_disk_fails(mount_factory, tmp_path):
    figures = dying_disk(mount_factory, tmp_path, write_through=False)
    assert figures.ram_pages_checked >= 8 and figures.ram_pages_wrong == 0, _report(figures)
    assert figures.disk_pages_failed >= 16, _report(figures)  # read from the dead device: EIO
    assert figures.wrong_bytes == 0 and figures.misanswered == 0, _report(figures)
    assert figures.published_after == 32, _report(figures)  # RAM cannot write down: it evicts instead
    assert figures.io_errors >= figures.disk_pages_failed and figures.eio_answers >= figures.disk_pages_failed, \
        _report(figures)
    assert figures.still_serving, _report(figures)


def test_write_through_refuses_new_pages_with_eio_and_serves_the_old_ones(mount_factory, tmp_path):
    figures = dying_disk(mount_factory, tmp_path, write_through=True)
    assert figures.ram_pages_checked == 12 and figures.ram_pages_wrong == 0, _report(figures)
    assert figures.refused == 32 and figures.misanswered == 0 and figures.wrong_bytes == 0, _report(figures)
    assert figures.io_errors >= 32 and figures.eio_answers >= 32, _report(figures)
    assert figures.still_serving, _report(figures)
