"""SGLang 0.5.23's own radix cache and cache controller, on the CPU, over a storage backend.

``SGLangCache`` is one rank of an SGLang server's KV cache: SGLang's own device pools on device
``cpu`` (``sglang_pools``: MHA, MLA, or a hybrid model's KV beside Mamba states or a sliding
window's KV), and SGLang's ``UnifiedRadixCache`` whose ``init_hicache`` builds the host pool
group and a ``HybridCacheController`` with its storage backend and its prefetch, prefetch-IO,
prefetch-sync and backup threads. The backend comes from SGLang's own factory: ``HiCacheFS``
exactly as a user loads it (``dynamic``, ``module_path: hicachefs_client``, ``interface_v1``)
or SGLang's ``HiCacheFile``. A ``RecordingBackend`` between controller and backend times and
checks every call.

``serve`` plays the scheduler's part for a set of requests that arrive together, with
SGLang's own objects and in the scheduler's order (``managers/scheduler.py``,
``schedule_policy.py``): a ``Req`` matched against the tree, the storage prefetch SGLang issues
for it, SGLang's prefetch stop policy deciding when it may be admitted, the host-to-device
load-back, then "prefill" (the harness writes each new page's KV, in both pools of a
sliding-window hybrid, and in a Mamba hybrid the state the sequence ends in, ``sglang_kv``) and
the release that inserts the request into the tree, from which SGLang's write policy backs
pages up to host and storage. Every hit it reports is SGLang's decision.

Ranks of a TP group (``tp_group``, a gloo group; one process each) run the same requests.
SGLang's cache reduces across them at every event drain and load-back, so the ranks must make
the same calls in the same order: wherever the harness waits on time (storage threads going
quiet, backups settling), the ranks agree on when to stop (``_agree``).

Stand-ins are in ``sglang_cpu`` (GPU plumbing only); here, the rank (one, or one of a gloo
group) is stated with ``get_parallel().override(...)`` as SGLang's test kit does. Not
thread-safe: one thread plays the scheduler, as in SGLang.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import time
from array import array
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from . import sglang_cpu

sglang_cpu.install()

import torch  # noqa: E402
from sglang.kernels.ops.attention.fla.chunk_delta_h import CHUNK_SIZE as MAMBA_CHUNK_TOKENS  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import evict_from_tree_cache, release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import PoolName  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.mem_cache.utils import get_hash_str  # noqa: E402
from sglang.srt.runtime_context import get_parallel  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402

from .sglang_kv import PageKV, StateKV  # noqa: E402
from .sglang_pools import MambaShape, ModelShape, SlidingWindow, build_device_pools  # noqa: E402,F401 - shapes: for callers
from .sglang_recorder import RecordingBackend  # noqa: E402

#: How long the harness waits for SGLang's threads (a prefetch, a backup) before it fails.
SETTLE_TIMEOUT_S = 60.0
#: The scheduler polls its waiting requests once the storage threads are quiet this long: a
#: step of a busy server (prefill and decode of other requests) outlasts SGLang's I/O, so the
#: best_effort and timeout policies see a prefetch as far as its I/O got, as on a GPU server.
QUIET_S = 0.004


@dataclass(frozen=True)
class CacheSetup:
    """What an SGLang server is launched with, as far as its KV cache goes."""

    model: ModelShape
    page_size: int = 16
    device_pages: int = 128
    host_ratio: float = 2.0  # --hicache-ratio: host pool size over device pool size
    layout: str = "page_first_direct"  # --hicache-mem-layout
    write_policy: str = "write_through"  # --hicache-write-policy
    prefetch_policy: str = "wait_complete"  # --hicache-storage-prefetch-policy
    prefetch_threshold: int = 0  # extra_config prefetch_threshold, tokens; 0: one page
    storage_metrics: bool = False  # --enable-metrics: SGLang's storage metrics (one collector a process)
    max_context: int = 8192


@dataclass(frozen=True)
class Backend:
    """Which storage backend SGLang's factory builds: ``hicachefs`` on a mount, or ``file``."""

    kind: str  # "hicachefs" or "file"
    path: str  # the mountpoint, or HiCacheFile's directory
    extra: Dict[str, Any] = field(default_factory=dict)

    def server_args(self) -> Dict[str, Any]:
        if self.kind == "hicachefs":
            config = {"backend_name": "hicachefs", "module_path": "hicachefs_client",
                      "class_name": "HiCacheFS", "interface_v1": 1, "mountpoint": self.path}
            return {"hicache_storage_backend": "dynamic", "extra": {**config, **self.extra}}
        if self.kind == "file":
            return {"hicache_storage_backend": "file", "extra": {"file_storage_path": self.path, **self.extra}}
        raise ValueError(f"unknown backend {self.kind!r}")


