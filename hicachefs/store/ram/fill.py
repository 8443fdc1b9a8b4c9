"""Faulting the RAM tier's memory in at start, on several threads, a step at a time.

Why at start: the RAM tier is a dedicated budget, and first-touch page faults would otherwise cut
the first pass of writes to about a fifth of memcpy speed; and a host that cannot give the
memory is told so by the mount, not by a daemon killed later. Why several threads: the kernel
clears each new page in the thread that faults it, and one thread clears far below memory
speed (on the 2-core VM of docs/performance.md, 5 GiB took 21 s on one thread where the host
backs a guest's memory as it is first touched, 10-12 s on two). Why steps: a start of many
seconds says how far it has come (``hicachefs mount`` shows it).

``MADV_POPULATE_WRITE`` (Linux 5.14) faults a range in for writing and says when it cannot; on
an older kernel the memfd is populated by a mapping made with ``MAP_POPULATE``, in one go.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import queue
import threading
from collections.abc import Callable

#: Bytes faulted in by one call, and between two reports.
STEP = 64 << 20
#: Threads at most: past a few, clearing pages is bound by memory, not by cores.
MAX_THREADS = 8

_MADV_POPULATE_WRITE = 23
_madvise = ctypes.CDLL(None, use_errno=True).madvise
_madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def fill(fd: int, address: int, length: int, filled: Callable[[int], None]) -> None:
    """Fault in the ``length`` bytes at ``address``, a shared writable mapping of memfd ``fd``
    from its start. ``filled(bytes so far)`` is called from this thread after each step. Raises
    OSError when the host cannot give the memory (ENOMEM); what was filled stays filled."""
    steps = queue.SimpleQueue()
    for start in range(0, length, STEP):
        steps.put(start)
    # (bytes, errno, exception) per step; errno 0 and no exception: filled
    outcomes: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def work() -> None:
        while not stop.is_set():
            try:
                start = steps.get_nowait()
            except queue.Empty:
                return
            size = min(STEP, length - start)
            try:
                failed = _madvise(address + start, size, _MADV_POPULATE_WRITE) != 0
            except BaseException as raised:  # told to the waiting thread, which would wait forever
                outcomes.put((size, 0, raised))
                return
            outcomes.put((size, ctypes.get_errno() if failed else 0, None))

    count = min(MAX_THREADS, len(os.sched_getaffinity(0)), -(-length // STEP))
    threads = [threading.Thread(target=work, name="hicachefs-fill", daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    done, error = 0, 0
    try:
        while done < length and not error:
            size, error, raised = outcomes.get()
            if raised is not None:
                raise raised
            if not error:
                done += size
                filled(done)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if error == errno.EINVAL and done == 0:  # a kernel before 5.14
        mmap.mmap(fd, length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE).close()
        filled(length)
    elif error:
        raise OSError(error, os.strerror(error))
