"""The HTTP API of API.md section 4 as a FastAPI app: each route calls the function the CLI
calls for the same verb and answers what it returns, in the shapes of wire.py."""

from __future__ import annotations

import dataclasses
import functools
import json
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import Body, Depends, FastAPI, Query, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from .. import apply as applying
from .. import commands, reads, runlogs
from .. import drain as draining
from .. import graph as graphs
from ..api.kinds import KINDS, KindInfo
from ..api.meta import API_VERSION
from ..errors import InvalidInput, NotFound
from ..manifests import Loaded, documents, invalid
from ..selectors import Requirement
from ..selectors import parse as parse_selector
from ..store import Store
from ..wire import (
    LIST_KINDS,
    PREFIX,
    ApplyRequest,
    DeleteOptions,
    DeleteRequest,
    ItemsRequest,
    RunRequest,
    change_doc,
    deleted_doc,
    event_doc,
    graph_doc,
    object_list,
    status,
    without_secrets,
)
from . import agents, dashboard, params, seed
from .agents import Wake
from .apiwarnings import status_ignored, warned
from .auth import Tokens
from .errors import answer_errors
from .guard import MAX_BODY, Guard
from .watch import Broadcaster, event_lines, watch_lines

ACTIONS = ("cancel", "suspend", "resume", "rerun")
ObjectBody = Annotated[
    dict[str, Any], Body(description="The object, as a manifest (apiVersion, kind, metadata, spec).")
]
DeleteBody = Annotated[DeleteOptions | None, Body(description="Kubernetes' DeleteOptions: dryRun, preconditions.")]
STREAMS = anyio.CapacityLimiter(256)  # log follows, beside the thread pool the other routes use
EVENTS_LIMIT = 1000  # `get events`: the newest, as the CLI shows them


def create_app(
    store: Store,
    *,
    tokens: Tokens | None = None,
    max_body: int = MAX_BODY,
    leader: Callable[[], dict[str, Any]] | None = None,
    wake: Wake | None = None,
) -> Guard:
    """The API over `store`, behind the token and body-size guard. `leader`: who holds the
    controller lease, as `GET /leader` shows it (serve's leader election). `wake(job)`: tell
    the controller in this process at once of an agent's report on the job."""
    broadcaster = Broadcaster(store)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(broadcaster.start)
        try:
            yield
        finally:
            broadcaster.stop()

    app = FastAPI(
        title="reconciler",
        version=API_VERSION,
        description="Kubernetes-style API of `reconciler serve` (API.md section 4).",
        docs_url=None,
        redoc_url=None,
        lifespan=lifespan,
        dependencies=[Depends(params.refuse_unknown_parameters)],
    )
    # told when the server is asked to stop, before it waits for open requests: long polls
    # and watch streams end at once instead of holding the shutdown until it gives up
    app.state.on_exit = [broadcaster.stop]
    answer_errors(app)
    agents.routes(app, store, wake)
    _routes(app, store, broadcaster, tokens)
    if leader is not None:

        @app.get("/leader", tags=["server"])
        def leading() -> Response:
            """Which server runs the reconcile loop: `{leader, server, holder, term, expiresIn,
            termAge, leaseSeconds}`, `leader` true on the server that holds the controller lease (no
            token needed)."""
            return _json(leader())

    seed.routes(app, store)
    dashboard.routes(app, store)
    return Guard(app, tokens=tokens, max_body=max_body)


def _json(document: Any, code: int = 200) -> Response:
    """JSON written by the standard encoder: thousands of objects without walking them twice."""
    return Response(json.dumps(document, separators=(",", ":")), status_code=code, media_type="application/json")


def _kind(plural: str) -> KindInfo:
    info = LIST_KINDS.get(plural)
    if info is None:
        known = ", ".join(LIST_KINDS)
        raise NotFound(f"the server could not find the requested resource: no kind {plural!r} (known: {known})")
    return info


def _selector(text: str | None) -> list[Requirement] | None:
    return parse_selector(text) if text else None


