"""Fetch requests at and over the 4 MiB request limit (issue 29, item 3): ``run(mount, rounds, seed)``.

Why: the request over the limit is refused with EFBIG, but the kernel reports that as a short
write, and a writer that sends the rest must not have it taken for a request of its own (whose
answer, read from offset 0, would be the tail's pages in the head's place). And a request at
the limit is answered whole. So, per round, on one handle each:

- at the limit: stored pages, then missing ones up to exactly ``MAX_FETCH_REQUEST`` bytes, one
  stored page last: the answer is the stored pages' bytes, and the last one's at its offset;
- over it, by 1 byte to 2 MiB, stored pages first and last: every write from the refused one on
  fails, and so does the read (EFBIG), and the handle then answers a new request right;
- once a run: 8 handles holding a request at the limit each, until the writers' share is spent
  (ENOBUFS), each then read; and ``batch_get_v1`` of more pages than one request can name
  (a client without the data plane, so through the fetch file), half of them stored.

Any bytes answered are judged page by page (``versions.verdict``): another page's are
``foreign``, anything else not the page's ``torn``.
"""

from __future__ import annotations

import errno
import os
import random
from collections import Counter
from pathlib import Path

from hicachefs.control.fetch import MAX_FETCH_REQUEST
from hicachefs_testing.plain_user import MiB, send_exists
from hicachefs_testing.replace_load import ingest_header
from hicachefs_testing.versions import verdict
from hicachefs_testing.workload import labelled_content

POOL = "fetch-limits/bfloat16-page_first-64/tp0of1/kv"
SIZE = 64
STORED = 64
HELD = 10
#: Pages ``batch_get_v1`` asks for at once, with keys of 190 characters: their request lines
#: are over 4 MiB. All but ``CLIENT_MISSING`` of them stored (a missing one costs a read).
CLIENT_PAGES, CLIENT_MISSING = 20_000, 64


def stored_key(i: int) -> str:
    return f"fl-{i:05d}"


def line(size: int, name: str) -> bytes:
    return f"{size} {POOL}/{name}\n".encode()


def missing_lines(length: int, rng: random.Random) -> bytes:
    """``length`` bytes of request lines of missing pages (the last one's name cut to fit)."""
    stub = len(line(SIZE, ""))
    out, n = bytearray(), 0
    while len(out) < length:
        rest = length - len(out)
        whole = line(SIZE, f"missing-{rng.getrandbits(32):08x}-{n:08d}-" + "m" * 150)
        if rest < len(whole) + stub + 32:  # the last line: sized to end exactly
            whole = line(SIZE, "x" * (rest - stub))
        out += whole
        n += 1
    assert len(out) == length
    return bytes(out)


