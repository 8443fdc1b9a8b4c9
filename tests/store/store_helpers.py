"""Page contents that identify themselves, so that a read of any other page's bytes is caught."""

from __future__ import annotations

import hashlib

import numpy as np

from hicachefs.store import PageStore

KiB, MiB = 1 << 10, 1 << 20


def content(seed: int | str, size: int) -> bytes:
    """Deterministic bytes for ``seed``: distinct seeds give distinct bytes (beyond size 0)."""
    if isinstance(seed, str):
        seed = int.from_bytes(hashlib.blake2b(seed.encode(), digest_size=8).digest(), "little")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


def key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def page_name(i: int, directory: str = "m/bf16-page_first-64/tp0of1/kv") -> str:
    return f"{directory}/{key(i)}"


def read_all(store: PageStore, name: str) -> bytes:
    with store.open(name) as reader:
        return bytes(reader.read(0, reader.size + 1))
