"""Fixtures for the client's tests: a store root that is a plain directory or a live mount."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

@pytest.fixture(params=["plain", "mount"])
def store_root(request, tmp_path) -> Path:
    """Where pages go: a plain temporary directory, or a live hicachefs mount (256 MiB RAM)."""
    if request.param == "plain":
        root = tmp_path / "plain"
        root.mkdir()
        return root
    return request.getfixturevalue("hicachefs_mount")


@pytest.fixture
def plain_root(tmp_path) -> Path:
    root = tmp_path / "plain"
    root.mkdir()
    return root
