"""Where the shared tier keeps things under its root directory.

A page ``<model>/<format>/<shard>/<pool>/<key>`` lives at
``<root>/<model>/<format>/<shard>/<pool>/<fan>/<key>``: the namespace, then one fan-out
directory of 256, named by the top byte of the key's xxh3_64 (two hex digits), so that no
directory grows past a few hundred thousand names even at hundreds of millions of pages per
pool (SGLang's flat-directory file backend hit ext4's per-directory limit at ~7.5 M files).
A hash rather than the key's own first characters: keys need not be hex, and any key spreads
evenly. The same hash identifies the page in the presence index.

Temporary files are ``.<key>.<writer>.<n>`` beside their page (a rename within one directory;
``<writer>`` a writer's hex token), and the hosts' announcement journals live in
``<root>/.journal``. Names starting with ``.`` are never pages: the namespace refuses them. The
tier removes no file of the directory that is neither (the directory may be shared with other
data: a volume's root, say).

Pure functions and an immutable class; thread-safe.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import xxhash

JOURNAL_DIR = ".journal"
_TEMPORARY = re.compile(r"\.(?P<key>.+)\.[0-9a-f]+\.[0-9]+")  # ``temp_path``'s file names
FANOUT_NAMES = frozenset(f"{byte:02x}" for byte in range(256))
#: Parts of a fan-out directory's relative path: ``<model>/<format>/<shard>/<pool>/<fan>``.
FANOUT_DEPTH = 5


class Place(NamedTuple):
    """A page's directory (relative to the root, fan-out included), its key and key hash."""

    directory: str
    key: str
    key_hash: int


def key_hash(key: str) -> int:
    return xxhash.xxh3_64_intdigest(key.encode("utf-8", "surrogateescape"))


def fanout_name(hashed: int) -> str:
    return f"{hashed >> 56:02x}"


def place(name: str) -> Place:
    parent, _, key = name.rpartition("/")
    hashed = key_hash(key)
    fan = fanout_name(hashed)
    return Place(f"{parent}/{fan}" if parent else fan, key, hashed)


def is_fanout(directory: str) -> bool:
    """Whether ``directory`` (relative) is a pool's fan-out directory: two hex digits at the
    namespace's depth. A directory so named elsewhere (``backup/2a``) is none of the tier's."""
    parts = directory.split("/")
    return len(parts) == FANOUT_DEPTH and parts[-1] in FANOUT_NAMES


def page_name(directory: str, key: str) -> str | None:
    """The page name a file ``key`` in ``directory`` (relative) stands for, or None when the
    file is not a page in its right place (a temporary file, a stray, a misplaced file)."""
    parent, _, fan = directory.rpartition("/")
    if key.startswith(".") or not is_fanout(directory) or fanout_name(key_hash(key)) != fan:
        return None
    return f"{parent}/{key}" if parent else key


def is_temporary(directory: str, name: str) -> bool:
    """Whether file ``name`` in ``directory`` (relative) is a temporary file of this layout: a
    writer's page under way (``Layout.temp_path``), beside where that page goes."""
    match = _TEMPORARY.fullmatch(name)
    return match is not None and page_name(directory, match["key"]) is not None


class Layout:
    """Absolute paths under one root directory."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root)
        self.journal = os.path.join(self.root, JOURNAL_DIR)

    def directory(self, relative: str) -> str:
        return os.path.join(self.root, relative) if relative else self.root

    def page_path(self, where: Place) -> str:
        return os.path.join(self.root, where.directory, where.key)

    def temp_path(self, where: Place, writer: str, number: int) -> str:
        return os.path.join(self.root, where.directory, f".{where.key}.{writer}.{number}")
