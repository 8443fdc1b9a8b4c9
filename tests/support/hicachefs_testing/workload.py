"""Checkable page content and the small probes the tests share: the one place for page bytes
and for asking the exists query.

``content(seed, size)`` is every test's deterministic page bytes: the same for the same seed,
different for another, so a page served in another's place shows.

Every page the reliability tests write is ``labelled_content(key, size, writer, gen)``: a
64-byte label naming the key, the writer, a generation and the size, then ``content`` seeded by
all four. So any page read back can be checked on its own (``identify``): the label says which
write it claims to be, the rest must be exactly that write's bytes. A torn page, a page of
another key or another writer, or a flipped byte cannot pass.

The exists query (docs/contract.md, ``.hicachefs/exists``): ``exists_query`` asks about paths on a
handle of its own, ``ask_exists`` on an open one (``exists_handle``); ``exists_raw`` sends any
bytes and reads the whole answer, ``send_exists`` and ``exists_answer`` are its two halves
(from ``plain_user``, whose programs use them with the standard library alone).

Used by the tests and by ``scripts/stress.py``; also imported by ``storm_worker`` and the
tests' helper processes, which run without pytest.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hicachefs_testing.plain_user import exists_answer, send_exists

HEADER_BYTES = 64
_MAGIC = b"HCRT"


def content(seed: int | str, size: int) -> bytes:
    """``size`` deterministic bytes for ``seed``: distinct seeds give distinct bytes (beyond size 0)."""
    if isinstance(seed, str):
        seed = int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "little")
    if size == 0:  # (a generator costs some 30 us to make: pages no longer than a header are many)
        return b""
    return np.random.default_rng(seed).bytes(size)


def labelled_content(key: str, size: int, writer: int = 0, gen: int = 0) -> bytes:
    """The one valid content of write ``gen`` of ``key`` by ``writer`` (``size`` bytes)."""
    full = b"%s|%d|%d|%d|%s" % (_MAGIC, writer, gen, size, key.encode())
    header = full[:HEADER_BYTES].ljust(HEADER_BYTES, b"\0")
    # Seeded by the whole key: a long key (64 hex chars) does not fit in the header.
    seed = int.from_bytes(hashlib.blake2b(full, digest_size=8).digest(), "little")
    return (header + content(seed, max(0, size - HEADER_BYTES)))[:size]


@dataclass(frozen=True)
class Identity:
    writer: int
    gen: int
    size: int


def identify(data: bytes, key: str) -> Identity | None:
    """Which write of ``key`` these bytes are, or None if they are no whole write of ``key``.

    Pages shorter than the header cannot name themselves; they are checked by size alone
    against writer 0, generation 0.
    """
    if len(data) < HEADER_BYTES:
        return Identity(0, 0, len(data)) if data == labelled_content(key, len(data)) else None
    who = claimed(data, key)
    if who is None or who.size != len(data) or data != labelled_content(key, who.size, who.writer, who.gen):
        return None
    return who


def claimed(data: bytes, key: str) -> Identity | None:
    """Which write of ``key`` the label at the start of ``data`` names (the bytes after it are
    not checked), or None if it names none."""
    fields = data[:HEADER_BYTES].rstrip(b"\0").split(b"|", 4)
    if len(data) < HEADER_BYTES or len(fields) != 5 or fields[0] != _MAGIC:
        return None
    try:
        writer, gen, size = int(fields[1]), int(fields[2]), int(fields[3])
    except ValueError:
        return None
    expected_key = (b"%s|%d|%d|%d|%s" % (_MAGIC, writer, gen, size, key.encode()))[:HEADER_BYTES]
    if data[:HEADER_BYTES].rstrip(b"\0") != expected_key.rstrip(b"\0"):
        return None
    return Identity(writer, gen, size)


def read_whole(path: Path, chunk: int = 128 << 10) -> bytes:
    """Read a file through one open handle, in FUSE-sized pieces (so tearing would show)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts, offset = [], 0
        while piece := os.pread(fd, chunk, offset):
            parts.append(piece)
            offset += len(piece)
        return b"".join(parts)
    finally:
        os.close(fd)


