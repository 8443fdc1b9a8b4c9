"""Tell systemd the mount is live (``Type=notify`` units), through ``$NOTIFY_SOCKET``.

Without the variable (not started by systemd, or not a notify unit) this does nothing. Sends
one datagram and never blocks for long; thread-safe.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def notify(state: str) -> None:
    """Send ``state`` (like ``READY=1``); a failure is logged, never raised: the mount works anyway."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError as exc:
        log.warning("could not tell systemd %s: %s", state, exc)
