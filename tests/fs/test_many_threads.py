"""Many threads reading and writing through the mount at once."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor

from pages import publish, read_page


def content(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def test_threads_writing_and_reading_agree(mounted):
    pool = mounted.page_dir()
    keys = [f"k{i}" for i in range(200)]

    def work(key: str) -> bool:
        data = content(key, 64 << 10)
        publish(pool, key, data)
        return read_page(pool / key) == data

    with ThreadPoolExecutor(8) as executor:
        assert all(executor.map(work, keys))
    with ThreadPoolExecutor(8) as executor:
        assert all(executor.map(lambda k: read_page(pool / k) == content(k, 64 << 10), keys * 2))