def publish(pool: Path, key: str, data: bytes, tmp_name: str | None = None) -> None:
    """The client's publish: temporary ``.name``, ftruncate (size hint), pwritev, close, rename."""
    tmp = pool / (tmp_name or f".{os.urandom(8).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.ftruncate(fd, len(data))
        view, offset = memoryview(data), 0
        while offset < len(view):
            offset += os.pwritev(fd, [view[offset : offset + (1 << 20)]], offset)
    finally:
        os.close(fd)
    os.rename(tmp, pool / key)


def fill_writing_share(directory: Path, size: int) -> list[Path]:
    """Unrenamed temporary files of ``size`` bytes in ``directory``, closed (the store keeps
    them until ``--temp-timeout``), written until one is refused with ENOSPC: then the files
    being written hold all the RAM they may. Their paths, the refused one's too."""
    paths = []
    for i in range(4096):
        paths.append(directory / f".held-{i}")
        fd = os.open(paths[-1], os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, size)
            os.write(fd, os.urandom(size))
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
            return paths
        finally:
            os.close(fd)
    raise AssertionError(f"{len(paths)} temporary files were all accepted")


def ask_exists(fd: int, paths: list[str]) -> str:
    """Ask an open exists handle about page paths (relative to the root): one '0' or '1' each,
    read up to the answer's newline (so the handle can take the next request)."""
    send_exists(fd, "".join(p + "\n" for p in paths).encode())
    answer = b""
    while not answer.endswith(b"\n"):
        piece = os.read(fd, len(paths) + 1 - len(answer) or 1)
        if not piece:
            break
        answer += piece
    return answer.decode().rstrip("\n")


@contextlib.contextmanager
def exists_handle(root: Path, name: str = "exists") -> Iterator[int]:
    """A handle of the mount's ``.hicachefs/exists`` (its file descriptor; ``name``: under
    another of its names), closed after."""
    fd = os.open(root / ".hicachefs" / name, os.O_RDWR)
    try:
        yield fd
    finally:
        os.close(fd)


def exists_raw(root: Path, request: bytes) -> bytes:
    """Send ``request`` (any bytes) to ``.hicachefs/exists``; the whole answer, to EOF."""
    with exists_handle(root) as fd:
        send_exists(fd, request)
        return exists_answer(fd)


def exists_query(root: Path, paths: list[str]) -> str:
    """Ask ``.hicachefs/exists`` about page paths (relative to the root); one '0'/'1' each."""
    with exists_handle(root) as fd:
        return ask_exists(fd, paths)


def tier_counter(stats: dict, field: str) -> int:
    """A counter summed over the tiers, whichever way the stats JSON nests them
    (``{"tiers": {"memory": {...}}}`` or ``{"memory": {...}, "disk": {...}}``)."""
    tiers = stats.get("tiers") or {k: v for k, v in stats.items() if k in ("memory", "disk")}
    return sum(int(t.get(field, 0)) for t in tiers.values())


def page_files(root: Path) -> dict[str, Path]:
    """Every file in every pool directory of a mount, by relative path (hidden names included)."""
    found: dict[str, Path] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if rel == "." and ".hicachefs" in dirnames:
            dirnames.remove(".hicachefs")
        for name in filenames:
            found[os.path.normpath(os.path.join(rel, name))] = Path(dirpath, name)
    return found


def errno_of(call, *args) -> int:
    """Run ``call(*args)``; 0 if it succeeded, else the errno it failed with."""
    try:
        call(*args)
    except OSError as exc:
        return exc.errno or -1
    return 0


def read_or_errno(path: Path) -> bytes | int:
    try:
        return read_whole(path)
    except OSError as exc:
        return exc.errno or -1


def serving(root: Path) -> bool:
    """The daemon answers: a page can be published and read back, stats can be read."""
    pool = root / "health" / "f" / "all" / "kv"
    pool.mkdir(parents=True, exist_ok=True)
    key = f"probe-{os.urandom(4).hex()}"
    data = labelled_content(key, 8192)
    publish(pool, key, data)
    ok = read_whole(pool / key) == data
    os.unlink(pool / key)
    (root / ".hicachefs" / "stats").read_bytes()
    return ok


def find_all(path: Path, needle: bytes) -> list[int]:
    """Offsets of ``needle`` in a (large) file."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        hits, at = [], m.find(needle)
        while at >= 0:
            hits.append(at)
            at = m.find(needle, at + 1)
        return hits


def flip_bytes(path: Path, offset: int, count: int = 1) -> None:
    """Invert ``count`` bytes of a file at ``offset`` (through the page cache, as a bad block
    seen by a running daemon would be)."""
    fd = os.open(path, os.O_RDWR)
    try:
        old = os.pread(fd, count, offset)
        os.pwrite(fd, bytes(b ^ 0xFF for b in old), offset)
    finally:
        os.close(fd)


GONE = (errno.ENOENT, errno.EIO)
