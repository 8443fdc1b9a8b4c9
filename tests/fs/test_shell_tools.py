"""The mount as a person sees it with standard shell tools; their output is checked."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess

import pytest

from hicachefs_testing.workload import content
from pages import publish, read_page


def sh(*args: str, cwd=None) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, cwd=cwd, timeout=60).stdout


def test_ls_du_df_find_getfattr_cat(mounted):
    pool = mounted.page_dir("m", "bfloat16-page_first-64", "tp0of2", "kv")
    for i in range(3):
        publish(pool, f"key{i}", content(i, 1 << 20))

    listing = sh("ls", "-la", str(pool))
    assert listing.count("-r--r--r--") == 3 and "key2" in listing and "1048576" in listing
    assert ".hicachefs" not in sh("ls", "-a", str(mounted.path))  # reachable by name only
    assert sh("ls", str(mounted.path / ".hicachefs")).split() == ["arena", "config", "exists", "fetch", "index", "ingest", "metrics", "plane", "stats"]

    assert int(sh("du", "-sb", str(mounted.path / "m")).split()[0]) >= 3 << 20
    assert int(sh("du", "-sk", str(pool)).split()[0]) >= 3 * 1024

    df = sh("df", "-B1", str(mounted.path)).splitlines()[1].split()
    total, used, free = int(df[1]), int(df[2]), int(df[3])
    assert total == 64 << 20  # the fixture's --memory
    assert used >= 3 << 20 and free <= total - (3 << 20)

    found = sh("find", str(mounted.path), "-name", "key1").split()
    assert found == [str(pool / "key1")]
    assert len(sh("find", str(mounted.path / "m"), "-type", "f").split()) == 3
    assert len(sh("find", str(mounted.path / "m"), "-type", "d").split()) == 4

    attrs = sh("getfattr", "-d", str(pool / "key0"))
    assert 'user.hicachefs.tier="memory"' in attrs
    assert 'user.hicachefs.checksum="xxh3_64:' in attrs
    read_page(pool / "key0")
    hits = sh("getfattr", "--only-values", "-n", "user.hicachefs.hits", str(pool / "key0"))
    assert int(hits) >= 1

    stats = json.loads(sh("cat", str(mounted.path / ".hicachefs" / "stats")))
    assert stats["pages"] == 3


def test_cp_in_and_out(mounted, tmp_path):
    pool = mounted.page_dir()
    source = tmp_path / "page.bin"
    source.write_bytes(content(5, 5 << 20))
    sh("cp", str(source), str(pool / "copied"))
    sh("cp", str(pool / "copied"), str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()
    assert subprocess.run(["cmp", str(source), str(pool / "copied")]).returncode == 0


def test_rm_evicts_and_rm_r_removes_a_tree(mounted):
    pool = mounted.page_dir("gone", "f", "tp0of1", "kv")
    for i in range(5):
        publish(pool, f"k{i}", b"x" * 4096)
    sh("rm", str(pool / "k0"))
    assert sorted(os.listdir(pool)) == ["k1", "k2", "k3", "k4"]
    sh("rm", "-r", str(mounted.path / "gone"))
    assert not (mounted.path / "gone").exists()
    assert mounted.stats()["pages"] == 0
    pool = mounted.page_dir("gone", "f", "tp0of1", "kv")  # the names are free again
    assert os.listdir(pool) == []


def test_tar_of_a_pool_extracts_into_another_mount_and_exits_0(mount_factory, tmp_path):
    """tar x (as root) sets each directory's and page's owner and mode to what they already are;
    those no-op changes succeed, so the restore exits 0. A change to a published page is still
    refused; a directory takes one and stays as it is."""
    source = mount_factory("--memory", "64M")
    pool_parts = ("m", "bfloat16-page_first-64", "tp0of1", "kv")
    pages = {f"{i:064x}": content(i, 256 << 10) for i in range(6)}
    for key, data in pages.items():
        publish(source.page_dir(*pool_parts), key, data)
    archive = tmp_path / "pool.tar"
    sh("tar", "-C", str(source.path), "-cf", str(archive), "m")

    target = mount_factory("--memory", "64M")
    result = subprocess.run(["tar", "-C", str(target.path), "-xf", str(archive)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    pool = target.path.joinpath(*pool_parts)
    assert sorted(os.listdir(pool)) == sorted(pages)
    for key, data in pages.items():
        assert read_page(pool / key) == data
        assert stat.S_IMODE(os.stat(pool / key).st_mode) == 0o444
    page = pool / next(iter(pages))
    for path, mode in ((pool, 0o755), (page, 0o444)):
        os.chmod(path, mode)
        os.chown(path, os.getuid(), os.getgid())
        os.utime(path)
    for call, args in ((os.chmod, (page, 0o644)), (os.chown, (page, 1234, -1))):
        with pytest.raises(PermissionError):  # a published page is immutable
            call(*args)
    os.chmod(pool, 0o700)  # a directory takes a change and stays as it is
    os.chown(target.path / "m", -1, 1234)
    assert stat.S_IMODE(os.stat(pool).st_mode) == 0o755 and os.stat(page).st_uid == os.getuid()
    assert os.stat(target.path / "m").st_gid == os.getgid()


def test_tar_x_and_cp_a_of_a_tree_another_user_owns_exit_0(mounted, tmp_path):
    """A pool tree a service user wrote (SGLang's file backend, say), with a private directory:
    tar x and cp -a restore its owner and modes on the directories at the end, and exited 2 and
    1 (EPERM for each directory); the pages and directories stay the daemon's user's, 0444 and
    0755. Found by a review helper."""
    tree = tmp_path / "own"
    pool = tree.joinpath("mo", "f", "tp0of1", "kv")
    pool.mkdir(parents=True)
    data = os.urandom(5000)
    (pool / "o1").write_bytes(data)
    for path in (tree / "mo", *tree.joinpath("mo").rglob("*")):
        os.chown(path, 1000, 1000)
    (tree / "mo" / "f").chmod(0o700)
    sh("tar", "-C", str(tree), "-cf", str(tmp_path / "own.tar"), "mo")
    for command in (["tar", "-C", str(mounted.path), "-xf", str(tmp_path / "own.tar")],
                    ["cp", "-a", str(tree / "mo"), str(mounted.path / "mo2")]):
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, (command[0], result.stderr)
    for top in ("mo", "mo2"):
        copied = mounted.path / top / "f" / "tp0of1" / "kv"
        assert read_page(copied / "o1") == data
        assert stat.S_IMODE(os.stat(copied / "o1").st_mode) == 0o444
        assert (os.stat(copied).st_uid, stat.S_IMODE(os.stat(mounted.path / top / "f").st_mode)) == (os.getuid(), 0o755)


def test_df_and_du_agree_for_write_through_pages(mount_factory, tmp_path):
    """With --write-through every page is in RAM and on disk; df counts it once, as du does."""
    mount = mount_factory("--memory", "256M", "--disk", str(tmp_path / "disk"), "--disk-size", "256M",
                          "--write-through")
    pool = mount.page_dir()
    for i in range(100):
        publish(pool, f"{i:064x}", content(i, 1 << 20))
    assert mount.stats()["tiers"]["disk"]["pages"] == 100  # really in both tiers
    df = sh("df", "-B1", str(mount.path)).splitlines()[1].split()
    total, used = int(df[1]), int(df[2])
    du = int(sh("du", "-sB1", str(mount.path)).split()[0])
    assert total == mount.stats()["capacity_bytes"] // 4096 * 4096  # the disk's: RAM holds copies of its pages
    assert du == 100 << 20
    assert abs(used - du) <= 1 << 20, f"df says {used} bytes used, du {du}"


def _ram_of_slabs_used_up(mount_factory):
    """A 16 MiB RAM tier (slabs of 2 MiB) holding 8 pages of 1 MiB + 1 byte: each page's slot
    (1,152 KiB) uses up a slab, and the 40 pages written leave 8. A mount and its pool."""
    mount = mount_factory("--memory", "16M")
    pool = mount.page_dir()
    for i in range(40):
        publish(pool, f"k{i:03d}", content(i, (1 << 20) + 1))
    assert mount.stats()["pages"] == 8
    return mount, pool


def test_df_shows_a_ram_tier_full_when_its_slabs_are_used_up(mount_factory):
    """df's room is what can be stored before a page is evicted, not the capacity less the
    pages' bytes: every slab holds a slot, so a page of any size evicts one now."""
    mount, pool = _ram_of_slabs_used_up(mount_factory)
    fs = os.statvfs(mount.path)
    assert (fs.f_bavail, fs.f_blocks - fs.f_bfree) == (0, fs.f_blocks)  # df: 100 % used
    stats = mount.stats()
    assert (stats["free_bytes"], stats["used_bytes"]) == (0, stats["capacity_bytes"])
    publish(pool, "small", content(99, 100_000))
    assert mount.stats()["evictions"] == stats["evictions"] + 1


def test_st_blocks_count_the_slot_a_page_takes(mount_factory):
    mount, pool = _ram_of_slabs_used_up(mount_factory)
    assert os.stat(pool / "k039").st_blocks * 512 == 1_179_648  # 1 MiB + 1 rounded up to its class
    assert int(sh("du", "-sB1", str(pool)).split()[0]) == 8 * 1_179_648


def test_df_counts_no_room_the_disk_ring_cannot_write_yet(mount_factory, tmp_path):
    """Half the pages of a disk tier whose ring has come round removed: their records' room is
    written again only when the ring reclaims their regions, which evicts the other half. df
    says less than a region (8 MiB here) is free, not the half of the tier they took."""
    mount = mount_factory("--memory", "16M", "--disk", str(tmp_path / "disk"), "--disk-size", "64M")
    pool = mount.page_dir()
    for i in range(100):
        publish(pool, f"k{i:03d}", content(i, 1 << 20))
    assert mount.stats()["tiers"]["disk"]["evictions"] > 0  # the ring came round
    on_disk = [key for key in sorted(os.listdir(pool)) if os.getxattr(pool / key, "user.hicachefs.tier") == b"disk"]
    for key in on_disk[::2]:
        os.unlink(pool / key)
    fs = os.statvfs(mount.path)
    assert fs.f_bavail * fs.f_frsize < 8 << 20
    assert mount.stats()["free_bytes"] // 4096 == fs.f_bavail


def test_find_counts_pages_and_the_name_limit_is_the_key_limit(mounted):
    """find -type f counts pages only (the control directory is reachable by name but not
    listed), and statfs's name limit is the 200 bytes a key may have."""
    pools = [mounted.page_dir("m", "bfloat16-page_first-64", f"tp{r}of2", "kv") for r in range(2)]
    for r, pool in enumerate(pools):
        for i in range(7):
            publish(pool, f"key{i}", content(r * 10 + i, 4096))
    found = sh("find", str(mounted.path), "-type", "f").split()
    assert len(found) == 14 == mounted.stats()["pages"]
    assert sh("stat", "-f", "-c", "%l", str(mounted.path)).strip() == "200"
    longest = "k" * 200
    publish(pools[0], longest, b"x")
    with pytest.raises(OSError) as info:
        publish(pools[0], longest + "k", b"x")
    assert info.value.errno == errno.ENAMETOOLONG
    assert json.loads((mounted.path / ".hicachefs" / "stats").read_text())["pages"] == 15
