"""The routes of one kind's objects (API.md section 4): list and watch, get, create (POST),
create or update (PUT), delete one or by selector, with Kubernetes' dryRun and DeleteOptions,
and what a viewer's token sees of them (no password in a URL)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import Body, FastAPI, Query, Request
from fastapi.responses import Response, StreamingResponse

from .. import apply as applying
from .. import reads
from ..api.kinds import KindInfo
from ..api.meta import API_VERSION
from ..errors import InvalidInput, NotFound
from ..manifests import documents, invalid
from ..selectors import Requirement
from ..selectors import parse as parse_selector
from ..store import Store
from ..wire import LIST_KINDS, PREFIX, DeleteOptions, object_list
from . import params
from .apiwarnings import status_ignored, warned
from .redact import viewer, without_secrets
from .watch import Broadcaster, watch_lines

ObjectBody = Annotated[
    dict[str, Any], Body(description="The object, as a manifest (apiVersion, kind, metadata, spec).")
]
DeleteBody = Annotated[DeleteOptions | None, Body(description="Kubernetes' DeleteOptions: dryRun, preconditions.")]


def routes(app: FastAPI, store: Store, broadcaster: Broadcaster) -> None:
    @app.get(PREFIX + "/{plural}", tags=["resources"])
    def list_or_watch(
        request: Request,
        plural: str,
        label_selector: str = Query("", alias="labelSelector"),
        watch: bool = False,
        resource_version: str | None = Query(None, alias="resourceVersion"),
        timeout_seconds: float | None = Query(None, alias="timeoutSeconds", gt=0),
        allow_watch_bookmarks: bool = Query(False, alias="allowWatchBookmarks"),
    ) -> Response:
        """The objects of a kind (`JobList`, with the resourceVersion to watch from); with
        watch=true, JSON lines `{"type": ADDED|MODIFIED|DELETED, "object"}` of the changes
        after resourceVersion (none: every object as ADDED first, then the changes)."""
        info, selector = kind_of_path(plural), selector_of(label_selector)
        secrets = not viewer(request)
        if not watch:
            seq, listing = reads.listing_at(store, info.plural, [], selector)
            document = object_list(info.kind, seq, listing.objects)
            if not secrets:
                document["items"] = [without_secrets(i) for i in document["items"]]
            return json_answer(document)
        since = watched_version(resource_version)
        lines = watch_lines(broadcaster, store, info, selector, since, timeout_seconds, allow_watch_bookmarks, secrets)
        return StreamingResponse(lines, media_type="application/json")

    @app.post(PREFIX + "/{plural}", tags=["resources"], status_code=201)
    def create(plural: str, body: ObjectBody, dry_run: str | None = Query(None, alias="dryRun")) -> Response:
        """Create an object; 409 when it exists."""
        info = kind_of_path(plural)
        change, warnings = _one(store, info, None, body, create_only=True, dry_run=params.dry_run(dry_run), force=False)
        return warned(json_answer(change.after, 201), warnings)

    @app.delete(PREFIX + "/{plural}", tags=["resources"])
    def delete_collection(
        plural: str,
        label_selector: str = Query("", alias="labelSelector"),
        dry_run: str | None = Query(None, alias="dryRun"),
        options: DeleteBody = None,
    ) -> Response:
        """Every object of the kind matching labelSelector (required: no accidental delete-all)."""
        info = kind_of_path(plural)
        if not label_selector:
            raise InvalidInput(f"delete {info.plural}: a labelSelector is required")
        rehearse, preconditions = params.delete_options(options, dry_run)
        if preconditions is not None:
            raise params.BadRequest("preconditions name one object: DELETE it by name")
        selector = selector_of(label_selector)
        done = applying.delete(store, [], kind=info.kind, selector=selector, dry_run=rehearse).done
        return json_answer(
            {"apiVersion": API_VERSION, "kind": f"{info.kind}List", "items": [o.manifest() for o, _ in done]}
        )

    @app.get(PREFIX + "/{plural}/{name}", tags=["resources"])
    def get(request: Request, plural: str, name: str) -> Response:
        info = kind_of_path(plural)
        document = reads.objects(store, info.plural, [name], None).objects[0].manifest()
        return json_answer(document if not viewer(request) else without_secrets(document))

    @app.put(PREFIX + "/{plural}/{name}", tags=["resources"])
    def replace(
        plural: str,
        name: str,
        body: ObjectBody,
        dry_run: str | None = Query(None, alias="dryRun"),
        force: bool = Query(False, description="Allow changing an active job: its run is stopped."),
    ) -> Response:
        """Create or update an object, as apply does; a stale metadata.resourceVersion is 409."""
        info = kind_of_path(plural)
        change, warnings = _one(
            store, info, name, body, create_only=False, dry_run=params.dry_run(dry_run), force=force
        )
        return warned(json_answer(change.after, 201 if change.action == "created" else 200), warnings)

    @app.delete(PREFIX + "/{plural}/{name}", tags=["resources"])
    def delete(
        plural: str,
        name: str,
        dry_run: str | None = Query(None, alias="dryRun"),
        options: DeleteBody = None,
    ) -> Response:
        """Delete an object: 200 deleted, 202 while an active job is stopped first; with
        dryRun=All what would be, nothing stored; DeleteOptions' preconditions checked."""
        info = kind_of_path(plural)
        rehearse, pre = params.delete_options(options, dry_run)
        uid, version = (pre.uid, pre.resource_version) if pre is not None else (None, None)
        result = applying.delete(store, [(info.kind, name)], dry_run=rehearse, uid=uid, resource_version=version)
        if result.missing:
            raise NotFound(f'{info.plural} "{name}" not found')
        obj, action = result.done[0]
        return json_answer(obj.manifest(), 202 if action == "deleting" else 200)


