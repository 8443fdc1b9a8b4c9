"""Prometheus metrics: levels are gauges, totals counters; the file and the endpoint agree."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hicachefs.testing import mounting
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


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        return response.read().decode()


def traffic(mount: mounting.Mount) -> None:
    """Pages on both tiers, a read from each, a refused write: every family has samples."""
    pool = mount.page_dir()
    for i in range(PAGES):
        publish(pool, f"k{i}", pattern(1 << 20, i))
    for i in (0, PAGES - 1):
        read_page(pool / f"k{i}")
    with pytest.raises(PermissionError):
        os.open(pool / "k0", os.O_WRONLY)


def test_levels_are_gauges_and_totals_counters(mount_factory, tmp_path):
    mount = mount_factory("--memory", "16M", "--disk", str(tmp_path / "ssd"), "--disk-size", "64M",
                          "--shared", str(tmp_path / "shared"))
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
    for level in ("hicachefs_tier_available", "hicachefs_tier_queue_bytes", "hicachefs_tier_lag_seconds"):
        assert found[level].type == "gauge", level  # the shared tier's levels too
    assert sample(found, "hicachefs_tier_available", tier="shared") == 1


def test_metrics_endpoint_serves_what_the_file_shows(mount_factory, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    mount = mount_factory("--memory", "16M", "--disk", str(tmp_path / "ssd"), "--disk-size", "64M",
                          "--metrics-listen", address)
    assert json.loads((mount.path / ".hicachefs" / "config").read_text())["metrics_listen"] == address
    traffic(mount)
    served = scrape(address)
    assert promtool_problems(served) == ""
    from_file, from_endpoint = families((mount.path / ".hicachefs" / "metrics").read_text()), families(served)
    assert {n: f.type for n, f in from_endpoint.items()} == {n: f.type for n, f in from_file.items()}
    assert sample(from_endpoint, "hicachefs_pages") == PAGES
    assert sample(from_endpoint, "hicachefs_tier_pages", tier="disk") == mount.stats()["tiers"]["disk"]["pages"]
    publish(mount.page_dir(), "one-more", b"x" * 4096)
    assert sample(families(scrape(address)), "hicachefs_pages") == PAGES + 1  # live, not a snapshot


@pytest.mark.parametrize("form", ["PORT", ":PORT"])
def test_metrics_listen_port_alone_means_loopback(mount_factory, form):
    port = free_port()
    mount = mount_factory("--memory", "16M", "--metrics-listen", form.replace("PORT", str(port)))
    assert json.loads((mount.path / ".hicachefs" / "config").read_text())["metrics_listen"] == f"127.0.0.1:{port}"
    assert ("127.0.0.1", port) in listening_sockets(mount.pid)
    assert "hicachefs_pages 0.0" in scrape(f"127.0.0.1:{port}")


def test_no_endpoint_unless_asked(mounted):
    assert json.loads((mounted.path / ".hicachefs" / "config").read_text())["metrics_listen"] is None
    assert listening_sockets(mounted.pid) == set()


def listening_sockets(pid: int) -> set[tuple[str, int]]:
    """(IPv4 address, port) of the TCP sockets ``pid`` listens on, as ``ss -ltnp`` would list."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and inode in inodes:  # TCP_LISTEN
            host, port = local.split(":")
            found.add((socket.inet_ntoa(bytes.fromhex(host)[::-1]), int(port, 16)))
    return found


@pytest.mark.parametrize("value, message", [
    ("nowhere", "the port must be a number"),
    (":0", "the port must be a number from 1 to 65535"),
    ("127.0.0.1:65536", "the port must be a number from 1 to 65535"),
    ("::1:9100", "in brackets"),
    ("no-such-host.invalid:9100", "not an IP address or a known host name"),
    ("in-use", "cannot listen there (Address already in use)"),
])
def test_bad_metrics_listen_gives_one_line_and_mounts_nothing(tmp_path, value, message):
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        if value == "in-use":
            value = f"127.0.0.1:{busy.getsockname()[1]}"
        result = subprocess.run([sys.executable, "-m", "hicachefs.cli", "mount", str(mountpoint), "--memory", "16M",
                                 "--metrics-listen", value], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not mounting.is_mounted(mountpoint)
