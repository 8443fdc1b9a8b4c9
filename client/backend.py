"""``HiCacheFS``: SGLang's HiCache storage backend over a hicachefs mount.

SGLang loads it through its ``dynamic`` backend (docs/contract.md, "The client"). Every KV page is one
file ``<mount>/<model>/<format>/<shard>/<pool>/<key>`` holding the bytes of
``host_pool.get_data_page(index, flat=True)``; reads and writes go straight between the file and
the host pool's page buffers (see ``layout.py``), publication is atomic (``page_io.py``).

A batch's pages are read on up to ``read_threads`` and written on up to ``write_threads`` threads
at once (extra_config; defaults in ``DEFAULT_THREADS``), so that the daemon always has the next
request queued; each page succeeds or fails alone.

Thread-safe: SGLang calls it from its prefetch, I/O and backup threads at once. No method raises
for an I/O problem or a bad key: those become misses / ``False`` and are logged once per kind.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, TypeVar

import torch

from . import forks, paths
from .layout import IndicesOutsidePool, PageLayout, resolve_pool, tensor_bytes
from .accounting import Counters, FailureLog
from .page_io import PageIO
from .page_threads import PageThreads
from .sglang_types import (
    HiCacheStorage,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
    pool_name_str,
    storage_metrics_class,
)

logger = logging.getLogger(__name__)

KV = "kv"
# Unit of the bandwidth SGLang's storage metrics record.
_GB = 1e9
# Per-batch samples kept for get_stats() between two calls.
_MAX_METRIC_SAMPLES = 10_000
# Threads that move one batch's pages at once, per extra_config key, chosen by measurement
# (scripts/bench_client_threads.py; README, "Pointing SGLang at it").
DEFAULT_THREADS = {"read_threads": 4, "write_threads": 2}
MAX_THREADS = 64
# A batch's pages go to the daemon in runs of at least this many bytes, one request each (a
# run of small pages fills one 1 MiB FUSE request), spread over the threads above.
MIN_CHUNK_BYTES = 1 << 20
# Through the data plane a run is copied by its thread (10-20 GB/s) and, written, costs one
# commit request: a run of at least 32 MiB is worth a thread of its own. Below it, handing a run
# to a helper thread and waiting for it cost more than it saved under SGLang's other threads (a
# prefetch of 100 pages of 128 KiB in two runs waited 0.2 ms for the interpreter lock, one of 34
# pages of 768 KiB 1.3 ms), and a batch copied in one run holds the lock for larger pieces
# (``vectored.HOLD_LOCK_ALONE_BELOW``); SGLang's usual batches go whole in the caller's thread.
MIN_PLANE_CHUNK_BYTES = 32 << 20
# Pages that are copied (layouts other than page-first) through scratch buffers: at most this
# many bytes of them per run, the scratch memory one thread holds.
MAX_COPIED_CHUNK_BYTES = 16 << 20


_Method = TypeVar("_Method", bound=Callable[..., Any])


def guarded(default: Any) -> Callable[[_Method], _Method]:
    """Decorate a ``HiCacheFS`` method so that an unexpected exception never reaches SGLang: it
    is logged as an internal error (once per kind, ``_internal_error``) and the call returns
    ``default``, or ``default(*args, **kwargs)`` when it is callable (for a default made from the
    call's arguments, like ``[False] * len(keys)``)."""
    def decorate(method: _Method) -> _Method:
        @functools.wraps(method)
        def call(self: "HiCacheFS", *args: Any, **kwargs: Any) -> Any:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:
                self._internal_error(method.__name__, exc)
                return default(*args, **kwargs) if callable(default) else default
        return call  # type: ignore[return-value]
    return decorate


def _all_failed(keys: Sequence[Any], *_: Any, **__: Any) -> List[bool]:
    """A batch's answer when the whole call failed: every page failed."""
    return [False] * len(keys)


# extra_config's keys: HiCacheFS's own, and those SGLang puts there for every backend (its
# dynamic factory's, the controller's interface_v1, those its controller takes out first
# in some versions and leaves in others, the radix cache's file_storage_path default and the
# host pool's allocator choice).
OWN_KEYS = ("mountpoint", "read_threads", "write_threads", "data_plane", "commit_behind",
            "plane_verify_reads", "plain_directory")
SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size",
               "prefetch_threshold", "prefetch_timeout_base", "prefetch_timeout_per_ki_token",
               "hicache_storage_pass_prefix_keys", "file_storage_path", "allocator")


