"""Every storage call SGLang's cache controller makes, timed, counted and checked.

``RecordingBackend`` stands between the controller and the backend SGLang's factory built
(``HiCacheFS`` through ``dynamic``, or ``HiCacheFile``), forwards every call unchanged, and
records per method the batch sizes, the pages hit or stored and the seconds taken. It checks the
bytes at both ends of each transfer, in every pool it is given a check for (``kv``, and a
hybrid model's ``mamba`` or ``swa``): the host pages SGLang hands a ``set`` must be the pages the prefill
computed for their keys, and every page a ``get`` reports as read must be in the host pool (or
the staging page) afterwards. A call that raises, a write that fails, and a read that misses a
page the same call's exists query found count as failed calls.

Thread-safe: the controller calls it from its prefetch, prefetch-IO and backup threads.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from .sglang_kv import KeyedBytes, PageKV


@dataclass
class CallStats:
    """One method's calls: how many, of which sizes, hits (pages found/read/stored), seconds."""

    calls: int = 0
    pages: int = 0
    hits: int = 0
    seconds: List[float] = field(default_factory=list)
    batch_sizes: Dict[int, int] = field(default_factory=dict)

    def add(self, pages: int, hits: int, seconds: float) -> None:
        self.calls += 1
        self.pages += pages
        self.hits += hits
        self.seconds.append(seconds)
        self.batch_sizes[pages] = self.batch_sizes.get(pages, 0) + 1

    def merge(self, other: "CallStats") -> None:
        """Count ``other``'s calls here too (runs pooled)."""
        self.calls, self.pages, self.hits = self.calls + other.calls, self.pages + other.pages, self.hits + other.hits
        self.seconds += other.seconds
        for size, count in other.batch_sizes.items():
            self.batch_sizes[size] = self.batch_sizes.get(size, 0) + count


