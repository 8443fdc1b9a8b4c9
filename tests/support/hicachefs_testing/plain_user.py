"""What the tests' plain user (uid 65534) runs against a mount: its attacks, each a process of
its own, and the two halves of an exists request.

Standard library only, and nothing of the checkout: the plain user cannot reach a checkout in a
0700 directory (a clone in ``mktemp -d``, or in ``/root``), nor its ``.venv``. So it runs this
file with the system's Python, from a copy in a directory of its own (``attacks``):

    /usr/bin/python3 -I plain_user.py exists-storm ROOT SIZE
        ask ROOT's ``.hicachefs/exists`` about SIZE bytes of the costliest lines, again and again
    /usr/bin/python3 -I plain_user.py fetch-storm ROOT SIZE LINE
        ask ROOT's ``.hicachefs/fetch`` for LINE (``<size> <path>``) repeated to SIZE bytes, and
        read the answer, again and again
    /usr/bin/python3 -I plain_user.py listing-storm DIR
        open DIR and read its first entries, again and again
    /usr/bin/python3 -I plain_user.py held-listings DIR COUNT
        COUNT directory handles on DIR, each with its first entries read, held open
    /usr/bin/python3 -I plain_user.py held-requests ROOT COUNT SIZE
        COUNT exists handles, each holding an unread request of SIZE bytes
    /usr/bin/python3 -I plain_user.py held-fetches ROOT POOL SIZE KEYS
        a fetch handle per key of KEYS (comma-separated, repeats allowed), each asked for page
        POOL/key of SIZE bytes and read a byte of, held open
    /usr/bin/python3 -I plain_user.py held-files DIR PREFIX
        every file of DIR whose name starts with PREFIX (another writer's temporary files, found
        as ``ls`` finds them) opened and read a byte of, held open; at the end each is read
        again, and what that fails with is counted among the errors

Each prints ``started`` once its first round is done (``held-*``: once all its handles are) and
a line for each of its next ``REPORTED_ROUNDS`` rounds, and when its standard input closes, one
JSON line of what it did: rounds, errors by errno name, and its first and last round's times on
CLOCK_MONOTONIC (which the test process shares).
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

#: The costliest exists line: five components, so it is looked up, and as short as that allows.
COSTLY_LINE = b"a/b/c/d/e\n"
#: Entries a listing round reads: about what one getdents64 of glibc's buffer takes.
LISTING_ROUND_ENTRIES = 64
#: Rounds reported by a line each (``attacks.Attack.wait_round``); later ones are only counted.
REPORTED_ROUNDS = 100
#: How long any of these may run, whatever happens to its standard input.
LONGEST_S = 300.0
#: A FUSE request's most: what one write or read moves.
MiB = 1 << 20


def costly_request(size: int) -> bytes:
    """``size`` bytes of ``COSTLY_LINE``s (the last line cut short)."""
    return (COSTLY_LINE * (size // len(COSTLY_LINE) + 1))[:size]


def send_exists(fd: int, request: bytes) -> None:
    """Write all of ``request`` (any bytes) to an open exists handle, a MiB at a time (a FUSE
    WRITE's most); an OSError (EFBIG past the maximum request) is the caller's."""
    view = memoryview(request)
    while view:
        view = view[os.write(fd, view[:MiB]) :]


def exists_answer(fd: int) -> bytes:
    """All an open exists handle answers, to EOF."""
    answer = bytearray()
    while piece := os.read(fd, MiB):
        answer += piece
    return bytes(answer)


@dataclass
class Figures:
    rounds: int = 0
    errors: Counter = field(default_factory=Counter)
    first: float = 0.0  # when the first round ended
    last: float = 0.0  # when the last round ended

    def round_done(self) -> None:
        self.rounds += 1
        self.last = time.monotonic()
        if self.rounds == 1:
            self.first = self.last
            print("started", flush=True)
        elif self.rounds <= REPORTED_ROUNDS:  # no more: nobody may be reading the pipe
            print("round", flush=True)

    def failed(self, exc: OSError) -> None:
        self.errors[errno.errorcode.get(exc.errno, str(exc.errno))] += 1

    def as_json(self) -> str:
        return json.dumps({"rounds": self.rounds, "errors": dict(self.errors), "first": self.first,
                           "last": self.last})


def _stop_at_end_of_input() -> threading.Event:
    """Set once standard input closes: the parent's way to end an attack."""
    stop = threading.Event()

    def wait() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait, daemon=True).start()
    return stop


def _rounds(stop: threading.Event):
    deadline = time.monotonic() + LONGEST_S
    while not stop.is_set() and time.monotonic() < deadline:
        yield


