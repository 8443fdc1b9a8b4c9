"""Fault injection for the store's devices, in the way CacheLib's Navy tests its engines.

``FaultyDevice(device)`` stands in for any device object (the SSD tier's ``FileDevice``, the
shared tier's file operations): every method call passes through to the wrapped device unless
a ``Fault`` registered for that method name matches, in which case the call is delayed, fails
with an errno, writes only part of its data, or returns bytes with a bit flipped.

Used by the tests and ``scripts/stress.py``; the daemon never wraps its devices. Thread-safe:
faults may be added and cleared while other threads call through the wrapper.
"""

from __future__ import annotations

import errno as errno_codes
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass


@dataclass
class Fault:
    """What goes wrong with calls of one device method.

    ``op``: the method name (``pread``, ``pwritev``, ``fsync``, ``rename``...). ``errno``:
    raise ``OSError(errno)`` instead of calling through. ``delay_s``: sleep first (latency; a
    long one is a hung device). ``short``: a write method writes only the first half of its
    data and returns that count. ``flip``: a read method returns its bytes with one bit flipped
    (the buffers it filled, or the bytes it returned). ``probability`` of applying to a call,
    and ``count``: at most that many times (None: until cleared).
    """

    op: str
    errno: int | None = None
    delay_s: float = 0.0
    short: bool = False
    flip: bool = False
    probability: float = 1.0
    count: int | None = None


class FaultyDevice:
    """A wrapper that injects ``Fault``s into calls of the wrapped device's methods."""

    def __init__(self, device, seed: int = 0) -> None:
        self._device = device
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.injected: Counter[str] = Counter()  # fault kind -> times applied, e.g. 'pwritev:EIO'

    def inject(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def __getattr__(self, name: str):
        target = getattr(self._device, name)
        if not callable(target):
            return target

        def call(*args, **kwargs):
            fault = self._take(name)
            if fault is None:
                return target(*args, **kwargs)
            return self._apply(fault, name, target, args, kwargs)

        return call

    def _take(self, op: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.op != op or (fault.count is not None and fault.count <= 0):
                    continue
                if self._random.random() >= fault.probability:
                    continue
                if fault.count is not None:
                    fault.count -= 1
                return fault
        return None

    def _apply(self, fault: Fault, op: str, target, args, kwargs):
        if fault.delay_s:
            self._count(op, "delay")
            time.sleep(fault.delay_s)
        if fault.errno is not None:
            self._count(op, errno_codes.errorcode.get(fault.errno, str(fault.errno)))
            raise OSError(fault.errno, f"injected fault in {op}: {os.strerror(fault.errno)}")
        if fault.short:
            self._count(op, "short")
            return _short_write(target, args, kwargs)
        result = target(*args, **kwargs)
        if fault.flip:
            self._count(op, "flip")
            result = _flip_read(result, args)
        return result

    def _count(self, op: str, kind: str) -> None:
        with self._lock:
            self.injected[f"{op}:{kind}"] += 1


def _short_write(target, args, kwargs) -> int:
    """Call a write method with the first half of its data: ``(data_or_buffers, offset)``."""
    data, *rest = args
    if isinstance(data, (list, tuple)):  # pwritev-style buffers
        joined = b"".join(bytes(b) for b in data)
        half = [joined[: len(joined) // 2]]
    else:
        half = bytes(data)[: len(data) // 2]
    return target(half, *rest, **kwargs)


def _flip_read(result, args):
    """Flip one bit of what a read produced: its returned bytes, or the buffers it filled."""
    if isinstance(result, (bytes, bytearray)):
        if not result:
            return result
        flipped = bytearray(result)
        flipped[len(flipped) // 2] ^= 0x10
        return bytes(flipped)
    buffers = args[0] if args and isinstance(args[0], (list, tuple)) else []
    filled = result if isinstance(result, int) else 0
    for buffer in buffers:  # the last bytes read are the payload's: flip one there
        view = memoryview(buffer).cast("B")
        if 0 < filled <= len(view):
            view[filled - 1] ^= 0x10
            break
        filled -= len(view)
    return result
