"""What a viewer's token sees of an object and what it may not see: a password in a URL's
user info (a Source's broker, queue server or template artifact, a Notifier's webhook, a
Job's artifact) as ***. An admin's token, which may PUT the object back, sees it whole; so
does every caller of a token-less server (loopback only: the machine's owner)."""

from __future__ import annotations

import copy
from typing import Any

from fastapi import Request

from ..api.source import shown_url


def viewer(request: Request) -> bool:
    """The request carries a viewer's token (`guard.py` put its role in the scope)."""
    return bool(request.scope.get("reconciler.role") == "viewer")


# where an object's spec may carry a password, in a URL's user info
_SECRET_URLS = {
    "Source": (("amqp", "url"), ("http", "url"), ("template", "artifact", "url")),
    "Notifier": (("url",),),
    "Job": (("artifact", "url"),),
}


def without_secrets(document: dict[str, Any]) -> dict[str, Any]:
    """The object as a viewer's token sees it: a password in a broker's, a webhook's or an
    artifact's URL shown as *** (an admin's token, which may PUT it back, sees it whole)."""
    paths = _SECRET_URLS.get(document.get("kind", ""), ())
    shown = document
    for path in paths:
        holder: Any = document.get("spec")
        for key in path[:-1]:
            holder = holder.get(key) if isinstance(holder, dict) else None
        url = holder.get(path[-1]) if isinstance(holder, dict) else None
        if not isinstance(url, str) or (masked := shown_url(url)) == url:
            continue
        if shown is document:
            shown = copy.deepcopy(document)
        target = shown["spec"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = masked
    return shown
