"""The HTTP API of API.md section 4 as a FastAPI app: each route calls the function the CLI
calls for the same verb and answers what it returns, in the shapes of wire.py."""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any

import anyio
from fastapi import Body, Depends, FastAPI, Query
from fastapi.responses import PlainTextResponse, Response, StreamingResponse

from .. import apply as applying
from .. import commands, reads, runlogs
from .. import drain as draining
from .. import graph as graphs
from ..api.kinds import KINDS, KindInfo
from ..api.meta import API_VERSION
from ..errors import InvalidInput, NotFound
from ..manifests import Loaded, documents
from ..noderuns import Hand
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
    status,
)
from . import agents, dashboard, objects, params, seed
from .agents import Wake
from .apiwarnings import status_ignored, warned
from .auth import Tokens
from .errors import answer_errors
from .guard import MAX_BODY, Guard
from .objects import json_answer, selector_of, watched_version
from .watch import Broadcaster, event_lines

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
    hand: Hand | None = None,
) -> Guard:
    """The API over `store`, behind the token and body-size guard. `leader`: who holds the
    controller lease, as `GET /leader` shows it (serve's leader election). `wake(job)`: tell
    the controller in this process at once of an agent's report on the job. `hand`: give
    the controller in this process an agent's reports to write in its own batch."""
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
    agents.routes(app, store, wake, hand)
    _routes(app, store, broadcaster, tokens)
    if leader is not None:

        @app.get("/leader", tags=["server"])
        def leading() -> Response:
            """Which server runs the reconcile loop: `{leader, server, holder, term, expiresIn,
            termAge, leaseSeconds}`, `leader` true on the server that holds the controller lease (no
            token needed)."""
            return json_answer(leader())

    seed.routes(app, store)
    dashboard.routes(app, store)
    return Guard(app, tokens=tokens, max_body=max_body)


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
        return json_answer(reads.services(store, selector_of(label_selector)))

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
        return json_answer({"kind": "APIResourceList", "groupVersion": API_VERSION, "resources": resources})

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
            selector=selector_of(request.label_selector),
        )
        said = {"kind": "ApplyResult", "dryRun": request.dry_run, "items": [change_doc(c) for c in changes]}
        if warnings := status_ignored(loaded):
            said["warnings"] = warnings
        return warned(json_answer(said), warnings)

    @app.post(f"{PREFIX}/delete", tags=["verbs"])
    def delete_many(request: DeleteRequest) -> Response:
        """Several objects in one transaction (jobs before their pools), or every object of
        `kind` (without one: jobs, notifiers, sources and pools) matching `labelSelector`; an
        active job is stopped first ("deleting")."""
        targets = [(_kind_of(t.kind).kind, t.name) for t in request.items]
        kind = _kind_of(request.kind).kind if request.kind else None
        if bool(targets) == bool(request.label_selector):
            raise InvalidInput("delete: give items, or labelSelector (and a kind, or none), not both")
        return json_answer(
            deleted_doc(applying.delete(store, targets, kind=kind, selector=selector_of(request.label_selector)))
        )

    @app.post(f"{PREFIX}/rerun", tags=["verbs"])
    def rerun_selected(
        label_selector: str = Query("", alias="labelSelector"),
        failed: bool = Query(False, description="Every completed job whose outcome is not Succeeded."),
        downstream: bool = False,
    ) -> Response:
        """`rerun --failed [-l SEL]` or `rerun -l SEL`, in one transaction: the jobs asked for."""
        selector = selector_of(label_selector)
        if failed:
            names = commands.rerun_failed(store, selector)
        elif selector:
            names = commands.rerun_selected(store, selector, downstream=downstream)
        else:
            raise InvalidInput("rerun: give labelSelector, failed=true, or both")
        return json_answer({"names": names})

    @app.post(f"{PREFIX}/run", tags=["verbs"], status_code=201)
    def run(request: RunRequest) -> Response:
        """A one-off job, as `reconciler run`; unnamed jobs get job-1, job-2, ..."""
        name = commands.run_job(store, request.one_off())  # no workingDir: the server's working directory
        return json_answer(reads.objects(store, "jobs", [name], None).objects[0].manifest(), 201)

    @app.get(f"{PREFIX}/graph", tags=["verbs"])
    def graph(label_selector: str = Query("", alias="labelSelector")) -> Response:
        """The job graph: nodes (name, state as `get` shows it) and edges dependency -> dependent."""
        return json_answer(graph_doc(graphs.stored_graph(store, selector_of(label_selector))))

    @app.post(f"{PREFIX}/graph", tags=["verbs"])
    def manifest_graph(request: ItemsRequest) -> Response:
        """The graph of these objects' jobs as they would be applied (NotApplied: not stored)."""
        return json_answer(graph_doc(graphs.manifest_graph(store, _checked(_items(request.items)).manifests)))

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
            since = watched_version(resource_version)
            stream = event_lines(store, newest, limit, since, timeout_seconds)
            return StreamingResponse(stream, media_type="application/json")
        rows = newest(limit)
        seq = store.change_seq()
        items = [event_doc(r) for r in rows]
        return json_answer(
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
        return json_answer(document)

    @app.post(PREFIX + "/nodes/{name}/cordon", tags=["verbs"])
    def cordon(name: str) -> Response:
        """Mark the node unschedulable (`reconciler cordon`); the message says what happened."""
        return json_answer(status(200, commands.set_unschedulable(store, name, True)))

    @app.post(PREFIX + "/nodes/{name}/uncordon", tags=["verbs"])
    def uncordon(name: str) -> Response:
        """Mark the node schedulable again (`reconciler uncordon`)."""
        return json_answer(status(200, commands.set_unschedulable(store, name, False)))

    @app.post(PREFIX + "/nodes/{name}/drain", tags=["verbs"])
    def drain(name: str, force: bool = Query(False, description="Declare its runs lost.")) -> Response:
        """Cordon the node and, with force, declare every run there lost (`reconciler drain`):
        one transaction; `GET nodes/{name}/held` is what a drain waits for."""
        done = commands.drain(store, name, force=force)
        return json_answer({"cordoned": done.cordoned, "declaredLost": [list(lost) for lost in done.declared_lost]})

    @app.get(PREFIX + "/nodes/{name}/held", tags=["verbs"])
    def held(name: str) -> Response:
        """The runs holding slots on the node, as `drain` waits for them to leave."""
        items = [dataclasses.asdict(h) for h in draining.runs_on(store, [name])]
        return json_answer({"items": items})

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

    objects.routes(app, store, broadcaster)  # last: their /{plural} paths would take the ones above


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


def _fields(text: str) -> dict[str, str]:
    """A fieldSelector of events: involvedObject.kind and involvedObject.name, both."""
    if not text:
        return {}
    fields = dict(part.partition("=")[::2] for part in text.split(","))
    wanted = {"involvedObject.kind", "involvedObject.name"}
    if set(fields) != wanted:
        raise InvalidInput(f"fieldSelector {text!r}: give involvedObject.kind=KIND,involvedObject.name=NAME")
    return fields


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
