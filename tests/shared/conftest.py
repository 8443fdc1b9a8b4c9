"""Fixtures for the shared tier's tests: tiers on a temporary directory or on a real distributed
filesystem, closed after each test. ``engine`` is each engine of ``engines.ENGINES`` in turn
(GlusterFS, JuiceFS), brought up once per session and always taken down: every test that takes
it runs once per engine, and an engine that cannot start here is skipped with the one line that
says why."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from hicachefs.store.shared import SharedTier  # noqa: E402
from hicachefs_testing.engine import Engine, EngineDidNotStart  # noqa: E402
from hicachefs_testing.engines import ENGINES  # noqa: E402
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


@pytest.fixture(scope="session", params=list(ENGINES))
def engine(request, tmp_path_factory) -> Engine:
    """A volume of one engine mounted twice (``.a``, ``.b``: two hosts)."""
    kind = ENGINES[request.param]
    directory = tmp_path_factory.mktemp(request.param) / "volume"
    try:
        volume = kind.up(directory)
    except EngineDidNotStart as error:
        kind.down(directory)
        pytest.skip(f"{kind.name} did not start here: {error}")
    try:
        yield volume
    finally:
        kind.down(directory)


@pytest.fixture
def engine_root(engine, request) -> tuple[Path, Path]:
    """One test's directory on the volume, as host A and host B see it."""
    name = request.node.name.replace("[", "_").replace("]", "")
    (engine.a / name).mkdir()
    return engine.a / name, engine.b / name