def _items(items: list[dict[str, Any]]) -> Loaded:
    """A request's objects, validated as manifests are; a relative workingDir resolves
    against the server's working directory."""
    return documents(items, Path.cwd())


def _routes(app: FastAPI, store: Store, broadcaster: Broadcaster, tokens: Tokens | None) -> None:
    @app.get("/healthz", response_class=PlainTextResponse, tags=["server"])
    def healthz() -> str:
        """`ok` while the store answers (no token needed)."""
        store.change_seq()
        return "ok"

    @app.get("/metrics", tags=["server"])
    def metrics() -> Response:
        """Prometheus metrics in the text format (as `controller --metrics-port` serves them)."""
        from ..metrics import exposition

        body, content_type = exposition(store)
        return Response(body, media_type=content_type)

    @app.get("/services", tags=["server"])
    def services(label_selector: str = Query("", alias="labelSelector")) -> Response:
        """The service registry: `[{name, node, address, port, run, ready}]`."""
        return _json(reads.services(store, _selector(label_selector)))

    @app.get(PREFIX, tags=["resources"])
    def discovery() -> Response:
        """The kinds served here (a Kubernetes APIResourceList)."""
        resources = [
            {
                "name": info.plural,
                "singularName": info.kind.lower(),
                "namespaced": False,
                "kind": info.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "update", "watch"],
                "shortNames": [a for a in info.aliases if a not in (info.plural, info.kind.lower())],
            }
            for info in LIST_KINDS.values()
        ]
        return _json({"kind": "APIResourceList", "groupVersion": API_VERSION, "resources": resources})

    @app.post(f"{PREFIX}/apply", tags=["verbs"])
    def apply(request: ApplyRequest) -> Response:
        """All-or-nothing apply, as `reconciler apply`: each object's action (created,
        configured, unchanged, pruned); a refusal (422) names each object and field."""
        loaded = _checked(_items(request.items))
        changes = applying.apply_manifests(
            store,
            loaded,
            dry_run=request.dry_run,
            force=request.force,
            prune=request.prune,
            selector=_selector(request.label_selector),
        )
        said = {"kind": "ApplyResult", "dryRun": request.dry_run, "items": [change_doc(c) for c in changes]}
        if warnings := status_ignored(loaded):
            said["warnings"] = warnings
        return warned(_json(said), warnings)

    @app.post(f"{PREFIX}/delete", tags=["verbs"])
    def delete_many(request: DeleteRequest) -> Response:
        """Several objects in one transaction (jobs before their pools), or every object of
        `kind` (without one: jobs, notifiers, sources and pools) matching `labelSelector`; an
        active job is stopped first ("deleting")."""
        targets = [(_kind_of(t.kind).kind, t.name) for t in request.items]
        kind = _kind_of(request.kind).kind if request.kind else None
        if bool(targets) == bool(request.label_selector):
            raise InvalidInput("delete: give items, or labelSelector (and a kind, or none), not both")
        return _json(
            deleted_doc(applying.delete(store, targets, kind=kind, selector=_selector(request.label_selector)))
        )

    @app.post(f"{PREFIX}/rerun", tags=["verbs"])
    def rerun_selected(
        label_selector: str = Query("", alias="labelSelector"),
        failed: bool = Query(False, description="Every completed job whose outcome is not Succeeded."),
        downstream: bool = False,
    ) -> Response:
        """`rerun --failed [-l SEL]` or `rerun -l SEL`, in one transaction: the jobs asked for."""
        selector = _selector(label_selector)
        if failed:
            names = commands.rerun_failed(store, selector)
        elif selector:
            names = commands.rerun_selected(store, selector, downstream=downstream)
        else:
            raise InvalidInput("rerun: give labelSelector, failed=true, or both")
        return _json({"names": names})

    @app.post(f"{PREFIX}/run", tags=["verbs"], status_code=201)
    def run(request: RunRequest) -> Response:
        """A one-off job, as `reconciler run`; unnamed jobs get job-1, job-2, ..."""
        name = commands.run_job(store, request.one_off())  # no workingDir: the server's working directory
        return _json(reads.objects(store, "jobs", [name], None).objects[0].manifest(), 201)

    @app.get(f"{PREFIX}/graph", tags=["verbs"])
    def graph(label_selector: str = Query("", alias="labelSelector")) -> Response:
        """The job graph: nodes (name, state as `get` shows it) and edges dependency -> dependent."""
        return _json(graph_doc(graphs.stored_graph(store, _selector(label_selector))))

    @app.post(f"{PREFIX}/graph", tags=["verbs"])
    def manifest_graph(request: ItemsRequest) -> Response:
        """The graph of these objects' jobs as they would be applied (NotApplied: not stored)."""
        return _json(graph_doc(graphs.manifest_graph(store, _checked(_items(request.items)).manifests)))

    @app.get(f"{PREFIX}/events", tags=["resources"])
    def events(
        field_selector: str = Query(
            "", alias="fieldSelector", description="involvedObject.kind=K,involvedObject.name=N"
        ),
        limit: int = Query(EVENTS_LIMIT, ge=1, le=10_000),
        watch: bool = False,
        resource_version: str | None = Query(None, alias="resourceVersion"),
        timeout_seconds: float | None = Query(None, alias="timeoutSeconds", gt=0),
    ) -> Response:
        """The newest events, oldest first; of one object with fieldSelector. With watch=true,
        JSON lines `{"type": "ADDED", "object": Event}`: the newest events first (those after
        resourceVersion, if given), then each event as it is recorded."""
        fields = _fields(field_selector)

        def newest(count: int) -> list[Any]:
            if fields:
                return reads.object_events(store, fields["involvedObject.kind"], fields["involvedObject.name"], count)
            return reads.events(store, [], count)

        if watch:
            since = _version(resource_version)
            stream = event_lines(store, newest, limit, since, timeout_seconds)
            return StreamingResponse(stream, media_type="application/json")
        rows = newest(limit)
        seq = store.change_seq()
        items = [event_doc(r) for r in rows]
        return _json(
            {"apiVersion": "v1", "kind": "EventList", "metadata": {"resourceVersion": str(seq)}, "items": items}
        )

    @app.post(PREFIX + "/jobs/{name}/{action}", tags=["verbs"])
    def act(
        name: str,
        action: str,
        downstream: bool = Query(False, description="rerun: jobs depending on it run again after it."),
        requested_by: str | None = Query(None, alias="requestedBy", description="cancel: who asks, for its message."),
    ) -> Response:
        """cancel, suspend, resume or rerun one job; the answer's message says what happened."""
        if action == "cancel":
            said = commands.cancel(store, name, by=requested_by)
        elif action in ("suspend", "resume"):
            said = commands.set_suspend(store, name, action == "suspend")
        elif action == "rerun":
            said = commands.rerun(store, name, downstream=downstream)
        else:
            raise NotFound(f"no action {action!r} on jobs: use {', '.join(ACTIONS)}")
        document = status(200, said)
        document["details"] = {"name": name, "group": "reconciler.dev", "kind": "jobs"}
        return _json(document)

    @app.post(PREFIX + "/nodes/{name}/cordon", tags=["verbs"])
    def cordon(name: str) -> Response:
        """Mark the node unschedulable (`reconciler cordon`); the message says what happened."""
        return _json(status(200, commands.set_unschedulable(store, name, True)))

    @app.post(PREFIX + "/nodes/{name}/uncordon", tags=["verbs"])
    def uncordon(name: str) -> Response:
        """Mark the node schedulable again (`reconciler uncordon`)."""
        return _json(status(200, commands.set_unschedulable(store, name, False)))

    @app.post(PREFIX + "/nodes/{name}/drain", tags=["verbs"])
    def drain(name: str, force: bool = Query(False, description="Declare its runs lost.")) -> Response:
        """Cordon the node and, with force, declare every run there lost (`reconciler drain`):
        one transaction; `GET nodes/{name}/held` is what a drain waits for."""
        done = commands.drain(store, name, force=force)
        return _json({"cordoned": done.cordoned, "declaredLost": [list(lost) for lost in done.declared_lost]})

    @app.get(PREFIX + "/nodes/{name}/held", tags=["verbs"])
    def held(name: str) -> Response:
        """The runs holding slots on the node, as `drain` waits for them to leave."""
        items = [dataclasses.asdict(h) for h in draining.runs_on(store, [name])]
        return _json({"items": items})

    @app.get(PREFIX + "/jobs/{name}/log", tags=["resources"], response_class=PlainTextResponse)
    def job_log(
        name: str,
        run: int | None = Query(None, description="Run number (default: the latest)."),
        stream_name: str | None = Query(None, alias="stream", description="stdout | stderr (default: both)"),
        follow: bool = Query(False, description="Stream what the run writes until it ends."),
        tail_lines: int | None = Query(None, alias="tailLines", ge=0),
    ) -> Response:
        """A run's captured output, as `reconciler logs` prints it (a remote run's from its
        node's agent)."""
        found = runlogs.run_logs(store, name, run)
        stop = threading.Event()
        remote = agents.remote_log(store, tokens, found, stream=stream_name, tail=tail_lines, follow=follow, stop=stop)
        if remote is not None:
            return StreamingResponse(_in_threads(remote, stop), media_type="text/plain")
        if not follow:
            return StreamingResponse(_in_threads(found.read(stream_name, tail=tail_lines)), media_type="text/plain")
        pieces = found.follow(stream_name, tail=tail_lines, stop=stop)
        return StreamingResponse(_in_threads(pieces, stop), media_type="text/plain")

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
        info, selector = _kind(plural), _selector(label_selector)
        secrets = not _viewer(request)
        if not watch:
            seq, listing = reads.listing_at(store, info.plural, [], selector)
            return _json(object_list(info.kind, seq, listing.objects, secrets=secrets))
        since = _version(resource_version)
        lines = watch_lines(broadcaster, store, info, selector, since, timeout_seconds, allow_watch_bookmarks, secrets)
        return StreamingResponse(lines, media_type="application/json")

    @app.post(PREFIX + "/{plural}", tags=["resources"], status_code=201)
    def create(plural: str, body: ObjectBody, dry_run: str | None = Query(None, alias="dryRun")) -> Response:
        """Create an object; 409 when it exists."""
        info = _kind(plural)
        change, warnings = _one(store, info, None, body, create_only=True, dry_run=params.dry_run(dry_run), force=False)
        return warned(_json(change.after, 201), warnings)

    @app.delete(PREFIX + "/{plural}", tags=["resources"])
    def delete_collection(
        plural: str,
        label_selector: str = Query("", alias="labelSelector"),
        dry_run: str | None = Query(None, alias="dryRun"),
        options: DeleteBody = None,
    ) -> Response:
        """Every object of the kind matching labelSelector (required: no accidental delete-all)."""
        info = _kind(plural)
        if not label_selector:
            raise InvalidInput(f"delete {info.plural}: a labelSelector is required")
        rehearse, preconditions = params.delete_options(options, dry_run)
        if preconditions is not None:
            raise params.BadRequest("preconditions name one object: DELETE it by name")
        selector = _selector(label_selector)
        done = applying.delete(store, [], kind=info.kind, selector=selector, dry_run=rehearse).done
        return _json({"apiVersion": API_VERSION, "kind": f"{info.kind}List", "items": [o.manifest() for o, _ in done]})

    @app.get(PREFIX + "/{plural}/{name}", tags=["resources"])
    def get(request: Request, plural: str, name: str) -> Response:
        info = _kind(plural)
        document = reads.objects(store, info.plural, [name], None).objects[0].manifest()
        return _json(document if not _viewer(request) else without_secrets(document))

    @app.put(PREFIX + "/{plural}/{name}", tags=["resources"])
    def replace(
        plural: str,
        name: str,
        body: ObjectBody,
        dry_run: str | None = Query(None, alias="dryRun"),
        force: bool = Query(False, description="Allow changing an active job: its run is stopped."),
    ) -> Response:
        """Create or update an object, as apply does; a stale metadata.resourceVersion is 409."""
        info = _kind(plural)
        change, warnings = _one(
            store, info, name, body, create_only=False, dry_run=params.dry_run(dry_run), force=force
        )
        return warned(_json(change.after, 201 if change.action == "created" else 200), warnings)

    @app.delete(PREFIX + "/{plural}/{name}", tags=["resources"])
    def delete(
        plural: str,
        name: str,
        dry_run: str | None = Query(None, alias="dryRun"),
        options: DeleteBody = None,
    ) -> Response:
        """Delete an object: 200 deleted, 202 while an active job is stopped first; with
        dryRun=All what would be, nothing stored; DeleteOptions' preconditions checked."""
        info = _kind(plural)
        rehearse, pre = params.delete_options(options, dry_run)
        uid, version = (pre.uid, pre.resource_version) if pre is not None else (None, None)
        result = applying.delete(store, [(info.kind, name)], dry_run=rehearse, uid=uid, resource_version=version)
        if result.missing:
            raise NotFound(f'{info.plural} "{name}" not found')
        obj, action = result.done[0]
        return _json(obj.manifest(), 202 if action == "deleting" else 200)


