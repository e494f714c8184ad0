"""What a token-less API on loopback refuses: requests a web page the user opens could make.

Loopback without a token trusts whoever reaches 127.0.0.1, and a browser reaches it on a
page's behalf: by DNS rebinding (a name of the page's own, pointed at 127.0.0.1, sends that
name as its Host) or by requests it sends without asking (a form's POST, a `text/plain`
fetch), which carry the page's Origin and `Sec-Fetch-Site`. Pure: the caller passes the
headers in (serve's guard, a node agent's log port)."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def web_page_request(host: str | None, origin: str | None, fetch_site: str | None) -> str | None:
    """Why a request with these headers may come from a web page (and is refused), or None.
    `host`: the Host header; `origin`: Origin; `fetch_site`: Sec-Fetch-Site."""
    if host is not None and not _loopback_host(host):
        return f"Host {host!r} is not a loopback name of this server (a DNS rebinding?); use 127.0.0.1"
    if origin is not None and (host is None or not _same_origin(origin, host)):
        return f"a request from the web origin {origin!r} is refused: this API has no tokens"
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"a {fetch_site} request is refused: this API has no tokens"
    return None


def _loopback_host(host: str) -> bool:
    """A loopback address, or `localhost`, as written: never resolved (serve.is_loopback
    resolves a name, which a rebinding page's own DNS would answer with 127.0.0.1)."""
    try:
        name = urlsplit(f"//{host}").hostname
    except ValueError:  # an unclosed [, a bad port
        return False
    if name is None:
        return False
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _same_origin(origin: str, host: str) -> bool:
    """The page is this server's own (its dashboard): scheme://Host exactly."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower() and not parts.path
