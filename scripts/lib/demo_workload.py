"""The demo's serving workload: chat conversations served by SGLang's own radix cache and cache
controller over HiCacheFS (``hicachefs_testing.sglang_cache``).

Conversations share a few system prompts and grow turn by turn, as chat traffic does. Each turn
is one request to SGLang 0.5.23's ``UnifiedRadixCache`` with its ``HybridCacheController``
(running on the CPU, with a real device KV pool of the model's shape): SGLang matches the prompt
against its device and host pools, decides what to prefetch from hicachefs and how much of it
counts as a hit, loads it back, and backs the new pages up (write-through). The harness only
"prefills" the pages SGLang did not find (bytes derived from each page's key) and checks every
byte SGLang hands over, reads back and loads to the device.

A conversation's tokens come from its own random generator, so any server (any host) serving
its next turn builds the same prompt, and so the same page keys. Not thread-safe: one thread
drives a ``Server``.
"""

from __future__ import annotations

import json
import os
import random
import warnings
from dataclasses import dataclass, fields
from typing import Dict, List

# SGLang warns at import that some quantization kernels are CUDA-only: true, and beside the point.
warnings.filterwarnings("ignore", message="Only CUDA", category=UserWarning)

from hicachefs_testing.sglang_cache import (  # noqa: E402
    Backend, CacheSetup, ModelShape, RequestResult, SGLangCache)
from hicachefs_testing.sglang_metrics import storage_metrics  # noqa: E402
from hicachefs_testing.sglang_workload import VOCAB, Conversation  # noqa: E402

MODEL_SHAPES = {
    # name: (layers, KV heads, head dim)
    "Qwen/Qwen2.5-0.5B-Instruct": (24, 2, 64),
    "Qwen/Qwen2.5-1.5B-Instruct": (28, 2, 128),
    "meta-llama/Llama-3.2-1B-Instruct": (16, 8, 64),
}


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
    seed: int = 0

    @property
    def shape(self) -> tuple:
        return MODEL_SHAPES[self.model]

    @property
    def page_bytes(self) -> int:
        layers, heads, head_dim = self.shape
        return 2 * self.page_size * layers * heads * head_dim * 2  # K and V, bf16

    @property
    def max_prompt_tokens(self) -> int:
        return self.system_tokens + self.turns * (self.user_tokens + self.reply_tokens)

    def pages_stored(self) -> int:
        """How many distinct pages serving every turn stores: the working set. SGLang backs up
        every full page of what a request leaves in its tree: prompt and reply."""
        final = self.max_prompt_tokens // self.page_size
        system = self.system_tokens // self.page_size
        return min(self.system_prompts, self.conversations) * system + self.conversations * (final - system)

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


@dataclass
class Tally:
    """What serving some turns took and gave, in pages, as SGLang's cache decided."""

    turns: int = 0
    prompt: int = 0  # full prompt pages
    device: int = 0  # found in the device pool at arrival
    host: int = 0  # found in the host pool at arrival
    wanted: int = 0  # the rest: what SGLang could ask hicachefs for
    loaded: int = 0  # of which SGLang's prefetch loaded from hicachefs
    stored: int = 0  # new pages SGLang's backups wrote
    bad: int = 0  # pages with wrong bytes: handed over, read into the host pool, or on the device
    read_bytes: int = 0
    written_bytes: int = 0
    read_s: float = 0.0
    write_s: float = 0.0

    def add(self, other: "Tally") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def hit_rate(self) -> float:
        return self.loaded / self.wanted if self.wanted else 0.0


def server_setup(workload: Workload, storage_metrics: bool = True) -> CacheSetup:
    """An SGLang server for ``workload``'s model, whose device and host pools hold the longest
    conversation a few times over but not the whole workload."""
    layers, heads, head_dim = workload.shape
    request_pages = workload.max_prompt_tokens // workload.page_size + 2
    return CacheSetup(ModelShape(workload.model, layers, heads, head_dim), page_size=workload.page_size,
                      device_pages=request_pages, host_ratio=2.0, storage_metrics=storage_metrics,
                      max_context=workload.max_prompt_tokens + workload.page_size)


class Server:
    """One SGLang rank on one hicachefs mount (``SGLangCache`` over ``HiCacheFS``, loaded as
    SGLang's ``dynamic`` backend). ``serve`` blocks until the turn is served."""

    def __init__(self, mountpoint: str, workload: Workload, storage_metrics: bool = True) -> None:
        self.mountpoint = mountpoint
        self.workload = workload
        self.sglang = SGLangCache(server_setup(workload, storage_metrics), Backend("hicachefs", mountpoint))
        self.recorder = self.sglang.recorder

    def serve(self, conv: "Conversation") -> Tally:
        """Serve the conversation's next turn; wait until SGLang has backed it up."""
        turn = conv.next_turn()
        before = self._counts()
        result: RequestResult = self.sglang.serve([turn])[0]
        self.sglang.settle()
        after = self._counts()
        grown = {k: after[k] - before[k] for k in after}
        page_bytes = self.workload.page_bytes
        wanted = result.matchable_pages - result.arrival_device_hit - result.arrival_host_hit
        return Tally(turns=1, prompt=result.prompt_pages, device=result.arrival_device_hit,
                     host=result.arrival_host_hit, wanted=wanted, loaded=result.storage_hit,
                     stored=grown["stored"], bad=result.wrong_pages + grown["bad"],
                     read_bytes=grown["read"] * page_bytes, written_bytes=grown["stored"] * page_bytes,
                     read_s=grown["read_s"], write_s=grown["write_s"])

    def _counts(self) -> Dict[str, float]:
        r = self.recorder
        stats = r.stats
        return {"read": r.read_pages, "bad": r.wrong_handed_over + r.wrong_read,
                "stored": self.stored_pages(),
                "read_s": sum(stats["batch_get_v1"].seconds) if "batch_get_v1" in stats else 0.0,
                "write_s": sum(stats["batch_set_v1"].seconds) if "batch_set_v1" in stats else 0.0}

    def stored_pages(self) -> int:
        """Pages published in the mount (its stats; pages already there are not counted), once
        the commits this process has under way are answered (a backup SGLang saw finish may
        still be committing: its pages were counted in no turn, 31 of 32 written behind)."""
        self.sglang.backend.settle()
        return mount_stats(self.mountpoint)["published"]

    def report_reads(self) -> None:
        self.sglang.backend.report_reads()

    def client_errors(self) -> Dict[str, int]:
        """Failures the client met, and calls SGLang's controller saw fail."""
        errors = {k: v for k, v in self.sglang.backend.statistics()["errors"].items() if k != "NO_EXISTS_FILE"}
        if self.recorder.failures:
            errors["failed calls"] = len(self.recorder.failures)
        return errors

    def storage_metrics(self) -> Dict[str, float]:
        return storage_metrics()

    def close(self) -> None:
        self.sglang.close()


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
