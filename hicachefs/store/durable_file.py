"""Replacing or removing a small file beside the arena whole or not at all, across a crash or a
power loss: the SSD tier's index snapshot and list of records let go of while live, and the shared
tier's list of removals owed to its volume, are written so.

Blocking file I/O; no shared state.
"""

from __future__ import annotations

import os
from pathlib import Path


def replace_durably(directory: Path, name: str, parts: list) -> None:
    """Make ``parts`` (bytes-like, in order) the file ``name`` in ``directory``: written under a
    temporary name (``.NAME.tmp``), fsynced, renamed into place, the directory fsynced. Raises
    OSError, the old file left as it was."""
    temporary = directory / f".{name}.tmp"
    try:
        with open(temporary, "wb") as out:
            for part in parts:
                out.write(part)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, directory / name)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _sync_directory(directory)


def remove_durably(directory: Path, name: str) -> None:
    """Remove the file ``name`` in ``directory`` (if there is one), the directory fsynced, so that
    a power loss does not bring it back. Raises OSError."""
    (directory / name).unlink(missing_ok=True)
    _sync_directory(directory)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
