"""The web dashboard at `GET /` (API.md section 4): server-rendered HTML and one small
script, shipped as package data (no Node.js anywhere).

How the browser authenticates: a page (`/`, `/ui/...`) is a shell holding no data, served
without a token; its script asks for the view's HTML fragment (`/ui/fragments/...`) and
every API call with `Authorization: Bearer TOKEN`, like any client. With `--tokens`, the
token is typed once into the shell's form and kept in the tab's sessionStorage (gone when
the tab closes; never in a URL, a cookie or a log), so no cookie exists that another site
could make the browser send: no CSRF. A strict Content-Security-Policy (scripts and styles
from this server only, no inline script) keeps injected markup from running. The guard
tells the fragment routes the token's role: a viewer's pages have no buttons (and the API
refuses a viewer's POST anyway)."""

from __future__ import annotations

from importlib import resources

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, Response

from ...store import Store
from . import pages

STATIC = {"dashboard.js": "text/javascript", "dashboard.css": "text/css"}
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
VIEWS = {"graph": "Graph", "jobs": "Jobs", "pools": "Pools", "nodes": "Nodes"}
SHELL_PATHS = ("/", "/ui/jobs", "/ui/pools", "/ui/nodes")


def is_open(path: str) -> bool:
    """The shells and their assets: no data in them, so no token is needed to load them."""
    if path in SHELL_PATHS or path.startswith("/ui/static/"):
        return True
    return path.startswith("/ui/jobs/") and path.count("/") == 3


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _shell(view: str, title: str) -> str:
    nav = "".join(
        f'<a href="{"/" if v == "graph" else "/ui/" + v}"{" class=current" if v == view else ""}>{label}</a>'
        for v, label in VIEWS.items()
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{pages.h(title)} · reconciler</title><link rel="icon" href="data:,">
<link rel="stylesheet" href="/ui/static/dashboard.css"></head>
<body data-view="{view}"><header><strong>reconciler</strong><nav>{nav}</nav>
<span id="live" class="live" title="the watch stream">connecting</span>
<button type="button" id="signout" hidden>sign out</button></header>
<form id="login" class="login" hidden><p>This server needs a token (an admin or a viewer token from its
tokens file). It is kept in this tab only (sessionStorage) and sent as a bearer token.</p>
<label>token <input type="password" name="token" autocomplete="off" required></label>
<button type="submit">Sign in</button><span class="said"></span></form>
<p id="notice" class="notice" aria-live="polite"></p><main id="main"><p class="loading">loading…</p></main>
<script src="/ui/static/dashboard.js"></script></body></html>"""


def routes(app: FastAPI, store: Store) -> None:
    assets = {name: _asset(name) for name in STATIC}

    def html(text: str) -> HTMLResponse:
        return HTMLResponse(text, headers=SECURITY_HEADERS)

    @app.get("/", include_in_schema=False)
    def home() -> Response:
        return html(_shell("graph", "graph"))

    @app.get("/ui/{view}", include_in_schema=False)
    def view(view: str) -> Response:
        if view not in VIEWS or view == "graph":
            return Response(status_code=404)
        return html(_shell(view, view))

    @app.get("/ui/jobs/{name}", include_in_schema=False)
    def job(name: str) -> Response:
        return html(_shell("job", name))

    @app.get("/ui/static/{name}", include_in_schema=False)
    def static(name: str) -> Response:
        if name not in assets:
            return Response(status_code=404)
        return Response(assets[name], media_type=STATIC[name], headers={"Cache-Control": "no-cache"})

    @app.get("/ui/fragments/graph", include_in_schema=False)
    def graph_fragment(label_selector: str = Query("", alias="labelSelector")) -> Response:
        return html(pages.graph_view(store, label_selector))

    @app.get("/ui/fragments/jobs", include_in_schema=False)
    def jobs_fragment(
        label_selector: str = Query("", alias="labelSelector"), phase: str = "", page: int = Query(1, ge=1)
    ) -> Response:
        return html(pages.jobs_view(store, label_selector, phase, page))

    @app.get("/ui/fragments/jobs/{name}", include_in_schema=False)
    def job_fragment(request: Request, name: str) -> Response:
        admin = request.scope.get("reconciler.role", "admin") == "admin"  # no tokens: loopback, all may act
        return html(pages.job_view(store, name, admin))

    @app.get("/ui/fragments/pools", include_in_schema=False)
    def pools_fragment() -> Response:
        return html(pages.pools_view(store))

    @app.get("/ui/fragments/nodes", include_in_schema=False)
    def nodes_fragment() -> Response:
        return html(pages.nodes_view(store))