@dataclass
class Turn:
    """One request: the prompt, and the reply tokens the "model" decodes for it."""

    prompt: List[int]
    reply: List[int]


@dataclass
class RequestResult:
    """What SGLang's cache gave one request, in pages."""

    rid: str
    prompt_pages: int
    matchable_pages: int  # full pages a match may cover (SGLang keeps the last prompt token out)
    arrival_device_hit: int  # in the device pool when the request arrived
    arrival_host_hit: int  # in the host pool when it arrived
    device_hit: int  # matched on the device at admission (before load-back)
    host_hit: int  # loaded back from the host pool (includes what storage prefetched)
    storage_hit: int  # prefetched from storage into the host pool for this request
    wrong_pages: int  # prefix pages on the device after load-back without their bytes


def page_keys(tokens: Sequence[int], page_size: int) -> List[str]:
    """SGLang's storage keys of the full pages of ``tokens`` (``get_hash_str``)."""
    full = len(tokens) // page_size * page_size
    return list(get_hash_str(list(tokens[:full]), None, page_size=page_size)) if full else []


class SGLangCache:
    """One rank of an SGLang server's KV cache over a backend. See the module docstring."""

    def __init__(self, setup: CacheSetup, backend: Backend, tp_rank: int = 0, tp_size: int = 1,
                 tp_group: Optional[Any] = None) -> None:
        self.setup = setup
        self.tp_group = tp_group if tp_size > 1 else None
        ps = setup.page_size
        os.environ.pop("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", None)  # the backend's path wins
        storage = backend.server_args()
        extra = {"prefetch_threshold": setup.prefetch_threshold or ps, **storage["extra"]}
        self.server_args = ServerArgs(
            model_path="dummy", served_model_name=setup.model.name, page_size=ps,
            enable_hierarchical_cache=True, hicache_ratio=setup.host_ratio,
            hicache_io_backend="direct", hicache_mem_layout=setup.layout,
            hicache_write_policy=setup.write_policy,
            hicache_storage_backend=storage["hicache_storage_backend"],
            hicache_storage_backend_extra_config=json.dumps(extra),
            hicache_storage_prefetch_policy=setup.prefetch_policy,
            enable_metrics=setup.storage_metrics)
        if setup.model.mamba is not None:
            # What SGLang's model runner reads from the model's config (there is none here):
            # the state's chunk, as SGLang's own test kit sets it.
            self.server_args._mamba_cache_chunk_size = max(MAMBA_CHUNK_TOKENS, ps)
        set_global_server_args_for_scheduler(self.server_args)
        # Attention and MoE span the whole TP group (no DP attention, no expert parallelism).
        self._parallel = get_parallel().override(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                                                 attn_tp_rank=tp_rank, attn_tp_size=tp_size,
                                                 moe_tp_rank=tp_rank, moe_tp_size=tp_size)
        self._parallel.__enter__()
        pools = build_device_pools(setup.model, ps, setup.device_pages, setup.max_context)
        self.device_pool, self.allocator = pools.kv_pool, pools.allocator
        self.req_to_token_pool = pools.req_to_token_pool
        params = CacheInitParams(
            req_to_token_pool=self.req_to_token_pool, token_to_kv_pool_allocator=self.allocator,
            page_size=ps, disable=False, tree_components=pools.components, tp_cache_group=tp_group,
            sliding_window_size=pools.sliding_window, enable_metrics=setup.storage_metrics)
        self.cache = UnifiedRadixCache(params=params)
        self.cache.init_hicache(self.server_args, params)
        atexit.unregister(self.cache.shutdown)  # close() detaches; atexit would pin the pools
        self.controller = self.cache.cache_controller
        host_pools = self.controller.mem_pool_host.entry_map
        self.kv = PageKV(self.device_pool, ps, seed=tp_rank)
        checks = {"kv": (self.kv, self.controller.storage_host_pool)}
        self.states = self.window_kv = None
        self.window = pools.sliding_window
        if pools.mamba_pool is not None:
            self.states = StateKV(pools.mamba_pool, seed=1000 + tp_rank)
            checks["mamba"] = (self.states, host_pools[PoolName.MAMBA].host_pool)
        if pools.window_pool is not None:
            self.window_kv = PageKV(pools.window_pool, ps, seed=2000 + tp_rank)
            checks["swa"] = (self.window_kv, host_pools[PoolName.SWA].host_pool)
        self.recorder = RecordingBackend(self.controller.storage_backend, checks)
        self.controller.storage_backend = self.recorder
        self.backend = self.recorder.backend
        self._next_rid = 0
        self.results: List[RequestResult] = []

    # ------------------------------------------------------------------ keys

    def page_keys(self, tokens: Sequence[int]) -> List[str]:
        """SGLang's storage keys of the full pages of ``tokens``."""
        return page_keys(tokens, self.setup.page_size)

    # ------------------------------------------------------------------ serving

    def serve(self, turns: Sequence[Turn]) -> List[RequestResult]:
        """Serve requests that arrive together (one scheduler waiting queue); in arrival order
        of admission, what each got."""
        waiting = []
        for turn in turns:
            req = self._new_req(turn)
            req.init_next_round_input(self.cache)
            req.harness_arrival = (req.prefix_len, req.host_hit_length)
            self._prefetch(req)
            waiting.append(req)
        admitted: List[RequestResult] = []
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while waiting:
            self._retry_prefetches(waiting)
            self.cache.check_hicache_events()
            self._quiet()
            for req in list(waiting):
                if not self.cache.check_prefetch_progress(req.cache_request_handle):
                    continue
                loaded, _ = self.cache.pop_prefetch_loaded_span(req.cache_request_handle)
                if loaded > 0:
                    req.storage_hit_length = loaded
                req.init_next_round_input(self.cache)
                if not self._fits(req):
                    break  # AddReqResult.NO_TOKEN: it waits until running requests free memory
                self.cache.storage_prefetch_retries.cancel(req.rid)
                admitted.append(self._admit(req))
                waiting.remove(req)
            if self._agree(time.monotonic() > deadline, any):
                raise TimeoutError(f"{len(waiting)} requests never left the waiting queue")
        self.results += admitted
        return admitted

    def _new_req(self, turn: Turn) -> Req:
        self._next_rid += 1
        req = Req(rid=f"r{self._next_rid}", origin_input_text="", origin_input_ids=array("q", turn.prompt),
                  sampling_params=SamplingParams(temperature=0, max_new_tokens=len(turn.reply) + 1))
        req.harness_reply = list(turn.reply)
        return req

    def _prefetch(self, req: Req) -> None:
        """The scheduler's ``_prefetch_kvcache``: ask storage for what follows the host match."""
        cache = self.cache
        matched = req.prefix_len + req.host_hit_length
        req.storage_prefetch_last_match_len = matched
        if cache.is_backuped(req.last_host_node) or cache.is_root(req.last_host_node):
            fill = req.full_untruncated_fill_ids
            end = req._compute_max_prefix_len(len(fill))
            cache.prefetch_from_storage(
                req.cache_request_handle, req.last_host_node, fill[matched:end],
                cache.get_last_hash_value(req.last_host_node), None,
                matched_prefix_tokens=fill[:matched], extra_key=req.extra_key, cache_salt=req.cache_salt)

    def _retry_prefetches(self, waiting: List[Req]) -> None:
        """The scheduler's ``_process_storage_prefetch_retries`` (rate-limited prefetches)."""
        memory = self.server_args
        for req, hit_end in self.cache.storage_prefetch_retries.pop_ready(
                waiting, memory.hicache_storage_prefetch_retry_poll_interval,
                memory.hicache_storage_prefetch_retry_max_attempts):
            req.storage_prefetch_retry_attempts += 1
            self._prefetch(req)

    def _quiet(self) -> None:
        """Wait (pumping SGLang's events) until no storage operation is under way and no
        storage call has run for QUIET_S. A prefetch counts from its submission until SGLang
        has taken in its result (``ongoing_prefetch``), a backup until its ack is drained: a
        thread holding one between two calls is busy though every queue is empty."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        quiet_since = None
        while not self._agree(time.monotonic() > deadline, any):
            controller = self.controller
            busy = self.recorder.in_flight or self.cache.ongoing_prefetch or self.cache.ongoing_backup or any(
                not q.empty() for q in (
                    controller.prefetch_queue, controller.prefetch_buffer, controller.prefetch_hit_queue,
                    controller.prefetch_sync_queue, controller.ack_prefetch_queue, controller.backup_queue,
                    controller.ack_backup_queue))
            now = time.monotonic()
            if busy:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            if self._agree(quiet_since is not None and now - quiet_since >= QUIET_S, all):
                return
            self.cache.check_hicache_events()
            time.sleep(0.001)
        raise TimeoutError("SGLang's storage threads never went quiet")

    def _agree(self, mine: bool, how) -> bool:
        """``how`` (``any`` or ``all``) of every rank's ``mine``; this rank's alone without a TP
        group. Each rank must call it at the same point (it is a collective)."""
        if self.tp_group is None:
            return bool(mine)
        flag = torch.tensor([int(bool(mine))], dtype=torch.int)
        op = torch.distributed.ReduceOp.MAX if how is any else torch.distributed.ReduceOp.MIN
        torch.distributed.all_reduce(flag, op=op, group=self.tp_group)
        return bool(flag.item())

    def _fits(self, req: Req) -> bool:
        """PrefillAdder's budget: what the request adds fits in free plus evictable slots."""
        need = len(req.origin_input_ids) + len(req.harness_reply) - req.prefix_len + self.setup.page_size
        return self.allocator.available_size() + self.cache.evictable_size() >= need

    def _admit(self, req: Req) -> RequestResult:
        """PrefillAdder.add_one_req's load-back, then prefill, decode and release."""
        cache, ps = self.cache, self.setup.page_size
        device_hit = req.prefix_len
        loaded = 0
        admission_lock = cache.lock(req.last_node)  # PrefillAdder._lock_node
        try:
            if req.needs_host_load_back():
                host_pin = cache.inc_host_lock_ref(req.best_match_node).to_dec_params()
                try:
                    loaded, req.last_node = cache.init_load_back(InitLoadBackParams(
                        best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req))
                finally:
                    cache.dec_host_lock_ref(req.best_match_node, host_pin)
                req.host_loaded_length = loaded
                req.prefix_len += loaded
            # The request's own lock (ScheduleBatch.init_new); released by release_kv_cache.
            req.lock = cache.lock(req.last_node)
        finally:
            cache.unlock(admission_lock)
        cache.ready_to_load_host_cache()
        for ack in list(self.controller.ack_load_queue):
            ack.finish_event.synchronize()
        cache.loading_check()

        tokens = list(req.origin_input_ids) + req.harness_reply
        keys = self.page_keys(tokens)
        prefix = cache.path_device_indices(req.last_node)[:req.prefix_len]
        wrong = len(self.kv.wrong_device_pages(keys[:req.prefix_len // ps], prefix))
        if self.states is not None and req.prefix_len:
            wrong += self._wrong_states(req, keys[req.prefix_len // ps - 1], loaded)
        if self.window_kv is not None and req.prefix_len:
            # What the window layers attend to: the prefix's last window of tokens.
            tail = -(-min(self.window, req.prefix_len) // ps)
            wrong += len(self.window_kv.wrong_device_pages(
                keys[req.prefix_len // ps - tail:req.prefix_len // ps],
                self.allocator.translate_loc_from_full_to_swa(prefix[-tail * ps:])))

        self.req_to_token_pool.alloc([req])  # a hybrid model's request gets its state slot here
        extend = len(tokens) - req.prefix_len
        if self.allocator.available_size() < extend:
            evict_from_tree_cache(cache, extend)
        new = self.allocator.alloc(extend)
        if new is None:
            raise RuntimeError(f"device pool too small for {extend} tokens (evictable: {cache.evictable_size()})")
        indices = torch.cat([prefix.to(torch.int64), new.to(torch.int64)])
        self.kv.prefill(keys[req.prefix_len // ps:], indices[req.prefix_len:len(keys) * ps])
        if self.window_kv is not None:
            self.window_kv.prefill(keys[req.prefix_len // ps:], self.allocator.translate_loc_from_full_to_swa(
                indices[req.prefix_len:len(keys) * ps]))
        self.req_to_token_pool.write((req.kv.req_pool_idx, slice(0, len(tokens))), indices)
        req.kv.cache_protected_len = req.prefix_len
        req.output_ids = array("q", req.harness_reply)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = len(tokens)
        req.finished_reason = FINISH_LENGTH(length=len(req.harness_reply))
        if self.states is not None:
            # The state the forward pass leaves in the request's slot: that of everything the
            # release will insert, named by the last page's key.
            self.states.prefill(keys[req.owned_kv_len() // ps - 1], int(req.kv.mamba_pool_idx))
        release_kv_cache(req, cache, checkpoint=True)
        matchable = req._compute_max_prefix_len(len(req.origin_input_ids)) // ps
        return RequestResult(req.rid, len(req.origin_input_ids) // ps, matchable, req.harness_arrival[0] // ps,
                             req.harness_arrival[1] // ps, device_hit // ps, loaded // ps,
                             req.storage_hit_length // ps, wrong)

    def _wrong_states(self, req: Req, last_key: str, loaded: int) -> int:
        """States of the matched prefix without their bytes: the one the tree keeps for the
        prefix's last node, and, after a load-back, the copy SGLang loaded into the request's
        own slot."""
        node_slot = self.cache.tree_core.get_component_device_value(req.last_node, ComponentType.MAMBA)
        slots = [None if node_slot is None else int(node_slot[0])]
        if loaded:
            slots.append(None if req.kv.mamba_pool_idx is None else int(req.kv.mamba_pool_idx))
        return sum(slot is None or self.states.wrong_device_state(last_key, slot) for slot in slots)

    # ------------------------------------------------------------------ phases

    def settle(self) -> None:
        """Pump SGLang's events until every backup to host and storage has finished."""
        cache = self.cache
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while self._agree(cache.ongoing_write_through or cache.ongoing_backup or cache.ongoing_prefetch or
                          self.recorder.in_flight or not self.controller.backup_queue.empty(), any):
            if self._agree(time.monotonic() > deadline, any):
                raise TimeoutError("SGLang's backups never finished")
            cache.check_hicache_events()
            time.sleep(0.002)
        cache.check_hicache_events()

    def evict_device_and_host(self) -> None:
        """Evict everything evictable from the device pool, then from the host pool (what a
        long stretch of other traffic does); what was written through stays in storage."""
        self.settle()
        self.cache.evict(EvictParams(num_tokens=self.allocator.size))
        self.settle()
        self.cache.evict_host(self.controller.mem_pool_host.size)
        self.settle()

    def close(self) -> None:
        """Detach the backend (SGLang closes it) and free the pools; idempotent."""
        if self.cache is None:
            return
        try:
            self.settle()
        finally:
            self.cache.shutdown()
            self.cache.release_host_resources()
            for collector in (self.cache.storage_metrics_collector, self.cache.metrics_collector):
                _unregister_metrics(collector)
            self._parallel.__exit__(None, None, None)
            self.cache = None


def _unregister_metrics(collector: Any) -> None:
    """SGLang's storage metrics register in prometheus_client's process-wide registry, once per
    process; unregistering them lets a later cache in this process (a test, the demo's second
    server) register its own."""
    if collector is None:
        return
    from prometheus_client import REGISTRY
    from prometheus_client.metrics import MetricWrapperBase

    for metric in vars(collector).values():
        if isinstance(metric, MetricWrapperBase):
            REGISTRY.unregister(metric)


class WarningLog(logging.Handler):
    """Collects the WARNING and ERROR records SGLang and the client log, less the expected ones."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if not any(expected in message for expected in sglang_cpu.EXPECTED_WARNINGS):
            self.records.append(f"{record.levelname} {record.name}: {message}")

    def __enter__(self) -> "WarningLog":
        logging.getLogger().addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger().removeHandler(self)
