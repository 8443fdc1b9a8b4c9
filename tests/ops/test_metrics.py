"""Prometheus metrics: levels are gauges, totals counters, and Prometheus's linter agrees."""

from __future__ import annotations

import os
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pages import pattern, publish, read_page

LEVELS = ["hicachefs_capacity_bytes", "hicachefs_used_bytes", "hicachefs_free_bytes", "hicachefs_pages",
          "hicachefs_pending_files", "hicachefs_tier_capacity_bytes", "hicachefs_tier_used_bytes",
          "hicachefs_tier_pages"]
TOTALS = ["hicachefs_misses", "hicachefs_tier_hits", "hicachefs_tier_misses", "hicachefs_tier_evictions",
          "hicachefs_tier_demotions", "hicachefs_tier_promotions", "hicachefs_tier_written_bytes",
          "hicachefs_tier_read_bytes", "hicachefs_tier_io_errors", "hicachefs_tier_checksum_failures",
          "hicachefs_fuse_requests", "hicachefs_errors"]


PAGES = 24  # 1 MiB each, more than the 16 MiB RAM tier holds


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def promtool_problems(text: str) -> str:
    """What ``promtool check metrics`` (Prometheus's own linter) finds wrong; '' when clean."""
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    return "" if result.returncode == 0 else (result.stdout + result.stderr or f"exit {result.returncode}")


def sample(found: dict, name: str, **labels) -> float:
    family = found[name]
    values = [s.value for s in family.samples if s.labels == labels and not s.name.endswith("_created")]
    assert len(values) == 1, (name, labels, family.samples)
    return values[0]


def traffic(mount) -> None:
    """Pages on both tiers, a read from each, a refused write: every family has samples."""
    pool = mount.page_dir()
    for i in range(PAGES):
        publish(pool, f"k{i}", pattern(1 << 20, i))
    for i in (0, PAGES - 1):
        read_page(pool / f"k{i}")
    with pytest.raises(PermissionError):
        os.open(pool / "k0", os.O_WRONLY)


def test_levels_are_gauges_and_totals_counters(mount_factory, tmp_path):
    mount = mount_factory("--memory", "16M", "--disk", str(tmp_path / "ssd"), "--disk-size", "64M")
    traffic(mount)
    text = (mount.path / ".hicachefs" / "metrics").read_text()
    assert promtool_problems(text) == ""
    found = families(text)
    for name in LEVELS:
        assert found[name].type == "gauge", name
    for name in TOTALS:
        assert found[name].type == "counter", name
        assert f"# TYPE {name}_total counter" in text
    assert not [name for name in found if name.endswith("_total")]  # no gauge named like a total
    stats = mount.stats()
    assert sample(found, "hicachefs_pages") == stats["pages"] == PAGES
    for tier in ("memory", "disk"):
        assert sample(found, "hicachefs_tier_pages", tier=tier) == stats["tiers"][tier]["pages"]
        assert sample(found, "hicachefs_tier_used_bytes", tier=tier) == stats["tiers"][tier]["used_bytes"]
    assert sample(found, "hicachefs_tier_demotions", tier="memory") == stats["tiers"]["memory"]["demotions"] > 0
    assert sample(found, "hicachefs_tier_written_bytes", tier="memory") == PAGES << 20
    assert sample(found, "hicachefs_errors", errno="EPERM") == 1
    assert sample(found, "hicachefs_fuse_requests", operation="rename") == PAGES