class Limits:
    def __init__(self, root: Path, seed: int) -> None:
        self.root = root
        self.rng = random.Random(seed)
        self.counts: Counter = Counter()
        self.examples: list[str] = []
        self.pages = {stored_key(i): labelled_content(stored_key(i), SIZE) for i in range(STORED)}

    def note(self, what: str, example: str | None = None) -> None:
        self.counts[what] += 1
        if example is not None and len(self.examples) < 5:
            self.examples.append(example)

    def store(self) -> None:
        (self.root / POOL).mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / ".hicachefs" / "ingest", os.O_RDWR)
        try:
            header = ingest_header([f"{POOL}/{k}" for k in self.pages], SIZE)
            os.pwritev(fd, [header, *self.pages.values()], 0)
        finally:
            os.close(fd)

    def handle(self) -> int:
        return os.open(self.root / ".hicachefs" / "fetch", os.O_RDWR)

    def judge(self, answer: bytes, names: list[str | None], what: str) -> int:
        """Judge an answer page by page against the names asked (None: a missing page, which
        must not be answered); how many pages were right."""
        right = 0
        for i in range(len(answer) // SIZE):
            name = names[i] if i < len(names) else None
            data = answer[i * SIZE : (i + 1) * SIZE]
            kind = verdict(data, name, 0, -1) if name is not None else "answered for a missing page"
            if kind is None:
                right += 1
            else:
                self.note(f"{kind} pages answered", f"{what}: page {i} ({name}) answered {kind}: {data[:40]!r}")
        if len(answer) % SIZE:
            self.note("torn pages answered", f"{what}: an answer of {len(answer)} bytes")
        return right

    def request_at_limit(self) -> tuple[bytes, list[str | None], str]:
        """A request of exactly the limit: stored pages, missing ones, one stored page last."""
        head = self.rng.sample(sorted(self.pages), 16)
        last = self.rng.choice(sorted(self.pages))
        first = b"".join(line(SIZE, k) for k in head)
        tail = line(SIZE, last)
        request = first + missing_lines(MAX_FETCH_REQUEST - len(first) - len(tail), self.rng) + tail
        return request, head, last

    def at_limit(self) -> None:
        request, head, last = self.request_at_limit()
        fd = self.handle()
        try:
            send_exists(fd, request)
            answer = os.pread(fd, SIZE * (len(head) + 1), 0)
            right = self.judge(answer, head, "at the limit")
            lines = request.count(b"\n")
            tail = os.pread(fd, SIZE, (lines - 1) * SIZE)
            right += self.judge(tail, [last], "at the limit, its last page")
            if right == len(head) + 1 and len(answer) == len(head) * SIZE:
                self.counts["at the limit: answered right"] += 1
            else:
                self.note("at the limit: answered short", f"at the limit: {len(answer)} bytes, {right} pages right")
        except OSError as exc:
            self.note(f"at the limit: refused ({errno.errorcode.get(exc.errno)})")
        finally:
            os.close(fd)
        self.counts["requests"] += 1

    def over_limit(self) -> None:
        head = self.rng.sample(sorted(self.pages), 8)
        tail = self.rng.sample(sorted(self.pages), 8)
        over = self.rng.choice((1, 2, 100, MiB, 2 * MiB))
        first = b"".join(line(SIZE, k) for k in head)
        last = b"".join(line(SIZE, k) for k in tail)
        request = first + missing_lines(MAX_FETCH_REQUEST + over - len(first) - len(last), self.rng) + last
        fd = self.handle()
        try:
            refused = None
            view = memoryview(request)
            while view:  # as a writer that retries a short write sends the rest
                try:
                    taken = os.write(fd, view[:MiB])
                    if refused is not None:
                        self.note("over the limit: writes taken after the refusal",
                                  f"a write of {taken} bytes was taken after {errno.errorcode[refused]}")
                    view = view[taken:]
                except OSError as exc:
                    refused = refused or exc.errno
                    self.counts[f"over the limit: writes refused ({errno.errorcode.get(exc.errno)})"] += 1
                    view = view[MiB:]
            if refused is None:
                self.note("over the limit: taken", f"a request of {len(request)} bytes was taken")
            try:
                answer = os.pread(fd, SIZE * 16, 0)
                self.judge(answer, [], "over the limit")  # nothing may be answered
                self.note("over the limit: answered", f"a request of {len(request)} bytes answered {len(answer)} bytes")
            except OSError as exc:
                self.counts[f"over the limit: refused ({errno.errorcode.get(exc.errno)})"] += 1
            self.serves_again(fd, "after a request over the limit")
        finally:
            os.close(fd)
        self.counts["requests"] += 1

    def serves_again(self, fd: int, what: str) -> None:
        names = self.rng.sample(sorted(self.pages), 4)
        os.write(fd, b"".join(line(SIZE, k) for k in names))
        if self.judge(os.pread(fd, SIZE * 4, 0), names, what) != 4:
            self.note("handles not serving again", f"{what}: the next request was not answered whole")

    def held(self) -> None:
        """``HELD`` handles with a request at the limit each, all unread, then each read."""
        fds, asked = [], []
        try:
            for _ in range(HELD):
                fd = self.handle()
                fds.append(fd)
                request, head, _ = self.request_at_limit()
                try:
                    send_exists(fd, request)
                    asked.append(head)
                except OSError as exc:
                    self.counts[f"held at the limit: refused ({errno.errorcode.get(exc.errno)})"] += 1
                    asked.append(None)
                self.counts["requests"] += 1
            for fd, head in zip(fds, asked):
                try:
                    answer = os.pread(fd, SIZE * 16, 0)
                except OSError as exc:
                    if head is not None:
                        self.note("held at the limit: taken, then not answered",
                                  f"a held request's read failed: {exc}")
                    self.serves_again(fd, "after a refused held request")
                    continue
                if head is None:
                    self.judge(answer, [], "a refused held request")
                    self.note("held at the limit: refused, then answered", "a refused request's read was answered")
                elif self.judge(answer, head, "a held request") == len(head):
                    self.counts["held at the limit: answered right"] += 1
        finally:
            for fd in fds:
                os.close(fd)

    def client_batch(self) -> None:
        """``batch_get_v1`` of ``CLIENT_PAGES`` tiny pages with long keys, a few of them missing,
        through a client without the data plane: its requests are split at the limit."""
        import torch

        from hicachefs_testing import stress_clients as sc

        tiny = {"layer_num": 1, "head_num": 1, "head_dim": 16, "page_size": 1}  # 64-byte pages
        pool = sc.host_pool(CLIENT_PAGES, **tiny)
        names = [f"{self.rng.getrandbits(64):016x}-" + "k" * 173 for _ in range(CLIENT_PAGES)]
        missing = set(self.rng.sample(names, CLIENT_MISSING))
        stored = [key for key in names if key not in missing]
        writer = sc.client(self.root, "fetch-limits-client", pool)
        for page, key in enumerate(stored):
            sc.put(pool, page, labelled_content(key, SIZE))
        written = writer.batch_set_v1(stored[:1], torch.arange(1, dtype=torch.int64))  # makes the directory
        written += writer.batch_set_v1(stored[1:], torch.arange(1, len(stored), dtype=torch.int64))
        writer.close()
        pool.zero()
        reader = sc.client(self.root, "fetch-limits-client", pool, data_plane=False, read_threads=1)
        got = reader.batch_get_v1(names, torch.arange(CLIENT_PAGES, dtype=torch.int64))
        reader.close()
        kept = set(k for k, ok in zip(stored, written) if ok)
        right = 0
        for page, (key, hit) in enumerate(zip(names, got)):
            if hit:
                right += self.judge(sc.taken(pool, page), [key if key in kept else None], "batch_get_v1")
            elif key in kept:
                self.note("stored pages not read by batch_get_v1", f"batch_get_v1 missed stored page {key}")
        self.counts["batch_get_v1 pages asked"] += CLIENT_PAGES
        self.counts["batch_get_v1 pages read right"] += right


def run(mount, rounds: int, seed: int, client: bool = True) -> tuple[Counter, list[str]]:
    """``rounds`` requests at and over the limit each, the held ones, and (``client``) the
    client's batch; counts and up to 5 examples."""
    limits = Limits(mount.path, seed)
    limits.store()
    for _ in range(rounds):
        limits.at_limit()
        limits.over_limit()
    limits.held()
    if client:
        limits.client_batch()
    return limits.counts, limits.examples
