"""``DaemonConfig``: what the command line hands the daemon, checked (``cli/mount_config.py``).

The background daemon gets it as JSON (``dataclasses.asdict``) on its command line, and shows
it, with its pid, in ``.hicachefs/config``. Immutable; no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..store import StoreConfig


@dataclass(frozen=True)
class DaemonConfig:
    """Everything the daemon needs, as validated by the command line."""

    mountpoint: str
    memory_bytes: int
    disk_dir: str | None
    disk_bytes: int
    write_through: bool
    max_page_size: int
    log_level: str
    log_file: str | None
    temp_timeout_s: float = 60.0
    shared_dir: str | None = None
    shared_bytes: int | None = None
    kernel_cache: bool = True
    metrics_listen: str | None = None
    #: Kernel mount flags given with ``-o`` (nosuid, noatime...), passed on with the mount.
    fuse_options: tuple[str, ...] = ()

    def store_config(self) -> StoreConfig:
        return StoreConfig(
            memory_bytes=self.memory_bytes,
            disk_dir=Path(self.disk_dir) if self.disk_dir else None,
            disk_bytes=self.disk_bytes,
            write_through=self.write_through,
            max_page_size=self.max_page_size,
            shared_dir=Path(self.shared_dir) if self.shared_dir else None,
            shared_bytes=self.shared_bytes,
        )
