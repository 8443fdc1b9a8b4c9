"""The control files: stats, metrics, config and the batch exists query."""

from __future__ import annotations

import errno
import json
import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from hicachefs_testing.workload import ask_exists, exists_handle, exists_raw
from pages import as_nobody, fetch_pages, ingest_batch, ingest_status, publish, read_page

POOL = "model/bfloat16-page_first-64/tp0of1/kv"


def test_exists_answers_many_paths_in_one_request(mounted):
    pool = mounted.page_dir()
    stored = {f"{i:064x}" for i in range(0, 10000, 3)}
    for key in stored:
        publish(pool, key, b"p")
    paths = [f"{POOL}/{i:064x}" for i in range(10000)]
    with exists_handle(mounted.path) as fd:
        answer = ask_exists(fd, paths)
    assert answer == "".join("1" if f"{i:064x}" in stored else "0" for i in range(10000))


def test_exists_of_many_hex_keys_of_other_lengths_answers_for_each_key(mounted):
    """Past 16 lines the keys are decoded together: keys of 63 and 65 hex digits side by side
    (valid names) decoded whole, each to the wrong identity, so a stored page answered 0 and
    pages never stored answered 1."""
    pool = mounted.page_dir()
    publish(pool, "a" * 63, b"x" * 100)
    publish(pool, "a" * 64, b"y" * 100)
    fillers = [f"{i:064x}" for i in range(15)]  # not stored
    for keys, answer in ((["a" * 63, "b" * 65, *fillers], b"1" + b"0" * 16),
                         (["a" * 65, "c" * 63, *fillers], b"0" * 17)):
        request = "".join(f"{POOL}/{key}\n" for key in keys).encode()
        assert exists_raw(mounted.path, request) == answer + b"\n"
        assert [os.path.exists(pool / key) for key in keys] == [c == ord("1") for c in answer]


def test_exists_handle_serves_many_requests_and_appends_writes(mounted):
    pool = mounted.page_dir()
    publish(pool, "a", b"1")
    with exists_handle(mounted.path) as fd:
        os.write(fd, f"{POOL}/a\n".encode())
        os.write(fd, f"{POOL}/b\n".encode())
        assert os.read(fd, 100) == b"10\n"
        assert os.read(fd, 100) == b""
        assert ask_exists(fd, [f"{POOL}/b", f"{POOL}/a", f"{POOL}/a"]) == "011"
        publish(pool, "b", b"2")
        assert ask_exists(fd, [f"{POOL}/b"]) == "1"


def test_exists_handles_are_independent(mounted):
    publish(mounted.page_dir(), "a", b"1")
    with exists_handle(mounted.path) as first, exists_handle(mounted.path) as second:
        os.write(first, f"{POOL}/a\n".encode())
        os.write(second, f"{POOL}/x\n{POOL}/a\n".encode())
        assert os.read(second, 10) == b"01\n"
        assert os.read(first, 10) == b"1\n"


def test_exists_treats_malformed_lines_as_absent(mounted):
    publish(mounted.page_dir(), "a", b"1")
    with exists_handle(mounted.path) as fd:
        os.write(fd, b"\xff\xfe\n\n../../etc/passwd\n" + f"{POOL}/a\n".encode() + b"a/b\n" + f"{POOL}/.tmp\n".encode())
        assert os.read(fd, 100) == b"000100\n"


def test_exists_counts_a_page_only_at_the_size_a_size_line_gives(mounted):
    """A page file of another size (a copy cut off) is no page a reader of that size takes:
    after ``.size N`` it answers 0, so the client writes the key again. The ``.size`` lines
    answer 0 themselves (an older daemon answers them so too), ``.size 0`` means any size, and
    a ``.size`` line that gives no size changes nothing."""
    pool = mounted.page_dir()
    publish(pool, "cut", b"x" * 3)
    path = f"{POOL}/cut\n".encode()
    request = b".size 6\n" + path + b".size 0\n" + path + b".size 3\n" + path + b".size x\n" + path
    assert exists_raw(mounted.path, request) == b"00010101\n"
    many = b".size 6\n" + path * 40  # past 16 lines the names are looked up together
    assert exists_raw(mounted.path, many) == b"0" * 41 + b"\n"
    assert exists_raw(mounted.path, path) == b"1\n"
    # Leading zeros say the same size; a size no page can have (past 32 bits) counts none.
    padded = b".size 6\n.size 00000000003\n" + path + b".size 3\n.size 12884901891\n" + path
    assert exists_raw(mounted.path, padded) == b"001000\n"


