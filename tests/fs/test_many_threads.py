"""Many threads reading and writing through the mount at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from hicachefs_testing.workload import content
from pages import publish, read_page


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
