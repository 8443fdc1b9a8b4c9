"""Fixtures for the shared tier's tests: tiers on a temporary directory or on a real GlusterFS
volume (brought up once per session and always taken down), closed after each test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hicachefs.store.shared import SharedTier  # noqa: E402
from hicachefs.testing import glusterfs  # noqa: E402
from shared_helpers import FAST  # noqa: E402



@pytest.fixture
def make_tier():
    """make_tier(root, capacity=None, **options) -> an open SharedTier, closed after the test."""
    tiers: list[SharedTier] = []

    def make(root: Path, capacity: int | None = None, **options) -> SharedTier:
        tier = SharedTier(root, capacity, **{**FAST, **options})
        tiers.append(tier)
        return tier

    yield make
    for tier in tiers:
        tier.close()


@pytest.fixture(scope="session")
def gluster(tmp_path_factory) -> glusterfs.GlusterVolume:
    """A one-node GlusterFS volume mounted twice (``.a``, ``.b``: two hosts)."""
    with glusterfs.volume(tmp_path_factory.mktemp("gluster") / "volume") as volume:
        yield volume


@pytest.fixture
def gluster_root(gluster, request) -> tuple[Path, Path]:
    """One test's directory on the volume, as host A and host B see it."""
    name = request.node.name.replace("[", "_").replace("]", "")
    (gluster.a / name).mkdir()
    return gluster.a / name, gluster.b / name
