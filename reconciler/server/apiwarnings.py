"""Warnings the API answers beside a success, as a Kubernetes API server sends them: a
`Warning: 299 - "text"` header each (and, in an ApplyResult, its `warnings` list)."""

from __future__ import annotations

from fastapi.responses import Response

from ..manifests import Loaded


def status_ignored(loaded: Loaded) -> list[str]:
    """API.md 1: a `status` given on apply is ignored, with a warning (each object's)."""
    return [
        f"{m.source} ({m.kind.kind}/{m.name}): status is written only by the system; ignored"
        for m in loaded.manifests
        if m.ignored_status
    ]


def warned(response: Response, warnings: list[str]) -> Response:
    """Warnings as Kubernetes sends them: a `Warning: 299 - "text"` header each."""
    for text in warnings:
        response.headers.append("Warning", '299 - "' + text.replace('"', "'") + '"')
    return response