def exists_storm(root: Path, size: int, stop: threading.Event, figures: Figures) -> None:
    request = costly_request(size)
    for _ in _rounds(stop):
        try:
            fd = os.open(root / ".hicachefs" / "exists", os.O_RDWR)
            try:
                send_exists(fd, request)
                exists_answer(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            figures.failed(exc)
        figures.round_done()


def fetch_storm(root: Path, size: int, line: bytes, stop: threading.Event, figures: Figures) -> None:
    request = line * max(1, size // len(line))
    buffer = mmap.mmap(-1, MiB)  # page-aligned, as a host pool is
    for _ in _rounds(stop):
        try:
            fd = os.open(root / ".hicachefs" / "fetch", os.O_RDWR)
            try:
                send_exists(fd, request)  # the same framing: whole writes of up to a MiB
                offset = 0
                while (got := os.preadv(fd, [buffer], offset)) == MiB:
                    offset += got
            finally:
                os.close(fd)
        except OSError as exc:
            figures.failed(exc)
        figures.round_done()


def listing_storm(directory: Path, stop: threading.Event, figures: Figures) -> None:
    for _ in _rounds(stop):
        try:
            with os.scandir(directory) as entries:
                for _, _ in zip(range(LISTING_ROUND_ENTRIES), entries):
                    pass
        except OSError as exc:
            figures.failed(exc)
        figures.round_done()


def _hold(count: int, take, stop: threading.Event, figures: Figures) -> None:
    """Take ``count`` things the daemon keeps for this process (``take(held)`` makes one and
    leaves its closing to the ``ExitStack``), then keep them until told to stop."""
    with contextlib.ExitStack() as held:
        for _ in range(count):
            try:
                take(held)
            except OSError as exc:
                figures.failed(exc)
        figures.round_done()
        stop.wait(LONGEST_S)


def held_listings(directory: Path, count: int, stop: threading.Event, figures: Figures) -> None:
    def take(held: contextlib.ExitStack) -> None:
        next(held.enter_context(os.scandir(directory)), None)

    _hold(count, take, stop, figures)


def held_requests(root: Path, count: int, size: int, stop: threading.Event, figures: Figures) -> None:
    request = costly_request(size)

    def take(held: contextlib.ExitStack) -> None:
        fd = os.open(root / ".hicachefs" / "exists", os.O_RDWR)
        held.callback(os.close, fd)
        send_exists(fd, request)

    _hold(count, take, stop, figures)


def held_fetches(root: Path, pool: str, size: int, keys: str, stop: threading.Event, figures: Figures) -> None:
    """A fetch handle per key, each asked for that page and read one byte of (which pins it)."""
    pages = iter(keys.split(","))

    def take(held: contextlib.ExitStack) -> None:
        fd = os.open(root / ".hicachefs" / "fetch", os.O_RDWR)
        held.callback(os.close, fd)
        os.write(fd, f"{size} {pool}/{next(pages)}\n".encode())
        os.pread(fd, 1, 0)

    _hold(len(keys.split(",")), take, stop, figures)


def held_files(directory: Path, prefix: str, stop: threading.Event, figures: Figures) -> None:
    held: list[int] = []
    try:
        for entry in os.scandir(directory):
            if entry.name.startswith(prefix):
                try:
                    fd = os.open(entry.path, os.O_RDONLY)
                except OSError as exc:
                    figures.failed(exc)
                    continue
                held.append(fd)
                try:
                    os.pread(fd, 1, 0)
                except OSError as exc:
                    figures.failed(exc)
        figures.round_done()
        stop.wait(LONGEST_S)
        for fd in held:  # the files' writer is long gone: each was discarded, or is still there
            try:
                os.pread(fd, 1, 0)
            except OSError as exc:
                figures.failed(exc)
    finally:
        for fd in held:
            os.close(fd)


def main() -> int:
    kind, args = sys.argv[1], sys.argv[2:]
    figures = Figures()
    stop = _stop_at_end_of_input()
    if kind == "exists-storm":
        exists_storm(Path(args[0]), int(args[1]), stop, figures)
    elif kind == "fetch-storm":
        fetch_storm(Path(args[0]), int(args[1]), args[2].encode() + b"\n", stop, figures)
    elif kind == "listing-storm":
        listing_storm(Path(args[0]), stop, figures)
    elif kind == "held-listings":
        held_listings(Path(args[0]), int(args[1]), stop, figures)
    elif kind == "held-requests":
        held_requests(Path(args[0]), int(args[1]), int(args[2]), stop, figures)
    elif kind == "held-fetches":
        held_fetches(Path(args[0]), args[1], int(args[2]), args[3], stop, figures)
    elif kind == "held-files":
        held_files(Path(args[0]), args[1], stop, figures)
    else:
        print(f"unknown attack {kind!r}", file=sys.stderr)
        return 2
    print(figures.as_json(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
