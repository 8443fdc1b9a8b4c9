"""The page namespace ``<model>/<format>/<shard>/<pool>/<key>``: depths and name rules.

Pure functions, no pyfuse3 and no store, so the daemon and its tests share one definition
of what a valid name is (see docs/contract.md, "Namespace").
"""

import errno

#: Directory depth of a pool directory (model/format/shard/pool); pages live directly in it.
POOL_DEPTH = 4
#: Longest accepted name component, in UTF-8 bytes.
MAX_NAME_BYTES = 200
#: Name of the control directory at the mount root.
CONTROL_DIR = ".hicachefs"


class BadName(ValueError):
    """A name component the namespace refuses; ``errno`` says which error to report."""

    def __init__(self, err: int, message: str):
        super().__init__(message)
        self.errno = err


def check_component(name: bytes) -> str:
    """Return ``name`` decoded if it may be a directory or page name, else raise BadName.

    Names starting with ``.`` are reserved (temporary files, control files) and are refused
    here; callers that accept temporary names test :func:`is_temporary` first.
    """
    if not name:
        raise BadName(errno.EINVAL, "empty name")
    if len(name) > MAX_NAME_BYTES:
        raise BadName(errno.ENAMETOOLONG, f"name longer than {MAX_NAME_BYTES} bytes")
    if b"\0" in name or b"/" in name:
        raise BadName(errno.EINVAL, "name contains NUL or '/'")
    if name.startswith(b"."):
        raise BadName(errno.EINVAL, "names starting with '.' are reserved")
    try:
        return name.decode("utf-8")
    except UnicodeDecodeError:
        raise BadName(errno.EINVAL, "name is not valid UTF-8") from None


def is_temporary(name: bytes) -> bool:
    """A ``.``-prefixed name in a pool directory: a page being written, not yet published."""
    return name.startswith(b".") and name not in (b".", b"..")


def check_temporary(name: bytes) -> str:
    """Return a temporary file's name decoded, or raise BadName."""
    if len(name) > MAX_NAME_BYTES + 1:
        raise BadName(errno.ENAMETOOLONG, "temporary name too long")
    if b"\0" in name:
        raise BadName(errno.EINVAL, "name contains NUL")
    return name.decode("utf-8", "surrogateescape")