def _viewer(request: Request) -> bool:
    """A viewer's token: it sees no password (`wire.without_secrets`); without tokens (loopback
    only) every caller is the owner."""
    return bool(request.scope.get("reconciler.role") == "viewer")


def _kind_of(kind: str) -> KindInfo:
    """A kind as a request body names it (Job, or jobs)."""
    info = KINDS.get(kind) or LIST_KINDS.get(kind)
    if info is None:
        raise InvalidInput(f"unknown kind {kind!r}: use {', '.join(KINDS)}")
    return info


def _checked(loaded: Loaded) -> Loaded:
    if not loaded.manifests and not loaded.problems:
        raise InvalidInput("no objects passed to apply (items is empty)")
    return loaded


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
    if name is not None and isinstance(meta, dict) and meta.get("name") != name:
        raise InvalidInput(f"metadata.name: {meta.get('name')!r} does not match the name in the URL ({name!r})")
    loaded = documents([body], Path.cwd(), source=None)  # one object: its fields named alone
    if loaded.problems:
        raise invalid(loaded.problems)
    change = applying.apply_manifests(store, loaded, dry_run=dry_run, force=force, create_only=create_only)[0]
    return change, ["status is written only by the system; ignored"] if status_ignored(loaded) else []


def _fields(text: str) -> dict[str, str]:
    """A fieldSelector of events: involvedObject.kind and involvedObject.name, both."""
    if not text:
        return {}
    fields = dict(part.partition("=")[::2] for part in text.split(","))
    wanted = {"involvedObject.kind", "involvedObject.name"}
    if set(fields) != wanted:
        raise InvalidInput(f"fieldSelector {text!r}: give involvedObject.kind=KIND,involvedObject.name=NAME")
    return fields


def _version(text: str | None) -> int | None:
    """A watch's resourceVersion; none, empty or 0 (Kubernetes' "any version") is None: what
    is there now, then the changes."""
    if text is None or text in ("", "0"):
        return None
    if not text.isdecimal():
        raise InvalidInput(f"resourceVersion {text!r}: use the one a list answered")
    return int(text)


async def _in_threads(pieces: Iterator[str], stop: threading.Event | None = None) -> AsyncIterator[str]:
    """A blocking iterator (reading log files) served without blocking the event loop; when
    the client goes away, `stop` ends it at its next look."""
    step = functools.partial(next, pieces, None)
    try:
        while (piece := await anyio.to_thread.run_sync(step, limiter=STREAMS)) is not None:
            yield piece
    finally:
        if stop is not None:
            stop.set()
