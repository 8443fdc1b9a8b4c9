"""The wheel ships the daemon, the CLI and the client, and nothing that only the tests, the bench
and the demo use (issue 31, item 3). Built from this checkout and installed into a fresh venv
(which finds the suite's third-party packages, never this source tree), it mounts, and its
client stores and reads pages for a host pool."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from hicachefs_testing import mounting

ROOT = Path(__file__).resolve().parents[2]

#: Run by the fresh venv's interpreter: the client from the wheel against the mount; SGLang's
#: side (its config and host pool) from the tests' support, as SGLang would bring its own.
CLIENT = """
import sys, torch
sys.path.append({support!r})
import hicachefs, hicachefs_client
assert hicachefs.__file__.startswith({venv!r}), hicachefs.__file__
assert hicachefs_client.__file__.startswith({venv!r}), hicachefs_client.__file__
try:
    import hicachefs.testing
except ImportError:
    pass
else:
    raise SystemExit("hicachefs.testing came with the wheel")
from hicachefs_client import HiCacheFS
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
from hicachefs_testing.host_pools import MHAHostPool, page_bytes
config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                              is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                              model_name="wheel/check", extra_config={{"mountpoint": {mount!r}, "interface_v1": 1}})
pool, copy = MHAHostPool(), MHAHostPool()
copy.fill_random(seed=1)
assert page_bytes(copy, 0) != page_bytes(pool, 0)
fs = HiCacheFS(config, {{}})
fs.register_mem_pool_host(pool)
keys = [f"{{i:064x}}" for i in range(8)]
indices = torch.cat([pool.page_indices(p) for p in range(8)])
assert fs.batch_set_v1(keys, indices) == [True] * 8
reader = HiCacheFS(config, {{}})
reader.register_mem_pool_host(copy)
assert reader.batch_exists(keys) == 8
assert reader.batch_get_v1(keys, indices) == [True] * 8
assert all(page_bytes(copy, p) == page_bytes(pool, p) for p in range(8))
print("served", len(keys))
"""


def _build_wheel(out: Path) -> Path:
    """Built from a copy of what the wheel is made of, so that the checkout gets no build files."""
    source = out.parent / "source"
    for part in ("pyproject.toml", "README.md"):
        source.mkdir(exist_ok=True)
        shutil.copy(ROOT / part, source / part)
    for package in ("hicachefs", "client"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(source)], check=True, capture_output=True, timeout=300)
    wheel, = out.glob("hicachefs-*.whl")
    return wheel


def _fresh_venv(path: Path, wheel: Path) -> Path:
    """A venv with the wheel installed and the suite's third-party packages on its path."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    python = path / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    # A path file adds the directory alone: the editable install of this checkout in it is a
    # path file of its own, which is not read from there.
    (site / "suite-packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def test_the_wheel_holds_no_test_support_and_mounts_and_serves_the_client(tmp_path):
    wheel = _build_wheel(tmp_path / "dist")
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")} \
        == {"hicachefs", "hicachefs_client"}
    assert not [name for name in names if "testing" in name]
    venv = tmp_path / "venv"
    python = _fresh_venv(venv, wheel)
    mountpoint, log = tmp_path / "mnt", tmp_path / "daemon.log"
    mountpoint.mkdir()
    mounted = subprocess.run([str(venv / "bin" / "hicachefs"), "mount", str(mountpoint), "--memory", "64M",
                              "--log-file", str(log)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert mounted.returncode == 0, mounted.stderr
    mount = mounting.Mount(mountpoint, log, [])
    try:
        config = json.loads((mountpoint / ".hicachefs" / "config").read_text())
        mount.pid = config["pid"]
        assert Path(f"/proc/{mount.pid}/exe").resolve() == python.resolve() or \
            str(venv) in Path(f"/proc/{mount.pid}/cmdline").read_text()
        script = CLIENT.format(support=str(ROOT / "tests" / "support"), venv=str(venv), mount=str(mountpoint))
        served = subprocess.run([str(python), "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert served.returncode == 0, served.stderr
        assert served.stdout.split() == ["served", "8"]
        stopped = subprocess.run([str(venv / "bin" / "hicachefs"), "umount", str(mountpoint)],
                                 capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert mounting.wait_gone(mount.pid, 30)
    finally:
        mounting.stop(mount)
        mounting.unmount_path(mountpoint)