def check_keys(extra: Dict[str, Any]) -> None:
    """A key of neither list is a mistake (a misspelled ``read_thread`` would be ignored)."""
    unknown = sorted(str(key) for key in extra if key not in OWN_KEYS and key not in SGLANG_KEYS)
    if unknown:
        raise ValueError(f"hicachefs: unknown extra_config key(s) {', '.join(map(repr, unknown))}; "
                         f"hicachefs knows {', '.join(OWN_KEYS)} (beside SGLang's own "
                         f"{', '.join(SGLANG_KEYS)})")


def mountpoint_setting(extra: Dict[str, Any]) -> str:
    """extra_config's ``mountpoint``, or env ``HICACHEFS_MOUNTPOINT``: a path, with ``~`` and
    ``$VARIABLES`` expanded and made absolute from the working directory SGLang runs in; one
    that cannot name the directory meant (not a string or path, a NUL byte, whitespace at its
    ends, a variable not set or a user not known, which a shell would leave or drop) is refused."""
    value = extra.get("mountpoint")
    if value is None or value == "":
        value = os.environ.get("HICACHEFS_MOUNTPOINT")
        if not value:
            raise ValueError("hicachefs: no mountpoint; set extra_config['mountpoint'] "
                             "or HICACHEFS_MOUNTPOINT")
    path = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(path, str):
        raise ValueError(f"hicachefs: the mountpoint must be a path (a string), not {value!r}")
    path = os.path.expandvars(os.path.expanduser(path))
    if "\0" in path or path != path.strip():
        raise ValueError(f"hicachefs: the mountpoint {value!r} is not a usable path "
                         "(a NUL byte, or whitespace at its ends)")
    if path.startswith("~") or re.search(r"\$(\w|\{)", path):
        raise ValueError(f"hicachefs: the mountpoint {value!r} names a variable that is not set, "
                         "or a user that does not exist")
    return os.path.abspath(path)


def threads_setting(extra: Dict[str, Any], key: str) -> int:
    """extra_config's ``key``: an integer from 1 (one page at a time) to 64."""
    value = extra.get(key, DEFAULT_THREADS[key])
    if isinstance(value, bool) or not isinstance(value, (int, str)) or \
            not str(value).strip().isdecimal() or not 1 <= int(value) <= MAX_THREADS:
        raise ValueError(f"hicachefs: extra_config {key} must be an integer from 1 to "
                         f"{MAX_THREADS}, not {value!r}")
    return int(value)


def switch_setting(extra: Dict[str, Any], key: str, default: Optional[bool]) -> Optional[bool]:
    """extra_config's ``key``: true or false (JSON booleans, or the strings), else ``default``."""
    value = extra.get(key, default)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        value = value.strip().lower() in ("true", "1")
    if value is not default and not isinstance(value, bool):
        raise ValueError(f"hicachefs: extra_config {key} must be true or false, not {value!r}")
    return value


