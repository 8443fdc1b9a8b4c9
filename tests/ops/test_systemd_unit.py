"""The systemd template unit: it verifies, its ExecStart mounts, its stop signal unmounts
cleanly with RAM written down, and a start after a crash comes back warm.

systemd is not PID 1 here, so the test does what systemd would: it reads the unit file, runs
its ExecStartPre and ExecStart command lines with the unit's environment, waits for READY=1
on a notify socket, and sends the unit's KillSignal to the main process.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from hicachefs_testing import mounting
from hicachefs_testing.workload import content
from pages import publish, read_page

UNIT = Path(__file__).resolve().parents[2] / "contrib" / "systemd" / "hicachefs@.service"


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def environment_file(path: Path) -> dict[str, str]:
    pairs = (line.partition("=") for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {key: value for key, _, value in pairs}


class Unit:
    """One instance of the template, started and stopped as systemd would."""

    def __init__(self, ns, mountpoint: Path, options: str, tmp_path: Path):
        self.ns = ns
        self.settings = unit_settings()
        self.instance = subprocess.run(["systemd-escape", "--path", str(mountpoint)], capture_output=True,
                                       text=True, check=True).stdout.strip()
        conf = tmp_path / f"{self.instance}.conf"  # stands in for /etc/hicachefs/<instance>.conf
        conf.write_text(f"# written by the test\nOPTIONS={options}\n")
        assert self.settings["EnvironmentFile"] == ["-/etc/hicachefs/%i.conf"]
        self.environment = {}
        for assignment in self.settings.get("Environment", []):
            key, _, value = assignment.partition("=")
            self.environment[key] = value
        self.environment.update(environment_file(conf))
        self.notify_path = tmp_path / "notify"
        self.journal = ns.log_dir / "journal.log"
        self.main: subprocess.Popen | None = None

    def command(self, key: str) -> tuple[list[str], bool]:
        """A command line of the unit with %-specifiers and ${VAR} expanded as systemd does,
        and whether its failure counts (a leading '-' says it does not)."""
        (line,) = self.settings[key]
        failure_counts = not line.startswith("-")
        line = line.removeprefix("-")
        mountpoint = subprocess.run(["systemd-escape", "--unescape", "--path", self.instance], capture_output=True,
                                    text=True, check=True).stdout.strip()
        words = shlex.split(line.replace("%f", mountpoint).replace("%i", self.instance))
        expanded = []
        for word in words:
            if word.startswith("${") and word.endswith("}"):
                expanded.append(self.environment[word[2:-1]])  # one argument, even if empty
            else:
                assert "$" not in word, word
                expanded.append(word)
        return expanded, failure_counts

    def start(self) -> int:
        command, failure_counts = self.command("ExecStartPre")
        assert self.ns.run(*command).returncode == 0 or not failure_counts
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            self.notify_path.unlink(missing_ok=True)
            notify.bind(str(self.notify_path))
            notify.settimeout(120)
            with open(self.journal, "a") as journal:
                self.main = self.ns.popen(*self.command("ExecStart")[0], stdout=journal, stderr=journal,
                                          env={**os.environ, "NOTIFY_SOCKET": str(self.notify_path)})
            message = notify.recv(4096)
        assert message == b"READY=1"
        return self.main.pid

    def stop(self) -> int:
        (kill_signal,) = self.settings.get("KillSignal", ["SIGTERM"])
        self.main.send_signal(signal.Signals[kill_signal])
        return self.main.wait(timeout=120)


def test_unit_passes_systemd_analyze_verify(mount_namespace):
    result = mount_namespace.run("systemd-analyze", "verify", str(UNIT))
    assert result.returncode == 0 and result.stdout + result.stderr == "", result.stderr


def test_stop_is_a_clean_unmount_and_a_restart_is_warm(mount_namespace, tmp_path):
    ns = mount_namespace
    mountpoint = tmp_path / "mnt"
    unit = Unit(ns, mountpoint, f"memory=32M,disk={tmp_path / 'ssd'},disk_size=128M,max_page_size=4M", tmp_path)
    assert unit.settings["Restart"] == ["on-failure"] and unit.settings["Type"] == ["notify"]

    pid = unit.start()
    assert ns.mounts()[str(mountpoint)][0] == "fuse.hicachefs"  # live when READY=1 came
    assert ns.daemon_pid(mountpoint) == pid
    pool = ns.outside(mountpoint) / "m" / "bfloat16-page_first-64" / "tp0of1" / "kv"
    pool.mkdir(parents=True)
    pages = {f"k{i}": content(i, 1 << 20) for i in range(8)}
    for key, data in pages.items():
        publish(pool, key, data)

    assert unit.stop() == 0
    assert str(mountpoint) not in ns.mounts()
    assert "store closed" in unit.journal.read_text()

    pid = unit.start()  # systemctl start again: warm, the pages were written down at stop
    ns.daemon_pid(mountpoint)
    tiers = {subprocess.run(["getfattr", "--only-values", "-n", "user.hicachefs.tier", str(pool / key)],
                            capture_output=True, text=True).stdout for key in pages}
    assert tiers == {"disk"}
    for key, data in pages.items():
        assert read_page(pool / key) == data

    os.kill(pid, signal.SIGKILL)  # a crash: Restart=on-failure starts the unit again
    assert unit.main.wait(timeout=10) == -signal.SIGKILL
    assert mounting.alive(pid) is False and str(mountpoint) in ns.mounts()  # dead mount left behind
    unit.start()
    ns.daemon_pid(mountpoint)
    assert f"removed the dead mount at {mountpoint}" in unit.journal.read_text()
    for key, data in pages.items():
        assert read_page(pool / key) == data
    assert unit.stop() == 0
    assert str(mountpoint) not in ns.mounts()


@pytest.mark.parametrize("options, message", [("memory=32M,nonsense", "unknown mount option nonsense")])
def test_bad_options_exit_2_which_the_unit_does_not_restart(mount_namespace, tmp_path, options, message):
    unit = Unit(mount_namespace, tmp_path / "mnt", options, tmp_path)
    assert unit.settings["RestartPreventExitStatus"] == ["2"]
    result = mount_namespace.run(*unit.command("ExecStart")[0])
    assert result.returncode == 2 and result.stderr == f"hicachefs: {message}\n"
