"""A namespace over a real store, without FUSE: what the namespace tests drive, and a recorder
standing in for the kernel notifier."""

from __future__ import annotations

import os

import trio

from hicachefs.control.files import ControlFiles
from hicachefs.posix.errors import FsError
from hicachefs.posix.namespace import ROOT_INODE, Namespace
from hicachefs.store import NeedsIO, PageStore, StoreConfig

POOL = ("m", "f", "tp0of1", "kv")


class Recorder:
    def __init__(self):
        self.events = []

    def push(self, inode, reader):
        self.events.append(("push", inode, bytes(reader.view())))
        reader.close()
        return True

    def forget_entry(self, parent_inode, name):
        self.events.append(("entry", parent_inode, name))

    def forget_inode(self, inode):
        self.events.append(("inode", inode))

    def forget_attributes(self, inode):
        self.events.append(("attributes", inode))

    async def delivered(self):
        self.events.append(("delivered",))


def settled(answer):
    """The answer after its blocking work, run here (the daemon runs it in a worker thread)."""
    while isinstance(answer, NeedsIO):
        answer = answer.finish(answer.work())
    return answer


class Alone:
    """A namespace, its store and its recorder, with the calls a FUSE request makes."""

    def __init__(self, store: PageStore, kernel_cache: bool = True, temp_timeout_s: float = 60.0):
        self.store = store
        self.recorder = Recorder()
        control = ControlFiles(store, store.statistics, lambda facts: b"", {})
        self.ns = Namespace(store, control, self.recorder, temp_timeout_s, kernel_cache)
        parent = ROOT_INODE
        for part in POOL:
            parent = self.ns.mkdir(parent, part.encode()).inode
        self.pool = parent

    def open_control(self, name: bytes):
        """A handle on control file ``name``, opened as the daemon opens one for its own user."""
        control = self.ns.control
        return control.open(control.lookup(name), os.O_RDWR, self.ns.publishing, self.ns.leases, os.getuid())

    def create(self, name: bytes) -> tuple[int, int]:
        """(inode, fh) of a new file in the pool."""
        st, handle = self.ns.create(self.pool, name, os.O_WRONLY)
        return st.inode, self.ns.handles.add(handle)

    def write(self, fh: int, data: bytes, offset: int = 0) -> int:
        return trio.run(self.ns.handles.get(fh).write, offset, data)

    def read(self, fh: int, size: int = 1 << 20, offset: int = 0) -> bytes:
        return bytes(trio.run(self.ns.handles.get(fh).read, offset, size))

    def close(self, fh: int) -> None:
        self.ns.handles.release(fh)

    def publish(self, key: bytes, data: bytes) -> int:
        """create .tmp, write, release, rename: returns the page's inode."""
        inode, fh = self.create(b".tmp-" + key)
        self.write(fh, data)
        self.close(fh)
        self.ns.rename(self.pool, b".tmp-" + key, self.pool, key, 0)
        return inode

    def lookup(self, name: bytes):
        return settled(self.ns.lookup(self.pool, name))

    def open(self, inode: int, flags: int = os.O_RDONLY) -> tuple[int, bool]:
        """(fh, whether the kernel may cache it) of an open file."""
        handle = settled(self.ns.open(inode, flags))
        return self.ns.handles.add(handle), handle.cacheable

    def contents(self, key: bytes) -> bytes:
        fh, _ = self.open(self.lookup(key).inode)
        try:
            return self.read(fh)
        finally:
            self.close(fh)


def alone(tmp_path=None, **options) -> Alone:
    config = StoreConfig(memory_bytes=16 << 20, max_page_size=1 << 20,
                         **({"disk_dir": tmp_path, "disk_bytes": 256 << 20} if tmp_path else {}))
    return Alone(PageStore(config), **options)


def partial_requests_until_refused(alone: Alone, name: bytes, head: bytes) -> tuple[list, FsError | None]:
    """Handles on control file ``name``, each sent ``head`` and then 4 MiB of a request that
    ``head`` says is a byte longer (so none is whole), opened until a write is refused or the
    writers' request share is passed by four handles' worth: the handles, the last of them the
    refused one, and the refusal (None: none came)."""
    handles = []
    piece = bytes(1 << 20)
    try:
        for _ in range(alone.ns.control.request_limits.memory.limits.writers // (4 << 20) + 4):
            handles.append(alone.open_control(name))
            trio.run(handles[-1].write, 0, head)
            for k in range(4):
                trio.run(handles[-1].write, len(head) + k * len(piece), piece)
    except FsError as refused:
        return handles, refused
    return handles, None
