"""The mount settings the shared tier checks at start: each engine's mounts as the project's
scripts make them give what the tier needs, and a mount that does not is named in one warning."""

import logging
import os

import pytest
from shared_helpers import FAST

from hicachefs import mount_table
from hicachefs.store.shared import SharedTier, engine_checks
from hicachefs.store.shared.device import DirectoryDevice
from hicachefs_testing.engine import EngineDidNotStart
from hicachefs_testing.juicefs import JuiceVolume

NEEDED = {"attribute cache": 1.0, "entry cache": 1.0, "negative entry cache": 0.0}


def test_each_engines_mounts_give_what_the_tier_needs(engine):
    for view in (engine.a, engine.b):
        settings = engine_checks.settings(str(view / "hc"))
        assert settings is not None and settings.engine == engine.name
        assert {label: settings.caches_s[label] for label in NEEDED} == NEEDED
        assert not settings.writeback and settings.problems() == []
        assert engine_checks.local_mount(str(view / "hc")) is None  # no local-filesystem warning


def test_a_juicefs_mount_with_long_caches_and_writeback_is_named_in_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("JUICEFS_MOUNT_OPTIONS", "--attr-cache 5 --negative-entry-cache 2 --writeback")
    try:
        volume = JuiceVolume.up(tmp_path / "v")
    except EngineDidNotStart as error:
        JuiceVolume.down(tmp_path / "v")
        pytest.skip(f"JuiceFS did not start here: {error}")
    try:
        with caplog.at_level(logging.INFO, logger="hicachefs.store.shared.tier"):
            SharedTier(volume.a / "hc", None, **FAST).close()
    finally:
        JuiceVolume.down(tmp_path / "v")
    warnings = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "JuiceFS mount has attribute cache 5 s (at most 1 s), negative entry cache 2 s" in warnings[0]
    assert "write-back caching" in warnings[0] and "entry cache 1 s" not in warnings[0]


def test_nfs_with_its_default_attribute_caches_is_named():
    mountinfo = ("36 25 0:40 / /mnt/nfs rw,relatime - nfs4 server:/export rw,vers=4.2,rsize=1048576,hard,proto=tcp\n"
                 "37 36 0:41 / /mnt/nfs/fast rw - nfs4 server:/fast rw,vers=4.2,acregmax=1,acdirmax=1,lookupcache=pos\n")
    slow = engine_checks.find_mount("/mnt/nfs/hicache", mountinfo)
    fast = engine_checks.find_mount("/mnt/nfs/fast/hicache", mountinfo)
    assert slow.mountpoint == "/mnt/nfs" and fast.mountpoint == "/mnt/nfs/fast"
    assert engine_checks.nfs_settings(slow.options).problems() == [
        "attribute cache 60 s (at most 1 s)", "entry cache 60 s (at most 1 s)", "negative entry cache 60 s (at most 1 s)"]
    assert engine_checks.nfs_settings(fast.options).problems() == []


def test_another_directory_of_the_volume_bound_at_the_mountpoint_is_another_filesystem(monkeypatch):
    """A volume's other directory bind-mounted at the mountpoint (another deployment's tier,
    holding a journal too) has the volume's type and source: it was taken up as the volume
    mounted again, and the host's pages went where no other host looks (found by review)."""
    volume = "48 25 0:40 / /mnt/shared rw - fuse.juicefs JuiceFS:hicachefs rw,user_id=0\n"
    other = "49 25 0:40 /other\\040tier /mnt/shared rw - fuse.juicefs JuiceFS:hicachefs rw,user_id=0\n"
    mounts = {}
    monkeypatch.setattr(engine_checks, "mount_of", lambda path: engine_checks.find_mount(path, mounts["now"]))
    seen = {}
    for name, text in (("volume", volume), ("other", other), ("again", volume.replace("48 ", "50 ", 1))):
        mounts["now"] = text
        seen[name] = DirectoryDevice().mount_of("/mnt/shared/hc")
    assert engine_checks.find_mount("/mnt/shared/hc", other).root == "/other tier"
    assert seen["other"][2] != seen["volume"][2]  # another directory of it: not the volume again
    assert seen["again"][2] == seen["volume"][2] and seen["again"][1] != seen["volume"][1]


def test_a_mount_whose_path_is_not_utf8_breaks_neither_the_tier_nor_the_mount_table(tmp_path, monkeypatch):
    """mountinfo lists every mount of the namespace, paths as bytes: one mount of anybody's under
    a name that is not UTF-8 made the shared tier's start and ``hicachefs mount`` (with or without
    ``--shared``) fail with a traceback (found by review)."""
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_bytes(b"22 1 254:0 / / rw - ext4 /dev/vda rw\n"
                          b"48 22 0:40 / /mnt/shared rw - fuse.glusterfs server:/volume rw\n"
                          b"70 22 254:0 /home/x/\xff /srv/\xff\xfe rw - ext4 /dev/vda rw\n"
                          b"71 22 0:52 / /mnt/cache rw - fuse.hicachefs hicachefs rw\n")
    monkeypatch.setattr(engine_checks, "MOUNTINFO", str(mountinfo))
    monkeypatch.setattr(mount_table, "MOUNTINFO", str(mountinfo))
    assert engine_checks.mount_of("/mnt/shared/hc").source == "server:/volume"
    assert mount_table.filesystem_type("/mnt/cache") == "fuse.hicachefs" and mount_table.device("/mnt/cache") == "0:52"
    assert mount_table.device(os.fsdecode(b"/srv/\xff\xfe")) == "254:0"
