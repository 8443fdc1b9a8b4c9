"""A real JuiceFS volume for the shared tier's tests and benchmark (an ``engine.Engine``).

``scripts/juicefs.sh up DIR`` starts a private redis-server on a Unix socket under DIR (the
metadata engine), formats a volume with file storage under DIR and mounts it at ``DIR/a`` and
``DIR/b``; ``down DIR`` removes all of it. Several can run at once. Its server is redis-server:
``stop`` ends it (every metadata call on the mounts then hangs in JuiceFS's retries), ``start``
runs ``up`` again, which starts it on the same data; ``frozen`` stops it and both mounts'
processes.
"""

from __future__ import annotations

import os
import signal
import time

from hicachefs_testing.engine import Engine, alive


class JuiceVolume(Engine):
    name = "JuiceFS"
    script = "juicefs.sh"

    def _pids(self, file: str) -> list[int]:
        return [int(pid) for pid in (self.directory / file).read_text().split()]

    def stop(self, timeout: float = 10.0) -> None:
        """End redis-server (it writes its append-only file first) and wait until it is gone."""
        (pid,) = self._pids("redis.pid")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while alive(pid):
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server {pid} did not end within {timeout} s")
            time.sleep(0.02)

    def _restart(self) -> None:
        self.run_script("up", self.directory, timeout=120)

    def server_pids(self) -> list[int]:
        """redis-server, then each mount's supervising and FUSE-serving processes."""
        return self._pids("redis.pid") + self._pids("mount-a.pid") + self._pids("mount-b.pid")
