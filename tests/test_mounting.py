"""The test harness itself: stopping a mount never signals a process that is not its daemon.

Stress runs of the state machine twice lost a daemon to a SIGTERM meant for no one: a mount was
stopped a second time (a scenario stops its mount, then the fixture's teardown stops it again),
and its daemon's number had meanwhile been given to the daemon of another test, on a host whose
pid_max is 32768. The model saw ECONNABORTED in the middle of a step.
"""

from __future__ import annotations

import subprocess

from hicachefs_testing import mounting
from hicachefs_testing.workload import serving


def _number_reused(mount: mounting.Mount, pid: int) -> None:
    """Make ``mount`` look as it would if its daemon had ended and ``pid`` were its old number."""
    mount.identity = (pid, mount.identity[1]) if getattr(mount, "identity", None) else None
    mount.pid = pid


def test_stopping_a_mount_again_leaves_the_process_that_took_its_number_alone(mount_factory):
    first = mount_factory("--memory", "32M")
    mounting.stop(first)
    other = mount_factory("--memory", "32M")
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        for reused in (other.pid, bystander.pid):  # as if the first daemon's number went to them
            _number_reused(first, reused)
            mounting.stop(first)
            mounting.kill(first)
        assert bystander.poll() is None, "a process that is no hicachefs daemon was signalled"
        assert mounting.alive(other.pid) and serving(other.path), "another mount's daemon was signalled"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_daemon_restarted_at_the_same_path_is_not_taken_for_the_old_one(mount_factory, tmp_path):
    first = mount_factory("--memory", "32M", path=tmp_path / "same")
    mounting.stop(first)
    second = mount_factory("--memory", "32M", path=tmp_path / "same")
    _number_reused(first, second.pid)  # same number, same mountpoint, but a later process
    mounting.stop(first)
    assert mounting.alive(second.pid) and serving(second.path)
