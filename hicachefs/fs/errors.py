"""The one error type of the POSIX layer: an errno and a message for the daemon's log."""


class FsError(OSError):
    """A request the namespace refuses, carrying the errno the caller is to see."""

    def __init__(self, err: int, message: str):
        super().__init__(err, message)