class HiCacheFS(HiCacheStorage):
    """SGLang HiCache storage backend on a hicachefs mount. See the module docstring.

    ``HiCacheFS(storage_config, kwargs)`` as SGLang's backend factory calls it;
    ``storage_config.extra_config["mountpoint"]`` (or env ``HICACHEFS_MOUNTPOINT``) names the
    mount; until it is a hicachefs mount, nothing is stored (``PageIO.served``), unless
    ``plain_directory`` says to serve a plain directory. The host pools arrive later through
    ``register_mem_pool_host`` (KV) and ``register_mem_host_pool_v2`` (every named pool).
    """

    def __init__(self, storage_config: Any = None, kwargs: Optional[dict] = None) -> None:
        self.storage_config = storage_config
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        check_keys(extra)
        self.mountpoint = mountpoint_setting(extra)
        self.shard = paths.ShardIdentity.from_storage_config(storage_config)
        self.model = paths.model_segment(getattr(storage_config, "model_name", None))
        self.failures = FailureLog()
        self._refusals = FailureLog()  # bad keys and misuse: logged once for good
        self.counters = Counters()
        self.io = PageIO(self.mountpoint, self.failures, self.counters,
                         data_plane=switch_setting(extra, "data_plane", True),
                         verify_reads=switch_setting(extra, "plane_verify_reads", None),
                         commit_behind=switch_setting(extra, "commit_behind", True),
                         plain_directory=switch_setting(extra, "plain_directory", False))
        self.read_threads = PageThreads(threads_setting(extra, "read_threads"))
        self.write_threads = PageThreads(threads_setting(extra, "write_threads"))
        self.mem_pool_host = None
        self.registered_pools: Dict[Any, Any] = {}
        self._layouts: Dict[str, Optional[PageLayout]] = {}
        self._layouts_lock = threading.Lock()
        self._pool_dirs: Dict[Tuple[str, str], str] = {}
        self._metrics_enabled = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._metrics_lock = threading.Lock()
        self._metrics = storage_metrics_class()()
        forks.renew_in_child(self)
        logger.info("hicachefs client: mount %s, model %s, shard %s", self.mountpoint,
                    self.model, self.shard.segment(KV))

    def forked(self) -> None:
        """In a forked child: a thread of the parent's may have held a lock at the fork."""
        self._layouts_lock = threading.Lock()
        self._metrics_lock = threading.Lock()

    # ---------------------------------------------------------------- registration

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        self._registered(KV)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        self.registered_pools[host_pool_name] = host_pool
        self._registered(pool_name_str(host_pool_name))

    @guarded(None)
    def _registered(self, name: str) -> None:
        """A pool's host buffers are known: its layout is made anew, and the data plane attached
        and told its directory now, while SGLang starts (its first call would wait for them)."""
        with self._layouts_lock:
            self._layouts.pop(name, None)
        self.io.prepare(self._dir_of(name))

    def _host_pool(self, name: str) -> Any:
        for registered, pool in list(self.registered_pools.items()):
            if pool_name_str(registered) == name:
                return resolve_pool(pool, registered)
        if name == KV and self.mem_pool_host is not None:
            return resolve_pool(self.mem_pool_host, PoolName.KV)
        return None

    def _layout(self, name: str) -> Optional[PageLayout]:
        layout = self._layouts.get(name)
        if layout is not None:
            return layout
        with self._layouts_lock:
            if self._layouts.get(name) is None:
                pool = self._host_pool(name)
                if pool is None:
                    return None
                self._layouts[name] = PageLayout(pool, name)
                logger.info("hicachefs client: pool %s -> %s (%d bytes per page, %s)", name,
                            self._pool_dir(name, self._layouts[name]),
                            self._layouts[name].page_bytes,
                            "zero copy" if self._layouts[name].zero_copy
                            else "a marker: its pages hold no bytes" if self._layouts[name].marker else "copied")
            return self._layouts[name]

    def _pool_dir(self, name: str, layout: Optional[PageLayout]) -> str:
        """A pool's directory (made once: every call asks it); ``_`` as the format while no host
        pool says what it is."""
        fmt, rank_heads = (layout.format, layout.rank_heads) if layout is not None else ("_", False)
        known = self._pool_dirs.get((name, fmt, rank_heads))
        if known is None:
            known = self._pool_dirs[name, fmt, rank_heads] = paths.pool_dir(
                self.model, fmt, self.shard.segment(name, rank_heads), name)
        return known

    def _dir_of(self, name: str) -> str:
        return self._pool_dir(name, self._layout(name))

    # ---------------------------------------------------------------- keys and failures

    def _valid(self, key: Any) -> bool:
        problem = paths.key_problem(key)
        if problem is None:
            return True
        self.counters.add(refused_keys=1)
        self._refusals.failure("INVALID_KEY", f"refused page key {str(key)[:80]!r}: {problem}",
                               level=logging.ERROR)
        return False

    def _valid_indices(self, keys: Sequence[Any]) -> List[int]:
        """Indices of the valid keys (SGLang's are all valid: checked at once)."""
        if paths.all_hex_keys(keys):
            return list(range(len(keys)))
        return [i for i, key in enumerate(keys) if self._valid(key)]

    def _internal_error(self, method: str, exc: BaseException) -> None:
        kind = f"INTERNAL_{type(exc).__name__}"
        self.failures.failure(kind, f"{method} failed: {exc!r}", level=logging.ERROR)
        logger.debug("hicachefs client: %s failed", method, exc_info=True)

    # ---------------------------------------------------------------- page transfers

    def _transfer_plan(self, name: str, keys: Sequence[str], host_indices: Any):
        """(layout, page starts, indices of valid keys) for one pool's batch, or None if
        the batch cannot be served (no pool, indices that do not cover the keys)."""
        if not keys:
            return None
        layout = self._layout(name)
        if layout is None:
            self._refusals.failure(f"NO_POOL_{name}", f"no host pool registered for {name!r}")
            return None
        starts = layout.page_starts(host_indices, len(keys))
        if starts is None:
            self._refusals.failure("BAD_INDICES", f"{name}: host indices do not cover "
                                   f"{len(keys)} pages of {layout.page_size} tokens")
            return None
        return layout, starts, self._valid_indices(keys)

    def _copyable(self, name: str, layout: PageLayout) -> bool:
        """Whether the pool's pages can be copied (``get_data_page``): a pool without flat pages
        is served by zero copy alone; a call that would copy them is refused, logged once."""
        if not layout.flat_page:
            self._refusals.failure(f"NO_FLAT_PAGE_{name}", f"pool {name} ({type(layout.pool).__name__}) has "
                                   "no flat pages (get_data_page is not implemented): only the zero-copy "
                                   "calls (batch_get_v1, batch_set_v1, the v2 calls) serve it",
                                   level=logging.ERROR)
        return layout.flat_page

    def _page_buffers(self, name: str, layout: PageLayout,
                      starts: Sequence[int]) -> Tuple[bool, Optional[List[List[memoryview]]]]:
        """(whether the batch can be served, its zero-copy buffers or None to copy). A batch whose
        host indices reach past the pool fails whole and leaves zero copy on for the pool's next
        batches (turned off, every later batch was copied until a restart)."""
        try:
            zero_copy = layout.zero_copy_buffers(starts)
        except IndicesOutsidePool as exc:
            self._refusals.failure("BAD_INDICES", f"{name}: {exc}")
            return False, None
        return zero_copy is not None or self._copyable(name, layout), zero_copy

    @guarded(False)
    def _run_of_pages(self, transfer: Callable[[int], bool], run: int) -> bool:
        """``transfer(run)`` on a page thread: an unexpected exception fails that run alone."""
        return transfer(run)

    def _chunks(self, count: int, page_bytes: int, threads: int, copied: bool) -> List[range]:
        """The batch cut into runs of pages, one request each, spread over ``threads``: runs of
        at least ``MIN_CHUNK_BYTES`` (fewer requests: a run of small pages is one 1 MiB
        request; ``MIN_PLANE_CHUNK_BYTES`` through the data plane), and, when pages are copied
        through scratch buffers, at most ``MAX_COPIED_CHUNK_BYTES`` (the scratch memory a thread
        holds)."""
        smallest = MIN_PLANE_CHUNK_BYTES if self.io.plane_attached() else MIN_CHUNK_BYTES
        per_chunk = max(-(-count // threads), -(-smallest // page_bytes))
        if copied:
            per_chunk = min(per_chunk, max(1, MAX_COPIED_CHUNK_BYTES // page_bytes))
        return [range(i, min(i + per_chunk, count)) for i in range(0, count, per_chunk)]

    def _read_pages(self, name: str, keys: Sequence[str], host_indices: Any) -> List[bool]:
        results = [False] * len(keys)
        plan = self._transfer_plan(name, keys, host_indices)
        if plan is None:
            return results
        layout, starts, wanted = plan
        directory = self._pool_dir(name, layout)
        servable, zero_copy = self._page_buffers(name, layout, [starts[i] for i in wanted])
        if not servable:
            return results
        chunks = self._chunks(len(wanted), layout.page_bytes, self.read_threads.threads, zero_copy is None)

        def read(c: int) -> bool:
            chunk = [wanted[j] for j in chunks[c]]
            rels = [f"{directory}/{keys[i]}" for i in chunk]
            if zero_copy is not None:
                done = self.io.read_pages(rels, [zero_copy[j] for j in chunks[c]], layout.page_bytes,
                                          len(chunks) == 1)
            else:
                buffers, store = layout.copy_read_buffers(len(chunk))  # this thread's own
                done = self.io.read_pages(rels, buffers, layout.page_bytes)
                for slot, (i, ok) in enumerate(zip(chunk, done)):
                    if ok:
                        store(slot, starts[i])
            for i, ok in zip(chunk, done):
                results[i] = ok
            return all(done)

        self.read_threads.run(functools.partial(self._run_of_pages, read), len(chunks))
        return results

    def _write_pages(self, name: str, keys: Sequence[str], host_indices: Any) -> List[bool]:
        results = [False] * len(keys)
        plan = self._transfer_plan(name, keys, host_indices)
        if plan is None:
            return results
        layout, starts, wanted = plan
        if not self.shard.writes(name, layout.rank_heads):
            # Replicated MLA pages have one writer rank; the others succeed without writing.
            for i in wanted:
                results[i] = True
            return results
        directory = self._pool_dir(name, layout)
        # Pages already stored are kept as they are (``PageIO.publish_pages``): all are sent.
        servable, zero_copy = self._page_buffers(name, layout, [starts[i] for i in wanted])
        if not servable:
            return results
        chunks = self._chunks(len(wanted), layout.page_bytes, self.write_threads.threads, zero_copy is None)
        if zero_copy is not None and self.io.plane_attached():  # one commit, the copies spread
            spread = lambda copy, runs: self.write_threads.run(functools.partial(self._run_of_pages, copy), runs)  # noqa: E731
            done = self.io.publish_pages(directory, [keys[i] for i in wanted], zero_copy, layout.page_bytes,
                                         spread, len(chunks))
            for i, ok in zip(wanted, done):
                results[i] = ok
            return results

        def write(c: int) -> bool:
            chunk = [wanted[j] for j in chunks[c]]
            if zero_copy is not None:
                buffers = [zero_copy[j] for j in chunks[c]]
            else:
                buffers = [layout.copy_write_buffers(starts[i]) for i in chunk]
                whole = [j for j, page in enumerate(buffers) if len(page[0]) == layout.page_bytes]
                if len(whole) < len(chunk):  # not a page: it fails alone (sent, it would shift the rest)
                    self._refusals.failure("WRONG_PAGE_SIZE", f"{name}: get_data_page gave a flat page of "
                                           f"another size than the pool's {layout.page_bytes} bytes",
                                           level=logging.ERROR)
                    self.counters.add(write_failures=len(chunk) - len(whole))
                    chunk, buffers = [chunk[j] for j in whole], [buffers[j] for j in whole]
            done = self.io.publish_pages(directory, [keys[i] for i in chunk], buffers, layout.page_bytes) \
                if chunk else []
            for i, ok in zip(chunk, done):
                results[i] = ok
            return all(done)

        self.write_threads.run(functools.partial(self._run_of_pages, write), len(chunks))
        return results

    def _record(self, kind: str, pages: int, seconds: float, page_bytes: int) -> None:
        if not self._metrics_enabled or pages == 0:
            return
        bandwidth = pages * page_bytes / _GB / max(seconds, 1e-9)
        with self._metrics_lock:
            counts = getattr(self._metrics, f"{kind}_pgs")
            if len(counts) < _MAX_METRIC_SAMPLES:
                counts.append(pages)
                getattr(self._metrics, f"{kind}_bandwidth").append(bandwidth)

    def _timed(self, kind: str, name: str, op, keys, host_indices) -> List[bool]:
        started = time.perf_counter()
        results = op(name, keys, host_indices)
        layout = self._layouts.get(name)
        if layout is not None:
            self._record(kind, sum(results), time.perf_counter() - started, layout.page_bytes)
        return results

    # ---------------------------------------------------------------- SGLang: v1 (zero copy)

    @guarded(_all_failed)
    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> List[bool]:
        """Read the KV pages ``keys`` into the host pool at ``host_indices`` (one page each)."""
        return self._timed("prefetch", KV, self._read_pages, list(keys), host_indices)

    @guarded(_all_failed)
    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Any = None) -> List[bool]:
        """Store the KV pages at ``host_indices`` under ``keys``; existing pages are kept."""
        return self._timed("backup", KV, self._write_pages, list(keys), host_indices)

    # ---------------------------------------------------------------- SGLang: v2 (named pools)

    def batch_get_v2(self, transfers: List[PoolTransfer], extra_info: Any = None
                     ) -> Dict[Any, List[bool]]:
        return {t.name: self._pool_transfer("prefetch", self._read_pages, t) for t in transfers}

    def batch_set_v2(self, transfers: List[PoolTransfer], extra_info: Any = None
                     ) -> Dict[Any, List[bool]]:
        return {t.name: self._pool_transfer("backup", self._write_pages, t) for t in transfers}

    @guarded(lambda kind, transfer_pages, transfer: [False] * len(transfer.keys or []))
    def _pool_transfer(self, kind: str, transfer_pages, transfer: PoolTransfer) -> List[bool]:
        """Run ``transfer_pages`` for one pool's transfer: a failing pool fails alone."""
        return self._timed(kind, pool_name_str(transfer.name), transfer_pages, list(transfer.keys or []),
                           transfer.host_indices)

    # ---------------------------------------------------------------- SGLang: existence

    def _present(self, name: str, keys: Sequence[str]) -> List[bool]:
        """Whether each page of pool ``name`` is published; invalid keys are absent."""
        directory = self._dir_of(name)
        wanted = self._valid_indices(keys)
        answers = [False] * len(keys)
        for i, there in zip(wanted, self.io.exists_in(directory, [keys[i] for i in wanted], self._page_bytes(name))):
            answers[i] = there
        return answers

    @guarded(False)
    def exists(self, key: str) -> bool:
        return self._present(KV, [key])[0]

    @guarded(0)
    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """How many of ``keys``, from the first, are stored: through the plane, none is probed
        past the first one missing (as ``HiCacheFile`` stops there); one query for the rest.
        The plane is asked before the keys are checked (a key that is no valid name is in no
        index), and only the key it stopped at is: checking them all first cost a tenth of
        the call under SGLang."""
        keys = list(keys)
        return self.io.held_prefix(self._dir_of(KV), keys, self._valid_prefix, self._page_bytes(KV))

    def _page_bytes(self, name: str) -> Optional[int]:
        """The size of pool ``name``'s pages, which alone its reads take (None while no host pool
        says it): a page of another size under a key is not counted, so SGLang writes it again."""
        layout = self._layout(name)
        return layout.page_bytes if layout is not None else None

    def _valid_prefix(self, keys: Sequence[Any]) -> int:
        """How many of ``keys``, from the first, are valid (the first invalid one is refused)."""
        if paths.all_hex_keys(keys):
            return len(keys)
        return next((i for i, key in enumerate(keys) if not self._valid(key)), len(keys))

    @guarded(lambda *_, **__: PoolTransferResult.empty())
    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Any = None) -> PoolTransferResult:
        """The longest restorable prefix across the KV pool and the transfers' pools.

        One query asks for every page of every pool. Per pool hit policy, as SGLang's:
        ``ALL_PAGES``: pages [0, n) of the pool must all exist for a prefix of n pages;
        ``TRAILING_PAGES``: only the last ``len(transfer.keys)`` (at least 1) pages of the
        prefix must. A prefix is restorable when every pool allows it; the result is the
        longest one, with each pool's own boundary and the list of restorable lengths. A pool
        with another policy gets no verdict and does not limit the prefix.
        """
        return self._exists_v2(list(keys), list(pool_transfers or []))

    def _exists_v2(self, keys: List[str], transfers: List[PoolTransfer]) -> PoolTransferResult:
        names = [KV] + [pool_name_str(t.name) for t in transfers]
        rels, sizes, slots = [], [], {}
        valid = self._valid_indices(keys)
        for name in dict.fromkeys(names):
            directory, size = self._dir_of(name), self._page_bytes(name)
            for i in valid:
                slots[(name, i)] = len(rels)
                rels.append(f"{directory}/{keys[i]}")
                sizes.append(size)
        answers = self.io.exists(rels, sizes)

        def has(name: str, i: int) -> bool:
            slot = slots.get((name, i))
            return slot is not None and answers[slot]

        kv_pages = next((i for i in range(len(keys)) if not has(KV, i)), len(keys))
        hits: Dict[Any, int] = {PoolName.KV: kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for transfer in transfers:
            if not restorable:
                break
            name = pool_name_str(transfer.name)
            policy = transfer.hit_policy
            if policy == PoolHitPolicy.ALL_PAGES:
                boundary = next((i for i in range(kv_pages) if not has(name, i)), kv_pages)
                allowed = set(range(1, boundary + 1))
            elif policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(transfer.keys) if transfer.keys else 1)
                # run[n] = how many pages just before n (exclusive) the pool holds in a row.
                allowed, run = set(), 0
                for length in range(1, kv_pages + 1):
                    run = run + 1 if has(name, length - 1) else 0
                    if run >= min(window, length):
                        allowed.add(length)
                boundary = max(allowed, default=0)
            else:
                self._refusals.failure(f"POLICY_{policy}", f"pool {name}: hit policy {policy} "
                                       "is not supported; the pool gets no verdict",
                                       level=logging.INFO)
                continue
            if boundary:
                hits[transfer.name] = boundary
            restorable = [n for n in restorable if n in allowed]
        return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)

    # ---------------------------------------------------------------- SGLang: legacy API

    @guarded(None)
    def get(self, key: str, target_location: Any = None, target_sizes: Any = None
            ) -> Optional[torch.Tensor]:
        """Read KV page ``key`` into ``target_location`` (a tensor; a flat page if None)."""
        if not self._valid(key):
            return None
        target = target_location
        if target is None:
            layout = self._layout(KV)
            if layout is None or not self._copyable(KV, layout):
                return None
            target = layout.pool.get_dummy_flat_data_page()
        direct = target.device.type == "cpu" and target.is_contiguous()
        staging = target if direct else torch.empty(target.shape, dtype=target.dtype)
        view = memoryview(staging.reshape(-1).view(torch.uint8).numpy()).cast("B")
        if not self.io.read_page(f"{self._dir_of(KV)}/{key}", [view], len(view), check_longer=True):
            return None
        if not direct:
            target.copy_(staging)
        return target

    def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None
                  ) -> List[Optional[torch.Tensor]]:
        locations = list(target_locations) if target_locations is not None else [None] * len(keys)
        return [self.get(key, location) for key, location in zip(keys, locations)]

    @guarded(False)
    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        """Store tensor ``value`` as KV page ``key``; True if it is stored (or already was)."""
        if not self._valid(key):
            return False
        if value is None:
            value = target_location
        if not isinstance(value, torch.Tensor):
            self._refusals.failure("SET_WITHOUT_TENSOR", "set() needs a tensor value")
            return False
        layout = self._layout(KV)
        if not self.shard.writes(KV, layout is not None and layout.rank_heads):
            return True
        data = tensor_bytes(value)
        if layout is not None and len(data) != layout.page_bytes:  # no read takes it, and it blocks the page
            self._refusals.failure("WRONG_PAGE_SIZE", f"set() was given {len(data)} bytes; the pool's "
                                   f"pages hold {layout.page_bytes}", level=logging.ERROR)
            self.counters.add(write_failures=1)
            return False
        directory = self._dir_of(KV)
        if self.io.exists_in(directory, [key], len(data))[0]:
            self.counters.add(pages_skipped=1)
            return True
        return self.io.publish_page(directory, key, [data], len(data))

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        if values is None:
            values = target_locations
        if values is None:
            return False
        return all(self.set(key, value) for key, value in zip(keys, values))

    # ---------------------------------------------------------------- housekeeping

    @guarded(False)
    def clear(self) -> bool:
        """Remove this rank's own shard directories (``rm -r``, which evicts their pages).

        Replicated (MLA) shards belong to their writer rank; other ranks leave them alone.
        """
        names = {KV} if self.mem_pool_host is not None else set()
        names.update(pool_name_str(n) for n in list(self.registered_pools))
        shard_dirs = set()
        for name in names:
            layout = self._layout(name)
            if layout is not None and self.shard.writes(name, layout.rank_heads):
                shard_dirs.add(f"{self.model}/{layout.format}/{self.shard.segment(name, layout.rank_heads)}")
        ok = all([self.io.remove_tree(d) for d in sorted(shard_dirs)])
        if ok:
            logger.info("hicachefs client: cleared %s", ", ".join(sorted(shard_dirs)) or
                        "nothing (no pools registered)")
        return ok

    def statistics(self) -> Dict[str, Any]:
        """Counters since construction: hits, misses, bytes, failures by kind, refused keys, and
        what went through the data plane (``plane_reads``, ``plane_writes``, ``plane_retries``:
        copies made again because their page changed under them, ``plane_requests``). For tools:
        it waits for the commits under way (``settle``), which count their pages once answered."""
        self.settle()
        return self._counts()

    def _counts(self) -> Dict[str, Any]:
        """The counters as they are now; pages whose commit is under way are not in them yet."""
        stats: Dict[str, Any] = self.counters.snapshot()
        stats["errors"] = self.failures.counts()
        stats["refused"] = self._refusals.counts()
        return stats

    def settle(self) -> None:
        """Wait until every page this process was told is stored can be read by others too (a
        write through the data plane returns once its pages are in the daemon's memory; its
        commit is answered a round trip later)."""
        if self.io.plane is not None:
            self.io.plane.settle()

    def report_reads(self) -> None:
        """Tell the daemon now of the reads made through the data plane that it has not counted
        yet (they are sent every half second anyway): for tools that read the daemon's
        statistics right after their reads."""
        if self.io.plane is not None:
            self.io.plane.reports.send_now()

    def get_stats(self):
        """SGLang's ``StorageMetrics`` (per-batch samples since the last call, when
        ``enable_storage_metrics``), with ``.counters``: the counters of ``statistics()`` as they
        are now. SGLang calls it on its scheduler thread every step: it waits for no commit
        under way (those pages are counted at a later call; ``settle()`` first for all of them)."""
        with self._metrics_lock:
            metrics, self._metrics = self._metrics, storage_metrics_class()()
        metrics.counters = self._counts()
        return metrics

    def close(self) -> None:
        self.io.close()
        self.read_threads.close()
        self.write_threads.close()
