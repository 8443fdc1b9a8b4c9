"""``--metrics-listen HOST:PORT``: serve ``/metrics`` over HTTP for Prometheus to scrape.

prometheus_client's WSGI server runs in its own threads, one per scrape. The daemon's
counters (the request and error counters, the namespace's files being written) belong to the
trio thread and are changed between awaits without a lock, so a scrape never reads them from
its own thread: it asks the trio loop to evaluate the statistics (``trio.from_thread.run_sync``)
and waits for the answer, a fresh dict that the scrape thread then owns and renders with the
same ``metrics.StatisticsCollector`` as ``.hicachefs/metrics``. A scrape while the loop is not
running (before it starts, while it shuts down) gets an empty answer.

Thread-safe as described; ``open`` binds (may fail with OSError), ``close`` blocks for up to
half a second while the server's loop notices.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Callable

import trio
from prometheus_client import start_http_server

from .metrics import registry_of

log = logging.getLogger(__name__)

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
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the real server does
        probe.bind(address)


class MetricsEndpoint:
    """The HTTP server and the bridge from its threads to the trio loop."""

    def __init__(self, address: str, statistics: Callable[[], dict]):
        """Bind ``address`` and start serving; ``statistics`` is only ever called on the loop."""
        self._statistics = statistics
        self._trio_token: trio.lowlevel.TrioToken | None = None
        host, port = parse_listen_address(address)
        self._server, _thread = start_http_server(port, host, registry_of(self._statistics_from_loop))
        log.info("serving metrics at http://%s/metrics", address)

    def attach(self, trio_token: trio.lowlevel.TrioToken) -> None:
        """Call from the trio loop once it runs: scrapes are answered from then on."""
        self._trio_token = trio_token

    def _statistics_from_loop(self) -> dict | None:
        token = self._trio_token
        if token is None:
            return None
        try:
            return trio.from_thread.run_sync(self._statistics, trio_token=token)
        except trio.RunFinishedError:
            return None

    def close(self) -> None:
        self._trio_token = None
        self._server.shutdown()
        self._server.server_close()
