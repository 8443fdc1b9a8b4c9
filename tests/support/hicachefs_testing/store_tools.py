"""What the tests and the store benchmark do to a store that the daemon never does."""

from __future__ import annotations

import os

from hicachefs.store import PageStore
from hicachefs.store.ssd.ssd_tier import ARENA_NAME


def delete_tree(store: PageStore, prefix: str) -> int:
    """Delete every page under directory ``prefix``; how many there were."""
    under = [d for d in store.directories() if d == prefix or d.startswith(prefix + "/")]
    return sum(store.delete(info.name) for directory in under for info in list_all(store, directory))


def list_all(store: PageStore, directory: str) -> list:
    """Every page ``store.list_dir`` gives for ``directory``, batch after batch (PageInfos)."""
    infos, after = [], 0
    while batch := store.list_dir(directory, after):
        infos += [info for _, info in batch]
        after = batch[-1][0]
    return infos


def private_room_for(store: PageStore, size: int) -> bool:
    """Whether readers' own copies of lower-tier pages (``private_reads``) leave room for ``size``
    more: past it a read is refused until a copy is let go, so a caller holding readers lets go first."""
    share = store.statistics().ram_budget.shares["private_reads"]
    return share.held_bytes + size <= share.limit_bytes


def drop_disk_cache(store: PageStore) -> None:
    """Evict the store's disk arena from the kernel's page cache, so the next reads are cold."""
    path = os.path.join(store.config.disk_dir, ARENA_NAME)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)  # dirty pages are not evicted: write them back first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
