"""A device call held until the test lets it go: the test knows the call is under way (an event,
not a sleep), and the call cannot end before the test has checked what it wanted meanwhile."""

from __future__ import annotations

import threading

#: A held call goes on by itself after this long, so a test that never releases it fails
#: (``timed_out``) instead of hanging.
HOLD_TIMEOUT_S = 10.0


class HeldCall:
    """From construction until ``release``, every call of ``device.<method>`` waits in the device
    (the store's FileDevice, the shared tier's DirectoryDevice, a FaultyDevice around either).

    ``entered`` is set once a call waits. ``timed_out`` is True if one went on by itself."""

    def __init__(self, device, method: str) -> None:
        self._call = getattr(device, method)
        self._released = threading.Event()
        self.entered = threading.Event()
        self.timed_out = False
        setattr(device, method, self._held)

    def _held(self, *args, **kwargs):
        self.entered.set()
        if not self._released.wait(HOLD_TIMEOUT_S):
            self.timed_out = True
        return self._call(*args, **kwargs)

    def release(self) -> None:
        """Let the waiting call go on; later calls pass straight through."""
        self._released.set()