class RecordingBackend:
    """A transparent proxy over a ``HiCacheStorage`` backend (see the module docstring)."""

    def __init__(self, backend: Any, pools: Dict[str, Tuple[KeyedBytes, Any]]) -> None:
        """``pools``: per pool name, the expected bytes of its pages and its host pool."""
        self.backend = backend
        self.pools = pools
        self.kv: PageKV = pools["kv"][0]
        self._lock = threading.Lock()
        self.stats: Dict[str, CallStats] = {}
        self.failures: List[str] = []
        self.wrong_handed_over = 0  # pages SGLang gave a set that were not their prefill's bytes
        self.wrong_read = 0  # pages a get reported read whose bytes were not right
        self.read_pages = 0
        self.stored_pages = 0
        self.in_flight = 0

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    # ------------------------------------------------------------- bookkeeping

    def _call(self, method: str, pages: int, run, count_hits):
        with self._lock:
            self.in_flight += 1
        started = time.perf_counter()
        try:
            result = run()
        except Exception as exc:
            with self._lock:
                self.failures.append(f"{method} raised {exc!r}")
                self.in_flight -= 1
            raise
        seconds = time.perf_counter() - started
        with self._lock:
            self.stats.setdefault(method, CallStats()).add(pages, count_hits(result), seconds)
            self.in_flight -= 1
        return result

    def _fail(self, message: str) -> None:
        with self._lock:
            self.failures.append(message)

    def expected(self, pool: str, key: str):
        """The bytes page ``key`` of ``pool`` must hold."""
        return self.pools[pool][0].expected(key)

    def _host_page(self, host_indices, i: int, pool: str = "kv"):
        host_pool = self.pools[pool][1]
        return host_pool.get_data_page(int(host_indices[i * host_pool.page_size]), flat=True)

    def _check_handed_over(self, keys: List[str], pages, pool: str = "kv") -> None:
        expected = self.pools[pool][0]
        wrong = sum(not expected.holds(key, page) for key, page in zip(keys, pages))
        with self._lock:
            self.wrong_handed_over += wrong

    def _check_read(self, keys: List[str], pages, ok: List[bool], pool: str = "kv") -> None:
        expected = self.pools[pool][0]
        wrong = sum(not expected.holds(key, page) for key, page, done in zip(keys, pages, ok) if done)
        with self._lock:
            self.wrong_read += wrong
            self.read_pages += sum(ok)

    def _check_stored(self, method: str, ok: List[bool]) -> None:
        with self._lock:
            self.stored_pages += sum(ok)
        if not all(ok):
            self._fail(f"{method}: {ok.count(False)} of {len(ok)} pages not stored")

    # ------------------------------------------------------------- existence

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        return self._call("batch_exists", len(keys), lambda: self.backend.batch_exists(keys, extra_info),
                          lambda hit: hit)

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[list] = None, extra_info: Any = None):
        return self._call("batch_exists_v2", len(keys),
                          lambda: self.backend.batch_exists_v2(keys, pool_transfers, extra_info),
                          lambda result: result.kv_hit_pages)

    # ------------------------------------------------------------- zero copy (HiCacheFS)

    def batch_set_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        self._check_handed_over(keys, [self._host_page(host_indices, i) for i in range(len(keys))])
        ok = self._call("batch_set_v1", len(keys), lambda: self.backend.batch_set_v1(keys, host_indices, extra_info),
                        sum)
        self._check_stored("batch_set_v1", ok)
        return ok

    def batch_get_v1(self, keys: List[str], host_indices, extra_info: Any = None) -> List[bool]:
        ok = self._call("batch_get_v1", len(keys), lambda: self.backend.batch_get_v1(keys, host_indices, extra_info),
                        sum)
        self._check_read(keys, [self._host_page(host_indices, i) for i in range(len(keys))], ok)
        if not all(ok):
            self._fail(f"batch_get_v1: {ok.count(False)} of {len(keys)} pages its exists query found not read")
        return ok

    # ------------------------------------------------------------- generic path (HiCacheFile)

    def batch_set(self, keys: List[str], values=None, target_locations=None, target_sizes=None) -> bool:
        self._check_handed_over(keys, values)
        ok = self._call("batch_set", len(keys),
                        lambda: self.backend.batch_set(keys, values, target_locations, target_sizes),
                        lambda done: len(keys) if done else 0)
        self._check_stored("batch_set", [bool(ok)] * len(keys))
        return ok

    def batch_get(self, keys: List[str], target_locations=None, target_sizes=None):
        pages = self._call("batch_get", len(keys),
                           lambda: self.backend.batch_get(keys, target_locations, target_sizes),
                           lambda got: sum(page is not None for page in got))
        ok = [page is not None for page in pages]
        self._check_read(keys, [page if page is not None else target for page, target
                                in zip(pages, target_locations or pages)], ok)
        if not all(ok):
            self._fail(f"batch_get: {ok.count(False)} of {len(keys)} pages its exists query found not read")
        return pages

    # ------------------------------------------------------------- named pools (v2)

    def batch_set_v2(self, transfers, extra_info: Any = None):
        for t in transfers:
            pool = _pool(t)
            if pool in self.pools:
                self._check_handed_over(list(t.keys), [self._host_page(t.host_indices, i, pool)
                                                       for i in range(len(t.keys))], pool)
        results = self._call("batch_set_v2", sum(len(t.keys or []) for t in transfers),
                             lambda: self.backend.batch_set_v2(transfers, extra_info),
                             lambda done: sum(sum(v) for v in done.values()))
        for name, ok in results.items():
            self._check_stored(f"batch_set_v2[{name}]", list(ok))
        return results

    def batch_get_v2(self, transfers, extra_info: Any = None):
        results = self._call("batch_get_v2", sum(len(t.keys or []) for t in transfers),
                             lambda: self.backend.batch_get_v2(transfers, extra_info),
                             lambda done: sum(sum(v) for v in done.values()))
        for t in transfers:
            ok = list(results.get(t.name, []))
            pool = _pool(t)
            if pool in self.pools:
                self._check_read(list(t.keys), [self._host_page(t.host_indices, i, pool)
                                                for i in range(len(t.keys))], ok, pool)
            if not all(ok):
                self._fail(f"batch_get_v2[{t.name}]: {ok.count(False)} of {len(ok)} pages not read")
        return results


def _pool(transfer) -> str:
    """A ``PoolTransfer``'s pool name as a string (``PoolName.MAMBA`` -> ``mamba``)."""
    return str(getattr(transfer.name, "value", transfer.name))
