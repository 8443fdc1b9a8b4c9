"""The daemon's log file: written in the directory it was given, whatever happens at its path.

Opened again at the next line once it was moved or removed (logrotate's ``create`` rotation):
opened once, the daemon went on writing into the rotated file for good, or into a deleted one
once that was compressed. Opened in its directory, which is held open, and never through a
symlink: a default log's directory removed (a temp-dir cleaner, an operator's ``rm``) and made
again by another user with a symlink under the log's name had root's daemon append its lines
to any file that user chose (found by review). The path is resolved once, at the start, so a
log given as a symlink is written where it led then. Where the directory itself was removed or
replaced (a tmpfs unmounted at logout and mounted anew at login, an ``rm -r``), the one at its
path is taken up again if it is the daemon's user's or root's and no one else may write it; and nothing but a regular file is
written to (a FIFO planted at the log's name held every logging thread in its open for good).

A line that cannot be written (the file cannot be opened again: its directory gone, a symlink
in its place) is lost, never the work that logged it: the reopen's OSError reached the caller,
and a stop's first line ended the daemon before its disk tier's snapshot. Lost quietly:
logging's own report of it was a traceback of some 4 KiB a line on stderr, which is that very
log file's first copy.
"""

from __future__ import annotations

import errno
import logging
import os
import stat

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


class LogFile(logging.StreamHandler):
    """A logging handler writing to the file at ``path``. See the module docstring."""

    def __init__(self, path: str) -> None:
        super().__init__(None)
        self._path, self._name = os.path.split(os.path.realpath(path))
        self._directory = os.open(self._path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._identity: tuple[int, int] | None = None
        self.stream = None
        self._open()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if self._moved():
                self._open()
        except OSError:
            return
        super().emit(record)

    def close(self) -> None:
        try:
            self._close_stream()
            if self._directory >= 0:
                os.close(self._directory)
                self._directory = -1
        finally:
            super().close()

    def _moved(self) -> bool:
        """Whether the file at the log's name is no longer the one open (or none is open)."""
        held = os.fstat(self._directory)
        try:
            found = os.lstat(self._path)
            gone = (found.st_dev, found.st_ino) != (held.st_dev, held.st_ino)  # (a tmpfs unmounted lazily
            # and mounted anew at logout and login: the old directory still linked, out of reach)
        except FileNotFoundError:
            gone = False  # nothing to take up: lines go into the held directory until one is there
        if gone or held.st_nlink == 0:
            self._take_up_directory()
        try:
            found = os.stat(self._name, dir_fd=self._directory, follow_symlinks=False)
        except FileNotFoundError:
            return True
        return self.stream is None or (found.st_dev, found.st_ino) != self._identity

    def _take_up_directory(self) -> None:
        """The directory at the log's path in place of the one removed, where it is safe."""
        fd = os.open(self._path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        found = os.fstat(fd)
        if found.st_uid not in (0, os.geteuid()) or (found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX):
            os.close(fd)
            raise OSError(errno.EPERM, "the log's directory was made again by another user", self._path)
        os.close(self._directory)
        self._directory = fd

    def _open(self) -> None:
        self._close_stream()
        fd = os.open(self._name, _FLAGS, 0o666, dir_fd=self._directory)
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):
            os.close(fd)
            raise OSError(errno.EINVAL, "not a regular file", self._name)
        os.set_blocking(fd, True)
        self._identity = (opened.st_dev, opened.st_ino)
        self.stream = os.fdopen(fd, "a", encoding="utf-8", errors="backslashreplace")

    def _close_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.close()
