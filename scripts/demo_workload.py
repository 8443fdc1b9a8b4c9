"""The demo's serving workload: chat conversations served through HiCacheFS as SGLang serves them.

Conversations share a few system prompts and grow turn by turn, as chat traffic does. Serving a
turn does what SGLang's HiCache does with an L3 backend:
  1. page keys: chained SHA-256 over each full page's token ids (SGLang's scheme: the digest of
     the previous page's digest followed by this page's token ids as little-endian uint32);
  2. ``batch_exists``: how long a prefix is stored;
  3. ``batch_get_v1``: load those pages straight into a CPU host pool laid out as SGLang's MHA
     ``page_first`` pool for a real model's shape, and check every byte;
  4. "prefill" the rest (deterministic bytes derived from each page's key) and ``batch_set_v1``
     the new pages.

A conversation's tokens come from its own random generator, so any server (any host) serving
its next turn builds the same prompt, and so the same page keys. Not thread-safe: one thread
drives a ``Server``.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys
import time
from array import array
from dataclasses import dataclass, fields
from types import SimpleNamespace
from typing import Dict, List, Optional

import numpy as np
import torch

# The demo never hands the backend to SGLang: skip importing it (seconds of start-up).
os.environ.setdefault("HICACHEFS_CLIENT_WITHOUT_SGLANG", "1")
from hicachefs_client import HiCacheFS  # noqa: E402

MODEL_SHAPES = {
    # name: (layers, KV heads, head dim)
    "Qwen/Qwen2.5-0.5B-Instruct": (24, 2, 64),
    "Qwen/Qwen2.5-1.5B-Instruct": (28, 2, 128),
    "meta-llama/Llama-3.2-1B-Instruct": (16, 8, 64),
}
VOCAB = 151_643
STORAGE_BATCH_SIZE = 128  # SGLang's pages per storage call


class PageFirstHostPool:
    """A CPU host KV pool laid out as SGLang's MHATokenToKVPoolHost with layout="page_first".

    ``kv_buffer[2, tokens, layers, heads, head_dim]``; page ``p`` holds tokens
    [p * page_size, (p + 1) * page_size). Provides what storage backends use of a host pool.
    """

    layout = "page_first"
    device = "cpu"

    def __init__(self, pages: int, page_size: int, layers: int, heads: int, head_dim: int,
                 dtype: torch.dtype = torch.bfloat16) -> None:
        self.page_size, self.layer_num, self.head_num, self.head_dim = page_size, layers, heads, head_dim
        self.dtype = dtype
        self.size = (pages + 1) * page_size  # SGLang keeps a padding page
        self.kv_buffer = torch.zeros((2, self.size, layers, heads, head_dim), dtype=dtype)
        self.free_pages = list(range(pages))

    @property
    def page_bytes(self) -> int:
        return 2 * self.page_size * self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize

    def alloc(self, n: int) -> List[int]:
        taken, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return taken

    def free(self, pages: List[int]) -> None:
        self.free_pages.extend(pages)

    def indices(self, pages: List[int]) -> torch.Tensor:
        if not pages:
            return torch.empty(0, dtype=torch.int64)
        return torch.cat([torch.arange(p * self.page_size, (p + 1) * self.page_size) for p in pages])

    def page_words(self, page: int) -> np.ndarray:
        """Page ``page``'s bytes in storage order (K, then V) as uint64 words (no copy of K or V)."""
        lo, hi = page * self.page_size, (page + 1) * self.page_size
        return np.concatenate([self.kv_buffer[kv, lo:hi].reshape(-1).view(torch.int64).numpy()
                               for kv in (0, 1)]).view(np.uint64)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        page = self.kv_buffer[:, index:index + self.page_size]
        return page.flatten() if flat else page

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.page_bytes // self.dtype.itemsize, dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.kv_buffer[:, index:index + self.page_size] = data_page.reshape(
            2, self.page_size, self.layer_num, self.head_num, self.head_dim)

    def get_page_buffer_meta(self, indices: torch.Tensor):
        token = self.layer_num * self.head_num * self.head_dim * self.dtype.itemsize
        v_offset = self.size * token
        base = self.kv_buffer.data_ptr()
        ptrs = []
        for start in indices.tolist()[::self.page_size]:
            ptrs += [base + start * token, base + start * token + v_offset]
        return ptrs, [self.page_size * token] * len(ptrs)


def page_keys(tokens: List[int], page_size: int, prior: Optional[str] = None) -> List[str]:
    """SGLang's storage page keys: per full page, sha256(prior digest + uint32 LE token ids)."""
    keys = []
    digest = bytes.fromhex(prior) if prior else b""
    for start in range(0, len(tokens) - page_size + 1, page_size):
        h = hashlib.sha256(digest)
        ids = array("I", tokens[start:start + page_size])
        if sys.byteorder != "little":
            ids.byteswap()
        h.update(ids.tobytes())
        digest = h.digest()
        keys.append(digest.hex())
    return keys


