"""The disk tier's arena is ours alone: one store at a time holds it, and a file at its name that
is not a hicachefs arena (a symlink, another program's data, not a file at all) is refused and
left exactly as it was. An empty file, or one of our arenas of another size, is ours to format."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from hicachefs.store import PageStore, StoreConfig
from hicachefs.store.ssd.device import ArenaRefused
from hicachefs.store.ssd.ssd_tier import ARENA_NAME
from hicachefs_testing.workload import content
from store_helpers import MiB, read_all

DISK_BYTES = 32 * MiB


def config(disk: Path) -> StoreConfig:
    return StoreConfig(memory_bytes=4 * MiB, disk_dir=disk, disk_bytes=DISK_BYTES, max_page_size=1 * MiB)


def fingerprint(path: Path) -> tuple:
    """What must not change about a file we refuse: size, bytes, modification time."""
    status = os.stat(path)
    return status.st_size, hashlib.sha256(path.read_bytes()).hexdigest(), status.st_mtime_ns


def test_a_second_store_on_one_disk_directory_is_refused_while_the_first_is_open(tmp_path):
    first = PageStore(config(tmp_path))
    try:
        first.put("d/a", b"abc")
        with pytest.raises(ArenaRefused) as refused:
            PageStore(config(tmp_path))
        assert str(refused.value) == f"{tmp_path / ARENA_NAME} is in use by another hicachefs daemon (pid {os.getpid()})"
        assert read_all(first, "d/a") == b"abc"
    finally:
        first.close()
    second = PageStore(config(tmp_path))  # the lock went with the first store
    second.close()


@pytest.mark.parametrize("kind", ["zeros then data", "data", "larger than the tier", "text near the magic",
                                  "fixed-width lines near the magic"])
def test_a_foreign_file_is_refused_and_left_as_it_was(tmp_path, kind):
    """(A text starting ``HICACHE `` is 2 bits from the superblock's magic: taken for an arena
    whose superblock was damaged, it was formatted over; found by review. In lines of 64 bytes it
    is near the magic at both copies' places, 0 and 3584.)"""
    arena = tmp_path / ARENA_NAME
    data = {"zeros then data": bytes(4096) + content(1, 1 * MiB),
            "data": b"%PDF-1.7 precious" + content(2, 100_000),
            "larger than the tier": content(3, DISK_BYTES + MiB),
            "text near the magic": b"HICACHE notes: keep the disk tier on the NVMe\n" * 200,
            "fixed-width lines near the magic": b"".join(
                b"HICACHE record %048d\n" % i for i in range(1000))}[kind]
    arena.write_bytes(data)
    before = fingerprint(arena)
    with pytest.raises(ArenaRefused) as refused:
        PageStore(config(tmp_path))
    start = "its first 4 KiB are zeros" if kind == "zeros then data" else f"it starts with {data[:8].hex(' ')}"
    assert str(refused.value) == (f"{arena} is not a hicachefs disk arena (a file of {len(data):,} bytes; {start}): "
                                  "refusing to overwrite it")
    assert fingerprint(arena) == before


def test_a_symlinked_arena_is_refused_and_its_target_left_as_it_was(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(bytes(8 * MiB))  # zeros: what the old check took for an empty arena
    disk = tmp_path / "disk"
    disk.mkdir()
    (disk / ARENA_NAME).symlink_to(target)
    before = fingerprint(target)
    with pytest.raises(ArenaRefused) as refused:
        PageStore(config(disk))
    assert str(refused.value) == f"{disk / ARENA_NAME} is a symbolic link (to {target}): refusing to use it"
    assert fingerprint(target) == before and (disk / ARENA_NAME).is_symlink()


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_an_arena_that_is_not_a_file_is_refused(tmp_path, kind):
    arena = tmp_path / ARENA_NAME
    arena.mkdir() if kind == "directory" else os.mkfifo(arena)
    with pytest.raises(ArenaRefused) as refused:
        PageStore(config(tmp_path))
    what = "a directory" if kind == "directory" else "a FIFO"
    assert str(refused.value) == f"{arena} is {what}, not a file: refusing to use it"


def test_an_empty_file_is_formatted(tmp_path):
    (tmp_path / ARENA_NAME).touch()
    store = PageStore(config(tmp_path))
    try:
        store.put("d/a", b"abc")
    finally:
        store.close()
    assert os.path.getsize(tmp_path / ARENA_NAME) == DISK_BYTES
    store = PageStore(config(tmp_path))
    try:
        assert read_all(store, "d/a") == b"abc"
    finally:
        store.close()