def json_answer(document: Any, code: int = 200) -> Response:
    """JSON written by the standard encoder: thousands of objects without walking them twice."""
    return Response(json.dumps(document, separators=(",", ":")), status_code=code, media_type="application/json")


def kind_of_path(plural: str) -> KindInfo:
    info = LIST_KINDS.get(plural)
    if info is None:
        known = ", ".join(LIST_KINDS)
        raise NotFound(f"the server could not find the requested resource: no kind {plural!r} (known: {known})")
    return info


def selector_of(text: str | None) -> list[Requirement] | None:
    return parse_selector(text) if text else None


def watched_version(text: str | None) -> int | None:
    """A watch's resourceVersion; none, empty or 0 (Kubernetes' "any version") is None: what
    is there now, then the changes."""
    if text is None or text in ("", "0"):
        return None
    if not text.isdecimal():
        raise InvalidInput(f"resourceVersion {text!r}: use the one a list answered")
    return int(text)


def _one(
    store: Store,
    info: KindInfo,
    name: str | None,
    body: dict[str, Any],
    *,
    create_only: bool,
    dry_run: bool,
    force: bool,
) -> tuple[applying.Change, list[str]]:
    """PUT and POST of one object: an apply of it alone; and its warnings."""
    if body.get("kind", info.kind) != info.kind:
        raise InvalidInput(f"kind: {body.get('kind')!r} does not match the URL's {info.plural}")
    meta = body.get("metadata")
    if name is not None and isinstance(meta, dict) and meta.get("name") is None:
        raise InvalidInput(f"metadata.name: required field is missing (the URL names {name!r})")
    if name is not None and isinstance(meta, dict) and meta.get("name") != name:
        raise InvalidInput(f"metadata.name: {meta.get('name')!r} does not match the name in the URL ({name!r})")
    loaded = documents([body], Path.cwd(), source=None)  # one object: its fields named alone
    if loaded.problems:
        raise invalid(loaded.problems)
    change = applying.apply_manifests(store, loaded, dry_run=dry_run, force=force, create_only=create_only)[0]
    return change, ["status is written only by the system; ignored"] if status_ignored(loaded) else []
