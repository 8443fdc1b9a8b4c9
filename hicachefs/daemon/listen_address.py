"""``--metrics-listen HOST:PORT``, read and tried: the address the metrics endpoint binds.

Apart from the endpoint (``metrics_endpoint``) so that ``hicachefs mount`` checks the flag before
it starts a daemon without importing what serves it (trio, prometheus_client, pyfuse3).
"""

from __future__ import annotations

import ipaddress
import socket

#: The host of an address given as a port alone: this machine only.
DEFAULT_HOST = "127.0.0.1"


def parse_listen_address(text: str) -> tuple[str, int]:
    """'HOST:PORT', '[IPv6]:PORT', ':PORT' or 'PORT' -> (host, port); a missing host is loopback.

    Raises ValueError with a one-line reason. The host must be an IP address or a name that
    resolves on this machine.
    """
    host, sep, port_text = text.strip().rpartition(":")
    if not sep:
        host, port_text = "", text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, like [::1]:9100")
    host = host or DEFAULT_HOST
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        try:
            socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        except OSError:
            raise ValueError(f"{text!r}: {host} is not an IP address or a known host name") from None
    return host, int(port_text)


def check_can_listen(host: str, port: int) -> None:
    """Bind and release the address, so a port in use is reported before anything is mounted.
    Raises OSError."""
    bound_socket(host, port).close()


def bound_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to the address (SO_REUSEADDR: a restart need not wait out TIME_WAIT)."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    bound = socket.socket(family, socket.SOCK_STREAM)
    try:
        bound.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bound.bind(address)
    except BaseException:
        bound.close()
        raise
    return bound
