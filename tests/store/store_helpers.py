"""Names, reads and crashes for the store's tests (page bytes: ``hicachefs_testing.workload.content``)."""

from __future__ import annotations

import hashlib
import os
import traceback
from collections.abc import Callable

from hicachefs.store import PageStore, StoreConfig
from hicachefs.store.tier import RecoveryProgress

KiB, MiB = 1 << 10, 1 << 20


def key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def page_name(i: int, directory: str = "m/bf16-page_first-64/tp0of1/kv") -> str:
    return f"{directory}/{key(i)}"


def read_all(store: PageStore, name: str) -> bytes:
    with store.open(name) as reader:
        return bytes(reader.read(0, reader.size + 1))


def crash_after(config: StoreConfig, work: Callable[[PageStore], None],
                disk_device: Callable[[], object] | None = None) -> None:
    """Open a store on ``config`` in a child process, run ``work`` on it, and let the child die
    without closing the store: the disk tier is left as a SIGKILL leaves it. ``disk_device``
    makes the disk tier's device in the child (where its lock is taken)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            work(PageStore(config) if disk_device is None else PageStore(config, disk_device=disk_device()))
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the work before the crash failed"


def reopen(config: StoreConfig) -> tuple[PageStore, RecoveryProgress]:
    """A store on ``config``, and the last report of its recovery (how it rebuilt its index)."""
    reports: list[RecoveryProgress] = []
    store = PageStore(config, progress=reports.append)
    assert reports and reports[-1].finished and not any(r.finished for r in reports[:-1])
    return store, reports[-1]