def test_stats_counts_pages_hits_and_misses(mounted):
    pool = mounted.page_dir()
    publish(pool, "a", b"x" * 5000)
    before = mounted.stats()["tiers"]["memory"]
    read_page(pool / "a")
    fd = os.open(mounted.path / ".hicachefs" / "fetch", os.O_RDWR)
    try:  # a page asked for and never stored: a miss
        fetch_pages(fd, [(f"{pool.relative_to(mounted.path)}/never-stored", 5000)])
    finally:
        os.close(fd)
    stats = mounted.stats()
    assert stats["pages"] == 1
    memory = stats["tiers"]["memory"]
    assert memory["used_bytes"] >= 5000
    assert (memory["hits"] - before["hits"], memory["misses"] - before["misses"]) == (1, 1)
    assert stats["capacity_bytes"] == 64 << 20  # the fixture's --memory


def test_metrics_are_prometheus_text(mounted):
    publish(mounted.page_dir(), "a", b"x" * 5000)
    text = (mounted.path / ".hicachefs" / "metrics").read_text()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["hicachefs_pages"].samples[0].value == 1
    tiers = {s.labels["tier"] for s in families["hicachefs_tier_capacity_bytes"].samples}
    assert "memory" in tiers


def test_config_shows_effective_settings(mount_factory):
    mount = mount_factory("--memory", "32M", "--max-page-size", "2M")
    config = json.loads((mount.path / ".hicachefs" / "config").read_text())
    assert config["memory_bytes"] == 32 << 20
    assert config["max_page_size"] == 2 << 20
    assert config["pid"] == mount.pid
    assert config["mountpoint"] == str(mount.path)


@pytest.mark.parametrize("name", ["stats", "metrics", "config"])
def test_read_only_control_files_refuse_writes(mounted, name):
    with pytest.raises(OSError) as info:
        os.open(mounted.path / ".hicachefs" / name, os.O_WRONLY)
    assert info.value.errno in (errno.EACCES, errno.EPERM)
    with pytest.raises(OSError) as info:
        os.open(mounted.path / ".hicachefs" / "new", os.O_WRONLY | os.O_CREAT)
    assert info.value.errno == errno.EPERM
    assert sorted(os.listdir(mounted.path / ".hicachefs")) == ["arena", "config", "exists", "fetch", "index", "ingest", "metrics", "plane", "stats"]


def test_each_request_stream_answers_to_other_names_that_are_files_of_their_own(mounted):
    """``exists.N``, ``ingest.N`` and ``fetch.N`` (N from 1 to 63) are those files under names with
    inodes of their own, so that the kernel lets writes through different names run at once;
    they are not listed, and a name past 63 is no file."""
    control = mounted.path / ".hicachefs"
    pool = mounted.page_dir()
    publish(pool, "a", b"page a")
    with exists_handle(mounted.path, "exists.63") as fd:
        assert ask_exists(fd, [f"{POOL}/a", f"{POOL}/b"]) == "10"
    fd = os.open(control / "ingest.1", os.O_RDWR)
    try:
        ingest_batch(fd, [(f"{POOL}/b", b"page b")])
        assert ingest_status(fd) == (1, 0)
    finally:
        os.close(fd)
    fd = os.open(control / "fetch.7", os.O_RDWR)
    try:
        assert fetch_pages(fd, [(f"{POOL}/a", 6), (f"{POOL}/b", 6)]) == b"page apage b"
    finally:
        os.close(fd)
    inodes = {os.stat(control / name).st_ino for name in ("exists", "exists.1", "exists.63", "ingest",
                                                          "ingest.1", "fetch", "fetch.1")}
    assert len(inodes) == 7
    assert os.stat(control / "ingest.9").st_mode == os.stat(control / "ingest").st_mode
    assert os.stat(control / "fetch.9").st_mode == os.stat(control / "fetch").st_mode
    for missing in ("ingest.0", "ingest.64", "fetch.01", "stats.1"):
        assert not (control / missing).exists(), missing
    assert sorted(os.listdir(control)) == ["arena", "config", "exists", "fetch", "index", "ingest", "metrics", "plane", "stats"]
    refused = as_nobody("/usr/bin/python3.11", "-c", f"import os; os.open({str(control / 'ingest.5')!r}, os.O_RDWR)")
    assert "PermissionError" in refused.stderr
