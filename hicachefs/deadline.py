"""Asking a mount something with a deadline: a daemon that stopped answering (stopped, hung)
must not hang the command that asks, as every access to its mount would.

The call runs in a daemon thread of its own, and the caller waits for it at most the deadline.
A call that misses it stays blocked in the kernel until the daemon answers or the connection is
aborted, or until the process exits (a FUSE request waits killably); nothing waits for it.
No ``concurrent.futures`` pool: its threads are joined at exit, which would hang there instead.
Thread-safe.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

#: A daemon answers a stat or a read of its control files in milliseconds (a few requests on its
#: one thread); five seconds without an answer is a hang, not load.
ANSWER_TIMEOUT_S = 5.0

T = TypeVar("T")


class NoAnswer(Exception):
    """The call did not return within its deadline; ``seconds`` says how long was waited."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer within {seconds:g} s")
        self.seconds = seconds

    def about(self, mountpoint: object) -> str:
        """The one line a command prints when ``mountpoint``'s daemon did not answer."""
        return f"{mountpoint}: its daemon did not answer within {self.seconds:g} s"


def call(work: Callable[[], T], timeout_s: float = ANSWER_TIMEOUT_S) -> T:
    """``work()``'s result, or its exception, if it returns within ``timeout_s``; else NoAnswer."""
    outcome: list = []
    done = threading.Event()

    def run() -> None:
        try:
            outcome.append((True, work()))
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="deadline-call", daemon=True).start()
    if not done.wait(timeout_s):
        raise NoAnswer(timeout_s)
    returned, value = outcome[0]
    if returned:
        return value
    raise value


def read_bytes(path: Path, timeout_s: float = ANSWER_TIMEOUT_S) -> bytes:
    """The whole file, or NoAnswer; OSError as ``Path.read_bytes`` raises it."""
    return call(Path(path).read_bytes, timeout_s)
