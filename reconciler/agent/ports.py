"""Whether a TCP port is free on this machine: a service's port is checked at admission."""

from __future__ import annotations

import socket


def port_free(port: int) -> bool:
    """True when nothing listens on `port` on any IPv4 address here: a bind to the wildcard
    address fails while a socket holds it on any address (a socket lingering in TIME_WAIT
    does not count, as it would not stop the service from binding)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True
