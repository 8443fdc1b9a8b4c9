"""A child forked while another thread of the test holds some of the client's locks: a lock held
at a fork stays held in the child, which hung at its first call where the client did not make
that lock anew (``hicachefs_client.forks``)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable


def forked_while_held(locks: Iterable, work: Callable[[], bool]) -> int:
    """The exit status of a child that runs ``work`` (0 when it says True, 1 when False, 2 when
    it raises), forked while another thread holds those of ``locks`` it can take; a hung child
    dies of SIGALRM after 20 s."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        taken = [lock for lock in locks if lock.acquire(blocking=False)]  # a Condition's lock is listed too
        held.set()
        release.wait(30)
        for lock in reversed(taken):
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    child = os.fork()
    if child == 0:
        try:
            signal.alarm(20)
            os._exit(0 if work() else 1)
        finally:
            os._exit(2)
    release.set()
    holder.join()
    _, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)
