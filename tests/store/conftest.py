"""Fixtures for the page-store tests: stores in temp dirs, closed at the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from store_helpers import MiB

from hicachefs.store import PageStore, StoreConfig


@pytest.fixture
def make_store(tmp_path: Path):
    """make_store(memory=..., disk=..., **config) -> an open PageStore; closed after the test."""
    stores: list[PageStore] = []

    def make(memory: int = 16 * MiB, disk: int = 0, **kwargs) -> PageStore:
        if disk:
            kwargs.setdefault("disk_dir", tmp_path / "disk")
        store = PageStore(StoreConfig(memory_bytes=memory, disk_bytes=disk, **kwargs))
        stores.append(store)
        return store

    yield make
    for store in stores:
        try:
            store.close()
        except Exception:
            pass  # a test that closed it itself
