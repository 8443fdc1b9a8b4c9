"""A real GlusterFS volume for the shared tier's tests and benchmark (an ``engine.Engine``).

``scripts/glusterfs.sh up DIR`` starts a private glusterd and a one-node volume mounted at
``DIR/a`` and ``DIR/b``; ``down DIR`` removes all of it. Its servers are the volume's brick:
``stop``/``start`` stop and start the volume, ``frozen`` stops the brick process. Only one
glusterd can run per machine, so ``up`` fails while another one runs.
"""

from __future__ import annotations

import subprocess

from hicachefs_testing.engine import Engine

VOLUME = "hicachefs"


class GlusterVolume(Engine):
    name = "GlusterFS"
    script = "glusterfs.sh"

    def gluster(self, *args: str) -> str:
        command = ["gluster", "--mode=script", f"--glusterd-sock={self.directory}/run/glusterd.socket",
                   f"--log-file={self.directory}/log/cli.log", *args]
        return subprocess.run(command, check=True, capture_output=True, text=True, timeout=60).stdout

    def stop(self) -> None:
        """Stop the volume under both mounts (its brick goes away; the mounts stay)."""
        self.gluster("volume", "stop", VOLUME, "force")

    def _restart(self) -> None:
        self.gluster("volume", "start", VOLUME, "force")  # the mounts reconnect within a few seconds

    def server_pids(self) -> list[int]:
        """The brick: frozen, calls on the mounts hang (until GlusterFS's ping timeout, 42 s)."""
        pid_files = list((self.directory / "run" / "vols" / VOLUME).glob("*.pid"))
        assert len(pid_files) == 1, f"expected one brick pid file, found {pid_files}"
        return [int(pid_files[0].read_text())]
