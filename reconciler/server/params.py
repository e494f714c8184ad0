"""What a request asks beyond its route's own parameters is refused, never ignored: a
Kubernetes client's `fieldSelector`, `limit` or `dryRun` on a route that would not honour it
must not be taken for done (a `DELETE ?dryRun=All` that deleted). Here: the check every route
runs first, `dryRun`'s one value, and the DeleteOptions a DELETE may carry."""

from __future__ import annotations

from fastapi import Request
from fastapi.dependencies.models import Dependant

from ..errors import ReconcilerError
from ..wire import DeleteOptions, Preconditions


class BadRequest(ReconcilerError):
    """A request the server does not take as asked (400, as Kubernetes answers it)."""

    exit_code = 2


DASHBOARD = "/ui/"  # with "/": the dashboard's pages, fragments and assets
_KNOWN = "_reconciler_query"  # a route's attribute: the names its query may use, found once


async def refuse_unknown_parameters(request: Request) -> None:
    """400 for a query parameter the matched route does not take. The dashboard's pages are
    spared: a page's query names the filters of its view, and each of its fragments is given
    the page's whole query. `async`, though it awaits nothing: FastAPI runs a plain function
    dependency in its thread pool, a hop of every request to another thread and back."""
    path = request.url.path
    if not request.query_params or path == "/" or path.startswith(DASHBOARD):
        return
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return
    known = getattr(route, _KNOWN, None)
    if known is None:
        known = frozenset(_query_parameters(dependant))
        setattr(route, _KNOWN, known)
    unknown = [name for name in request.query_params if name not in known]
    if unknown:
        takes = ", ".join(sorted(known)) if known else "none"
        raise BadRequest(f"query parameter {unknown[0]!r} is not supported here (this request takes: {takes})")


def _query_parameters(dependant: Dependant) -> list[str]:
    """The names a route's query may use: its own and its dependencies'."""
    names = [p.alias for p in dependant.query_params]
    for sub in dependant.dependencies:
        names += _query_parameters(sub)
    return names


def dry_run(value: str | list[str] | None) -> bool:
    """Kubernetes' dryRun: `All`, or nothing (absent or empty); any other value is refused
    (a `dryRun=false` read as "some value given" stored nothing while answering 201)."""
    values = [value] if isinstance(value, str) else list(value or [])
    values = sorted({v for v in values if v != ""})
    if not values:
        return False
    if values != ["All"]:
        raise BadRequest(f"dryRun {', '.join(values)!r}: the only value is All (or leave it out)")
    return True


def delete_options(options: DeleteOptions | None, query_dry_run: str | None) -> tuple[bool, Preconditions | None]:
    """A DELETE's dry run (from the query or the body) and preconditions."""
    given = options.dry_run if options is not None else []
    return dry_run([*given, *([query_dry_run] if query_dry_run else [])]), options.preconditions if options else None
