"""The daemon's liveness word: a word in shared memory that the kernel itself changes the moment
the daemon's process ends, however it ends (docs/contract.md, "The data plane").

Why: a data-plane client must stop trusting a dead daemon's memory at once, and it asks at every
SGLang call. Polling a pidfd did that with a system call each time, which under SGLang's busy
threads cost 10-30 us of a 60 us existence probe (the call gives the scheduler a chance to run
another thread while the interpreter lock is held). Reading a word costs one load.

How: a thread of the daemon's registers with the kernel a robust futex list
(``set_robust_list``) whose one entry is this word, and writes its own thread id into it. When
that thread ends (the process killed, crashed or exiting), the kernel sets FUTEX_OWNER_DIED in
the word, before the process is reported gone. The thread only waits; its list is its own (glibc
keeps its robust mutexes in a list of its own, which this thread never uses).

Layout, at ``offset`` (16 bytes): the entry's ``next`` pointer (u64, a pointer into this
process, meaningless to others), then the word (u32): the thread's id while the daemon runs.
A word of 0 says this machine offers no robust lists (``SYSCALLS``): clients then do not attach.
"""

from __future__ import annotations

import ctypes
import logging
import platform
import struct
import threading

log = logging.getLogger(__name__)

#: ``set_robust_list``'s number per machine (x86_64's own table, the generic table elsewhere).
SYSCALLS = {"x86_64": 273, "aarch64": 99, "arm64": 99, "riscv64": 99}
OWNER_DIED = 0x40000000
#: The entry: ``next`` (u64), then the word (u32), as the kernel walks it (``futex_offset`` 8).
ENTRY = struct.Struct("<QI")
WORD_OFFSET = 8
_LIBC = ctypes.CDLL(None, use_errno=True)


class _RobustListHead(ctypes.Structure):
    _fields_ = (("next", ctypes.c_void_p), ("futex_offset", ctypes.c_long), ("list_op_pending", ctypes.c_void_p))


class LivenessWord:
    """The word at ``offset`` of ``memory`` (a writable shared mapping), kept by a thread of its
    own from ``__init__`` until ``stop``."""

    def __init__(self, memory, offset: int) -> None:
        self._memory, self._offset = memory, offset
        self._entry = ctypes.addressof(ctypes.c_char.from_buffer(memory, offset))
        self._head = _RobustListHead()  # the kernel reads it when the thread ends: kept here
        self._registered = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._keep, name="hicachefs-liveness", daemon=True)
        self._thread.start()
        self._registered.wait()

    def _keep(self) -> None:
        number = SYSCALLS.get(platform.machine())
        try:
            if number is None:
                log.warning("no robust futex lists known on %s: data-plane clients will not attach",
                            platform.machine())
                return
            head = ctypes.addressof(self._head)
            ENTRY.pack_into(self._memory, self._offset, head, threading.get_native_id())
            self._head.next, self._head.futex_offset, self._head.list_op_pending = self._entry, WORD_OFFSET, None
            if _LIBC.syscall(number, ctypes.c_void_p(head), ctypes.c_size_t(ctypes.sizeof(self._head))) != 0:
                ENTRY.pack_into(self._memory, self._offset, 0, 0)
                log.warning("set_robust_list failed (errno %d): data-plane clients will not attach",
                            ctypes.get_errno())
                return
        finally:
            self._registered.set()
        self._stopping.wait()
        # Out of the kernel's list before the thread ends (its head may be freed after), and
        # the word marked as the kernel would have.
        self._head.next = ctypes.addressof(self._head)
        ENTRY.pack_into(self._memory, self._offset, 0, OWNER_DIED)

    def stop(self) -> None:
        """The daemon stops serving this memory: clients see the word as a dead daemon's."""
        self._stopping.set()
        self._thread.join()
