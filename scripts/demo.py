#!/usr/bin/env python3
"""A serving workload through HiCacheFS on a live hicachefs mount (issue 5, the README's demo).

Conversations share a few system prompts and grow turn by turn, as chat traffic does. Every
turn does what SGLang's HiCache does with an L3 backend:
  1. page keys: chained SHA-256 over each full page's token ids (SGLang's scheme: the digest of
     the previous page's digest followed by this page's token ids as little-endian uint32);
  2. ``batch_exists``: how long a prefix is stored;
  3. ``batch_get_v1``: load those pages straight into a CPU host pool laid out as SGLang's MHA
     ``page_first`` pool for a real model's shape (Qwen2.5-0.5B: 24 layers, 2 KV heads of 64,
     bf16, 64 tokens per page), and check every byte;
  4. "prefill" the rest (deterministic bytes derived from each page's key) and ``batch_set_v1``
     the new pages.
Then a summary: pages stored, hit rate, GB/s, the mount's tier use.

Exit status 0 when every loaded page held the right bytes and the client saw no errors.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from array import array
from types import SimpleNamespace
from typing import List, Optional

import numpy as np
import torch
from tqdm import tqdm

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


class Conversation:
    def __init__(self, rng: random.Random, system_prompt: List[int]) -> None:
        self.rng = rng
        self.system_prompt = system_prompt
        self.history: List[int] = []

    def tokens(self, n: int) -> List[int]:
        return [self.rng.randrange(VOCAB) for _ in range(n)]


def read_json(path: str) -> Optional[dict]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mountpoint", required=True, help="a live hicachefs mount")
    parser.add_argument("--model", default="Qwen/Qwen2.5-0.5B-Instruct", choices=sorted(MODEL_SHAPES))
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=14)
    parser.add_argument("--system-prompts", type=int, default=4, help="distinct shared system prompts")
    parser.add_argument("--system-tokens", type=int, default=3072)
    parser.add_argument("--user-tokens", type=int, default=128, help="tokens a user adds per turn")
    parser.add_argument("--reply-tokens", type=int, default=256, help="tokens the model replies per turn")
    parser.add_argument("--page-size", type=int, default=64, help="tokens per page")
    parser.add_argument("--tp-size", type=int, default=1, help="shard as rank 0 of this many")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if not os.path.isdir(os.path.join(args.mountpoint, ".hicachefs")):
        parser.error(f"{args.mountpoint} is not a live hicachefs mount (no .hicachefs/)")
    layers, heads, head_dim = MODEL_SHAPES[args.model]
    max_tokens = args.system_tokens + args.turns * (args.user_tokens + args.reply_tokens)
    pool = PageFirstHostPool(max_tokens // args.page_size + 1, args.page_size, layers, heads, head_dim)
    config = SimpleNamespace(
        tp_rank=0, tp_size=args.tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, is_storage_writer=True, enable_storage_metrics=False,
        is_page_first_layout=True, model_name=args.model, dcp_rank=0, dcp_size=1,
        extra_config={"backend_name": "hicachefs", "module_path": "hicachefs_client",
                      "class_name": "HiCacheFS", "interface_v1": 1, "mountpoint": args.mountpoint})
    fs = HiCacheFS(config, {})
    fs.register_mem_pool_host(pool)

    rng = random.Random(args.seed)
    prompts = [[rng.randrange(VOCAB) for _ in range(args.system_tokens)] for _ in range(args.system_prompts)]
    conversations = [Conversation(random.Random(rng.random()), prompts[i % len(prompts)])
                     for i in range(args.conversations)]

    print(f"hicachefs demo: {args.conversations} conversations x {args.turns} turns, "
          f"{args.system_prompts} shared system prompts of {args.system_tokens} tokens, {args.model} "
          f"({layers} layers, {heads} KV heads of {head_dim}, bf16), {args.page_size} tokens = "
          f"{human(pool.page_bytes)} per page, mount {args.mountpoint}")
    wanted = loaded = stored = bad = 0
    read_bytes = written_bytes = 0
    read_s = write_s = exists_s = 0.0
    started = time.perf_counter()
    content = PageContent(pool.page_bytes, args.seed)
    work = [(turn, c) for turn in range(args.turns) for c in rng.sample(conversations, len(conversations))]
    with tqdm(work, unit="turn", dynamic_ncols=True) as bar:
        for turn, conv in bar:
            prompt = conv.system_prompt + conv.history + conv.tokens(args.user_tokens)
            keys = page_keys(prompt, args.page_size)
            slots = pool.alloc(len(keys))
            assert len(slots) == len(keys), "host pool too small"
            try:
                t0 = time.perf_counter()
                hit = 0
                for b in range(0, len(keys), STORAGE_BATCH_SIZE):
                    part = fs.batch_exists(keys[b:b + STORAGE_BATCH_SIZE])
                    hit += part
                    if part < len(keys[b:b + STORAGE_BATCH_SIZE]):
                        break
                t1 = time.perf_counter()
                ok: List[bool] = []
                for b in range(0, hit, STORAGE_BATCH_SIZE):
                    end = min(hit, b + STORAGE_BATCH_SIZE)
                    ok += fs.batch_get_v1(keys[b:end], pool.indices(slots[b:end]))
                t2 = time.perf_counter()
                got = ok.index(False) if False in ok else len(ok)
                for key, slot in zip(keys[:got], slots[:got]):
                    if not np.array_equal(pool.page_words(slot), content(key)):
                        bad += 1
                # Prefill computes the rest; the backup thread stores it.
                for key, slot in zip(keys[got:], slots[got:]):
                    data = torch.from_numpy(content(key).view(np.int16)).view(torch.bfloat16)
                    pool.set_from_flat_data_page(slot * args.page_size, data)
                t3 = time.perf_counter()
                new = 0
                for b in range(got, len(keys), STORAGE_BATCH_SIZE):
                    end = min(len(keys), b + STORAGE_BATCH_SIZE)
                    new += sum(fs.batch_set_v1(keys[b:end], pool.indices(slots[b:end])))
                t4 = time.perf_counter()
            finally:
                pool.free(slots)
            exists_s += t1 - t0
            read_s += t2 - t1
            write_s += t4 - t3
            wanted += len(keys)
            loaded += got
            stored += new
            read_bytes += got * pool.page_bytes
            written_bytes += new * pool.page_bytes
            conv.history += prompt[len(conv.system_prompt) + len(conv.history):] + conv.tokens(args.reply_tokens)
            bar.set_postfix(hit=f"{loaded / max(wanted, 1):.0%}", stored=stored, bad=bad,
                            refresh=False)
    elapsed = time.perf_counter() - started

    stats = fs.statistics()
    fs.close()
    print()
    print(f"turns                {len(work)} in {elapsed:.1f} s")
    print(f"prefix pages         {wanted} wanted, {loaded} loaded from hicachefs "
          f"(hit rate {loaded / max(wanted, 1):.1%}), {bad} with wrong bytes")
    print(f"pages stored         {stored} new ({human(written_bytes)}), "
          f"{stats['pages_skipped']} already there")
    print(f"read                 {human(read_bytes)} in {read_s:.2f} s = "
          f"{read_bytes / max(read_s, 1e-9) / 1e9:.2f} GB/s (preadv into the host pool)")
    print(f"write                {human(written_bytes)} in {write_s:.2f} s = "
          f"{written_bytes / max(write_s, 1e-9) / 1e9:.2f} GB/s (exists check + pwritev + rename)")
    print(f"exists queries       {stats['exists_queries']} ({stats['exists_paths']} paths) in "
          f"{exists_s:.2f} s, {stats['exists_stat_fallbacks']} stat fallbacks")
    print(f"client errors        {stats['errors'] or 'none'}")
    mount_stats = read_json(os.path.join(args.mountpoint, ".hicachefs", "stats"))
    if mount_stats:
        for tier, facts in mount_stats.get("tiers", {}).items():
            print(f"tier {tier:<15} {facts.get('pages', '?')} pages, "
                  f"{human(facts.get('used_bytes', 0))} of {human(facts.get('capacity_bytes', 0))} used")
        shown = {k: v for k, v in mount_stats.items() if k != "tiers" and not isinstance(v, (dict, list))}
        print("mount totals         " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())))
    errors = {k: v for k, v in stats["errors"].items() if k != "NO_EXISTS_FILE"}
    if bad or errors:
        print("FAILED: wrong bytes or client errors", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
