"""The page files of a store as SGLang's backends lay them out, found and removed by name.

HiCacheFS: ``<mount>/<model>/<format>/<shard>/<pool>/<key>`` (docs/contract.md, "Namespace").
HiCacheFile: ``<dir>/<key>[.<pool>]_<model>_<tp rank>_<tp size>.bin`` (no pool for KV).
Removing a page on a mount is ``rm``, which evicts it. Not thread-safe against a writer of the
same store; callers use it between phases, when SGLang's threads are quiet.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable


@dataclass(frozen=True)
class StoredPage:
    """Whose page a file is: the shard (HiCacheFS's segment, e.g. ``tp1of2``; HiCacheFile's
    suffix, ``<model>_<tp rank>_<tp size>``, or ``<model>`` for replicated MLA KV), the pool
    and the key."""

    shard: str
    pool: str
    key: str


def stored_pages(store: Path) -> Dict[Path, StoredPage]:
    """Every page file in a HiCacheFS mount or a HiCacheFile directory."""
    pages = {}
    for path in store.rglob("*"):
        if not path.is_file() or path.name.startswith("."):
            continue
        if path.suffix == ".bin":
            name, _, suffix = path.name[:-len(".bin")].partition("_")
            key, _, pool = name.partition(".")
            pages[path] = StoredPage(suffix, pool or "kv", key)
        else:
            pages[path] = StoredPage(path.parent.parent.name, path.parent.name, path.name)
    return pages


def remove_pages(store: Path, pool: str, keys: Iterable[str], shard: str = "") -> int:
    """Remove the pages ``keys`` of ``pool`` (of one ``shard`` when given, as ``stored_pages``
    names it) from a store; how many files went."""
    wanted = set(keys)
    removed = 0
    for path, page in stored_pages(store).items():
        if page.pool == pool and page.key in wanted and shard in ("", page.shard):
            path.unlink()
            removed += 1
    return removed