class PageContent:
    """The KV bytes "prefill" computes for a page: a deterministic function of its key.

    A fixed random block XOR the page key's SHA-256 repeated, so every 32 bytes of a page name
    its key: a page loaded into the wrong slot, or mixed from two pages, never passes.
    """

    def __init__(self, nbytes: int, seed: int) -> None:
        self.words = np.random.Generator(np.random.PCG64(seed)).integers(
            0, 2**63, nbytes // 8, dtype=np.uint64)

    def __call__(self, key: str) -> np.ndarray:
        pattern = np.frombuffer(hashlib.sha256(key.encode()).digest(), dtype=np.uint64)
        return (self.words.reshape(-1, 4) ^ pattern).reshape(-1)


@dataclass(frozen=True)
class Workload:
    """The shape of the traffic: how many conversations, turns and tokens, for which model."""

    model: str = "Qwen/Qwen2.5-0.5B-Instruct"
    conversations: int = 8
    turns: int = 6
    system_prompts: int = 2
    system_tokens: int = 2048
    user_tokens: int = 128
    reply_tokens: int = 256
    page_size: int = 64
    tp_size: int = 1
    seed: int = 0

    @property
    def shape(self) -> tuple:
        return MODEL_SHAPES[self.model]

    @property
    def page_bytes(self) -> int:
        layers, heads, head_dim = self.shape
        return 2 * self.page_size * layers * heads * head_dim * torch.bfloat16.itemsize

    @property
    def max_prompt_tokens(self) -> int:
        return self.system_tokens + self.turns * (self.user_tokens + self.reply_tokens)

    def pages_stored(self) -> int:
        """How many distinct pages serving every turn stores: the working set."""
        per_conversation = (self.max_prompt_tokens - self.reply_tokens) // self.page_size
        system = self.system_tokens // self.page_size
        return min(self.system_prompts, self.conversations) * system + self.conversations * (per_conversation - system)

    def describe(self) -> str:
        """Two lines: the conversations, then the pages they make."""
        layers, heads, head_dim = self.shape
        pages = self.pages_stored()
        return (f"workload             {self.conversations} conversations x {self.turns} turns, "
                f"{self.system_prompts} shared system prompts of {self.system_tokens} tokens, "
                f"{self.user_tokens} user + {self.reply_tokens} reply tokens a turn\n"
                f"pages                {self.model} ({layers} layers, {heads} KV heads of {head_dim}, bf16), "
                f"{self.page_size} tokens = {human(self.page_bytes)} a page; {pages} pages "
                f"({human(pages * self.page_bytes)}) in all")

    def make_conversations(self) -> List["Conversation"]:
        """The conversations, each with its own generator: the same for every server."""
        rng = random.Random(self.seed)
        prompts = [[rng.randrange(VOCAB) for _ in range(self.system_tokens)] for _ in range(self.system_prompts)]
        return [Conversation(random.Random(rng.random()), prompts[i % len(prompts)], self)
                for i in range(self.conversations)]

    def serving_order(self, conversations: List["Conversation"], turns: range) -> List["Conversation"]:
        """Turn by turn, the conversations in a shuffled order each turn (traffic interleaves)."""
        rng = random.Random(self.seed + 1)
        order = [rng.sample(conversations, len(conversations)) for _ in range(self.turns)]
        return [conv for turn in turns for conv in order[turn]]


class Conversation:
    """A chat: a shared system prompt, then the user's and the model's tokens, turn by turn."""

    def __init__(self, rng: random.Random, system_prompt: List[int], workload: Workload) -> None:
        self.rng = rng
        self.workload = workload
        self.system_prompt = system_prompt
        self.history: List[int] = []

    def next_prompt(self) -> List[int]:
        """The next turn's prompt: everything so far and the user's new tokens."""
        return self.system_prompt + self.history + self._tokens(self.workload.user_tokens)

    def answered(self, prompt: List[int]) -> None:
        """The turn is served: the model's reply joins the history."""
        self.history = prompt[len(self.system_prompt):] + self._tokens(self.workload.reply_tokens)

    def _tokens(self, n: int) -> List[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]


@dataclass
class Tally:
    """What serving some turns took and gave, as the client saw it."""

    turns: int = 0
    wanted: int = 0  # full prefix pages asked for
    loaded: int = 0  # of which loaded from hicachefs
    stored: int = 0  # new pages written
    bad: int = 0  # loaded pages with wrong bytes
    read_bytes: int = 0
    written_bytes: int = 0
    exists_s: float = 0.0
    read_s: float = 0.0
    write_s: float = 0.0

    def add(self, other: "Tally") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def hit_rate(self) -> float:
        return self.loaded / self.wanted if self.wanted else 0.0


class Server:
    """One SGLang rank's storage traffic on one hicachefs mount: a HiCacheFS client and a host
    pool big enough for the longest prompt. ``serve`` blocks on the mount's I/O."""

    def __init__(self, mountpoint: str, workload: Workload) -> None:
        self.mountpoint = mountpoint
        self.workload = workload
        layers, heads, head_dim = workload.shape
        self.pool = PageFirstHostPool(workload.max_prompt_tokens // workload.page_size + 1, workload.page_size,
                                      layers, heads, head_dim)
        config = SimpleNamespace(
            tp_rank=0, tp_size=workload.tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, is_storage_writer=True, enable_storage_metrics=False,
            is_page_first_layout=True, model_name=workload.model, dcp_rank=0, dcp_size=1,
            extra_config={"backend_name": "hicachefs", "module_path": "hicachefs_client",
                          "class_name": "HiCacheFS", "interface_v1": 1, "mountpoint": mountpoint})
        self.client = HiCacheFS(config, {})
        self.client.register_mem_pool_host(self.pool)
        self.content = PageContent(self.pool.page_bytes, workload.seed)

    def serve(self, conv: Conversation) -> Tally:
        """Serve the conversation's next turn: load its stored prefix, store the rest."""
        page_size = self.workload.page_size
        prompt = conv.next_prompt()
        keys = page_keys(prompt, page_size)
        slots = self.pool.alloc(len(keys))
        assert len(slots) == len(keys), "host pool too small"
        turn = Tally(turns=1, wanted=len(keys))
        try:
            t0 = time.perf_counter()
            hit = 0
            for b in range(0, len(keys), STORAGE_BATCH_SIZE):
                part = self.client.batch_exists(keys[b:b + STORAGE_BATCH_SIZE])
                hit += part
                if part < len(keys[b:b + STORAGE_BATCH_SIZE]):
                    break
            t1 = time.perf_counter()
            ok: List[bool] = []
            for b in range(0, hit, STORAGE_BATCH_SIZE):
                end = min(hit, b + STORAGE_BATCH_SIZE)
                ok += self.client.batch_get_v1(keys[b:end], self.pool.indices(slots[b:end]))
            t2 = time.perf_counter()
            got = ok.index(False) if False in ok else len(ok)
            turn.bad = sum(not np.array_equal(self.pool.page_words(slot), self.content(key))
                           for key, slot in zip(keys[:got], slots[:got]))
            # Prefill computes the rest; the backup thread stores it.
            for key, slot in zip(keys[got:], slots[got:]):
                data = torch.from_numpy(self.content(key).view(np.int16)).view(torch.bfloat16)
                self.pool.set_from_flat_data_page(slot * page_size, data)
            t3 = time.perf_counter()
            for b in range(got, len(keys), STORAGE_BATCH_SIZE):
                end = min(len(keys), b + STORAGE_BATCH_SIZE)
                turn.stored += sum(self.client.batch_set_v1(keys[b:end], self.pool.indices(slots[b:end])))
            t4 = time.perf_counter()
        finally:
            self.pool.free(slots)
        conv.answered(prompt)
        turn.loaded = got
        turn.read_bytes = got * self.pool.page_bytes
        turn.written_bytes = turn.stored * self.pool.page_bytes
        turn.exists_s, turn.read_s, turn.write_s = t1 - t0, t2 - t1, t4 - t3
        return turn

    def client_errors(self) -> Dict[str, int]:
        """Failures the client met, beyond the misses every serving workload has."""
        return {k: v for k, v in self.client.statistics()["errors"].items() if k != "NO_EXISTS_FILE"}

    def close(self) -> None:
        self.client.close()


def mount_stats(mountpoint: str) -> dict:
    """The mount's ``.hicachefs/stats``."""
    with open(os.path.join(mountpoint, ".hicachefs", "stats")) as f:
        return json.load(f)


#: Per-tier counters that say where hits came from and how pages moved between tiers.
TIER_COUNTERS = ("hits", "demotions", "promotions", "evictions")
TIER_ORDER = ("memory", "disk", "shared")


def tiers_top_down(stats: dict) -> List[str]:
    """The tiers in the mount's stats, memory first (the stats file sorts them by name)."""
    rank = {name: i for i, name in enumerate(TIER_ORDER)}
    return sorted(stats.get("tiers", {}), key=lambda name: rank.get(name, len(rank)))


def tier_activity(before: dict, after: dict) -> Dict[str, Dict[str, int]]:
    """Per tier, top down, how much each of TIER_COUNTERS grew between two reads of the stats."""
    grown = {}
    for name in tiers_top_down(after):
        old, new = before.get("tiers", {}).get(name, {}), after["tiers"][name]
        grown[name] = {key: new.get(key, 0) - old.get(key, 0) for key in TIER_COUNTERS}
    return grown


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)
