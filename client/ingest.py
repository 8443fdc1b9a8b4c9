"""Publishing a batch of pages through ``.hicachefs/ingest`` (docs/contract.md, "Publishing many pages
in one write"): its header in one write, its pages in one ``pwritev`` after it.

A batch is a 16-byte prefix, a header of ``<size> <path>\\n`` lines and the pages' bytes back to
back, written from offset 0; the kernel cuts each write into WRITE requests of up to 1 MiB, so a
page costs the daemon its bytes' share of a request instead of six requests of its own. The
header goes first on its own: the pages' WRITEs then start on a page (1 MiB pages: one WRITE
each), and it costs no request more than one write of everything (8 pages of 128 KiB: 2 WRITEs
either way). Each page is published once its last byte is in; a page already published at its
size is kept as it is (``KEEP_EXISTING``; one of another size is replaced), so the writer does
not ask first (two requests saved per batch). A write that stops short means a page failed: a
read of the handle says how many pages of the batch were published and why the next one failed,
and the rest is written again as a new batch.

Pure functions over a file descriptor the caller owns; thread-safe as long as each thread uses
its own descriptor (one handle holds one batch at a time).
"""

from __future__ import annotations

import errno
import os
import struct
from typing import List, Optional, Sequence

from . import vectored

MAGIC = b"HCFSPUT1"
_PREFIX = struct.Struct("<8sIHH")
# Flag: the daemon leaves pages already published as they are.
KEEP_EXISTING = 1
# Pages in one batch at most (the count is a uint16).
_MAX_PAGES = 0xFFFF


def encode_header(paths: Sequence[str], sizes: Sequence[int], flags: int = KEEP_EXISTING) -> bytes:
    lines = "".join(f"{size} {path}\n" for path, size in zip(paths, sizes)).encode("utf-8", "surrogateescape")
    return _PREFIX.pack(MAGIC, len(lines), len(paths), flags) + lines


class HandleLost(OSError):
    """The handle itself failed (its daemon is gone, or was restarted since it was opened), and
    so did every page of the batch left: a new handle may publish them."""


def publish_batch(fd: int, paths: Sequence[str], buffers: Sequence[Sequence[memoryview]],
                  sizes: Sequence[int]) -> List[Optional[OSError]]:
    """Publish page ``paths[i]`` from ``buffers[i]`` (``sizes[i]`` bytes in all), in as few
    writes as the kernel allows. Per page: None once published, else the error that stopped it."""
    outcome: List[Optional[OSError]] = [None] * len(paths)
    first = 0
    while first < len(paths):
        last = _batch_end(buffers, sizes, first)
        header = encode_header(paths[first:last], sizes[first:last])
        total = len(header) + sum(sizes[first:last])
        try:
            done = os.pwrite(fd, header, 0)
            if done == len(header):
                done += os.pwritev(fd, [b for page in buffers[first:last] for b in page], done)
        except OSError as exc:
            done, raised = -1, exc
        if done == total:
            first = last
            continue
        status = _status(fd)
        if status is None:  # the handle itself fails (a daemon gone): so does every page left
            error = (HandleLost(raised.errno, raised.strerror) if done < 0
                     else HandleLost(errno.EIO, "ingest write stopped short"))
            outcome[first:] = [error] * (len(paths) - first)
            break
        failed = first + status[0]
        if failed >= last:  # every page was published (the write only looked short): on from the next
            first = last
            continue
        outcome[failed] = OSError(status[1] or errno.EIO, os.strerror(status[1] or errno.EIO))
        first = failed + 1
    return outcome


def _batch_end(buffers: Sequence[Sequence[memoryview]], sizes: Sequence[int], first: int) -> int:
    """The end of the longest run of pages from ``first`` whose buffers one pwritev takes
    (``vectored.MAX_BUFFERS`` buffers, ``vectored.MAX_IO_BYTES`` bytes)."""
    count, total, end = 0, 0, first
    while end < len(buffers) and end - first < _MAX_PAGES and \
            ((count + len(buffers[end]) <= vectored.MAX_BUFFERS
              and total + sizes[end] <= vectored.MAX_IO_BYTES) or end == first):
        count += len(buffers[end])
        total += sizes[end]
        end += 1
    return end


def _status(fd: int) -> Optional[tuple[int, int]]:
    """(pages of the last batch published, errno of the one that failed), or None when the
    handle cannot say."""
    try:
        published, err = os.pread(fd, 64, 0).split()
        return int(published), int(err)
    except (OSError, ValueError):
        return None
