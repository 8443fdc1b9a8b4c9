"""The page store's configuration, validated once at construction."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class StoreConfig:
    """Sizes and modes of the tiers. Immutable, so safe to share between threads.

    ``memory_bytes``: the RAM arena. ``disk_dir``/``disk_bytes``: the SSD tier (one
    preallocated arena file in ``disk_dir``); no SSD tier when ``disk_dir`` is None.
    ``write_through``: every publish is also written to the SSD tier before it returns.
    ``max_page_size``: larger pages are refused with PageTooLarge.
    ``shared_dir``/``shared_bytes``: the shared tier, a directory on a distributed filesystem
    that several hosts mount, with an optional size bound (None: the filesystem's free space).
    """

    memory_bytes: int = 1 << 30
    disk_dir: Path | None = None
    disk_bytes: int = 0
    write_through: bool = False
    max_page_size: int = 64 << 20
    shared_dir: Path | None = None
    shared_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.memory_bytes < 4096:
            raise ValueError(f"memory_bytes must be at least 4096, got {self.memory_bytes}")
        if not 0 < self.max_page_size < (1 << 32):
            raise ValueError(f"max_page_size must be in 1..4G-1, got {self.max_page_size}")
        if self.disk_dir is not None and self.disk_bytes <= 0:
            raise ValueError("disk_dir is set but disk_bytes is not positive")
        if self.write_through and self.disk_dir is None:
            raise ValueError("write_through needs a disk tier (disk_dir)")
        if self.shared_bytes is not None and (self.shared_dir is None or self.shared_bytes <= 0):
            raise ValueError("shared_bytes needs a shared_dir and must be positive")
