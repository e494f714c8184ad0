"""The HTTP API's shapes, defined once for both ends: the server (server/) writes them from
what the verbs return, the remote client (client/remote.py) reads them back into the same
types, so a verb prints the same whether it ran on a store or through a server."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, GetJsonSchemaHandler
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue

from .api.kinds import KINDS
from .api.meta import API_VERSION, from_epoch, to_epoch
from .errors import Conflict, InvalidInput, NotFound, ReconcilerError, Unavailable
from .jsontext import canonical
from .store import StoredObject

if TYPE_CHECKING:  # the verbs' modules are imported where a shape needs them: a CLI's start-up stays short
    from .apply import Change, Deleted
    from .commands import OneOff
    from .graph import Graph

PREFIX = "/apis/reconciler.dev/v1alpha1"  # the Kubernetes-style resources and verbs
LIST_KINDS = {info.plural: info for info in KINDS.values()}  # the {kind} of a path

# -- Status: every error, as Kubernetes writes it ------------------------------------------

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status(code: int, message: str, *, causes: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A Kubernetes `Status` object; `causes` name a field each (`details.causes`)."""
    document: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": REASONS.get(code, "Unknown") if code >= 400 else "",
        "code": code,
    }
    if causes:
        document["details"] = {"causes": causes}
    return document


def code_of(exc: ReconcilerError) -> int:
    """The HTTP code of an error the verbs raise: invalid 422, not found 404, conflict 409, and
    400 for the rest (the operation cannot be done, as Kubernetes answers for the logs of a
    container that never started)."""
    if isinstance(exc, InvalidInput):
        return 422
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, Conflict):
        return 409
    if isinstance(exc, Unavailable):
        return 503
    return 400


_PATH = r"(?:\.[A-Za-z0-9_]+|\[\d+\])"  # .field or [index]
_FIELD = re.compile(rf"^(items\[\d+\]{_PATH}*|[A-Za-z0-9_]+{_PATH}+): (.*)$", re.S)  # `field.path: message`


def error_status(exc: ReconcilerError) -> dict[str, Any]:
    """The Status of a verb's error; each problem of an invalid input is a cause naming its
    field (`items[3].spec.pool`) where it names one."""
    problems = getattr(exc, "problems", None) or [str(exc)]
    causes = []
    for problem in problems:
        match = _FIELD.match(problem)
        cause = {"reason": "FieldValueInvalid", "message": problem}
        if match:
            cause.update(field=match.group(1), message=match.group(2))
        causes.append(cause)
    code = code_of(exc)
    return status(code, str(exc), causes=causes if code == 422 else None)


def problems_of(document: dict[str, Any]) -> list[str]:
    """A Status's causes as the lines the CLI prints (`field: message`), or its message."""
    causes = (document.get("details") or {}).get("causes") or []
    lines = [f"{c['field']}: {c.get('message', '')}" if c.get("field") else str(c.get("message", "")) for c in causes]
    return lines or [str(document.get("message") or "")]


class Unauthorized(InvalidInput):
    """401: no token, or one the server does not know: the invocation must change (exit 2)."""


class Forbidden(ReconcilerError):
    """403: the token's role may not do this; the request was understood and refused (exit 1)."""


NO_ROUTE = "the server could not find the requested resource"  # Kubernetes' words for a 404 of no route


def error_of(code: int, document: dict[str, Any] | None, server: str) -> ReconcilerError:
    """The error a Status answer stands for, with the exit code the same error has locally
    (see README, "Exit codes over the API")."""
    document = document if isinstance(document, dict) and document.get("kind") == "Status" else {}
    message = str(document.get("message") or f"HTTP {code}")
    if code == 401:
        return Unauthorized(f"unauthorized by the server at {server}: {message} (give --token or RECONCILER_TOKEN)")
    if code == 403:
        return Forbidden(f"forbidden by the server at {server}: {message}")
    if code == 404:
        if message == NO_ROUTE:  # not an object missing: a URL that names no route of the API
            return ReconcilerError(
                f"the server at {server} has no such route ({message}): is the server's URL its root, "
                "as http://HOST:PORT, with no path?"
            )
        return NotFound(message)
    if code == 409:
        return Conflict(message)
    if code == 413:
        return InvalidInput(f"the server at {server} refused the request: {message}")
    if code == 422:
        return InvalidInput(message, problems_of(document))
    if code == 400:
        return ReconcilerError(message)
    return ReconcilerError(f"the server at {server} answered {code}: {message}")


# -- objects ---------------------------------------------------------------------------------


def object_list(kind: str, resource_version: int, objects: list[StoredObject]) -> dict[str, Any]:
    """A list as Kubernetes writes it: `JobList`, with the resourceVersion to watch from."""
    return {
        "apiVersion": API_VERSION,
        "kind": f"{kind}List",
        "metadata": {"resourceVersion": str(resource_version)},
        "items": [o.manifest() for o in objects],
    }


def object_from(document: dict[str, Any]) -> StoredObject:
    """An object as the API wrote it (StoredObject.manifest), back into a StoredObject."""
    meta = document["metadata"]
    spec = document.get("spec") or {}
    deleted = meta.get("deletionTimestamp")
    return StoredObject(
        kind=document["kind"],
        name=meta["name"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        resource_version=int(meta.get("resourceVersion") or 0),
        labels=meta.get("labels") or {},
        annotations=meta.get("annotations") or {},
        spec=spec,
        status=document.get("status"),
        created_at=to_epoch(meta["creationTimestamp"]) if meta.get("creationTimestamp") else 0.0,
        deleted_at=to_epoch(deleted) if deleted else None,
        spec_text=canonical(spec),
    )


# -- what the verbs answer ----------------------------------------------------------------------


def change_doc(change: Change) -> dict[str, Any]:
    return {
        "kind": change.kind.kind,
        "name": change.name,
        "action": change.action,
        "before": change.before,
        "after": change.after,
    }


def change_from(document: dict[str, Any]) -> Change:
    from .apply import Change

    before, after = document.get("before"), document.get("after")
    return Change(
        KINDS[document["kind"]],
        document["name"],
        document["action"],
        old=object_from(before) if before else None,
        new=object_from(after) if after else None,
    )


def deleted_doc(deleted: Deleted) -> dict[str, Any]:
    return {
        "items": [{"action": action, "object": obj.manifest()} for obj, action in deleted.done],
        "missing": [{"kind": kind, "name": name} for kind, name in deleted.missing],
    }


def deleted_from(document: dict[str, Any]) -> Deleted:
    from .apply import Deleted

    return Deleted(
        [(object_from(item["object"]), item["action"]) for item in document.get("items", [])],
        [(m["kind"], m["name"]) for m in document.get("missing", [])],
    )


class Event(NamedTuple):
    """An event as `get events` and `describe` read it (the store's rows have these fields)."""

    type: str
    reason: str
    message: str
    kind: str
    name: str
    uid: str
    time: float
    resource_version: int
    id: int = 0  # the store's row id: what makes the event's name unique


def event_doc(row: Any) -> dict[str, Any]:
    """An event as `get events -o json` prints it and the API answers it: Kubernetes' core
    Event shape, named as Kubernetes names events, `OBJECT.HEX` (the hex of its row id: one
    commit writes several events of one object under one resourceVersion)."""
    time = from_epoch(row.time)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{row.name}.{row.id:x}",
            "resourceVersion": str(row.resource_version),
            "creationTimestamp": time,
        },
        "type": row.type,
        "reason": row.reason,
        "message": row.message,
        "involvedObject": {"kind": row.kind, "name": row.name, "uid": row.uid},
        "lastTimestamp": time,
        "resourceVersion": str(row.resource_version),
    }


def event_from(document: dict[str, Any]) -> Event:
    involved = document["involvedObject"]
    named = document.get("metadata", {}).get("name", "")
    return Event(
        document["type"],
        document["reason"],
        document["message"],
        involved["kind"],
        involved["name"],
        involved.get("uid", ""),
        to_epoch(document["lastTimestamp"]),
        int(document["resourceVersion"]),
        int(named.rpartition(".")[2] or "0", 16),
    )


def graph_doc(graph: Graph) -> dict[str, Any]:
    return {
        "nodes": [dataclasses.asdict(n) for n in graph.nodes],
        "edges": [{**dataclasses.asdict(e), "outcomes": list(e.outcomes)} for e in graph.edges],
    }


def graph_from(document: dict[str, Any]) -> Graph:
    from .graph import Graph, GraphEdge, GraphNode

    return Graph(
        [GraphNode(n["name"], n["state"]) for n in document["nodes"]],
        [GraphEdge(e["dependency"], e["dependent"], tuple(e["outcomes"])) for e in document["edges"]],
    )


# -- request bodies ---------------------------------------------------------------------------


# An integer an agent reports, kept in a stored status: bounded to 64 bits (as Kubernetes'
# integers are), so that what the store reads back fast (jsontext.parse) is what was written
# (a validator, not ge/le: those of the type would replace a field's own, such as ge=1)
def _within_64_bits(value: int) -> int:
    if not -(2**63) <= value < 2**63:
        raise ValueError("must fit in 64 bits (a signed integer)")
    return value


class _Int64Schema:
    """The bound in the OpenAPI document too, since a validator shows nothing there: OpenAPI's
    `format: int64` is a signed 64-bit integer. (Not as `maximum`: FastAPI's document holds
    bounds as floats, and 2^63 - 1 as a float is 2^63.)"""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = handler(core_schema)
        schema["format"] = "int64"
        return schema


Int64 = Annotated[int, AfterValidator(_within_64_bits), _Int64Schema()]
# an optional one with a bound of its own has it in its type, before the validator: given on
# the field (`Int64 | None = Field(ge=0)`), pydantic's schema would show it as `ge`, a name
# JSON Schema does not know
NonNegativeInt64 = Annotated[int, Field(ge=0), AfterValidator(_within_64_bits), _Int64Schema()]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class ApplyRequest(Body):
    """POST apply: the same all-or-nothing apply as `reconciler apply`."""

    items: list[dict[str, Any]] = Field(description="The objects, as manifests (apiVersion, kind, metadata, spec).")
    dry_run: bool = Field(default=False, description="Validate and answer what would happen; store nothing.")
    prune: bool = Field(default=False, description="Delete applied objects (matching labelSelector) not in items.")
    label_selector: str = Field(default="", description="With prune: only prune objects matching it.")
    force: bool = Field(default=False, description="Allow changing an active job: its run is stopped.")


class ItemsRequest(Body):
    """POST graph: the jobs of these manifests, as they would be applied."""

    items: list[dict[str, Any]]


class Target(Body):
    kind: str = Field(description="Job, Pool, Node, Notifier or Source.")
    name: str


class DeleteRequest(Body):
    """POST delete: several objects in one transaction (jobs before the pools they use), or
    every object of `kind` (without one: jobs, notifiers, sources and pools) matching
    `labelSelector`; not both."""

    items: list[Target] = Field(default_factory=list)
    kind: str | None = None
    label_selector: str = ""


class Preconditions(Body):
    uid: str | None = None
    resource_version: str | None = None


class DeleteOptions(Body):
    """The body a DELETE may carry, as Kubernetes' DeleteOptions; the fields it does not
    honour (propagationPolicy, gracePeriodSeconds, orphanDependents) are refused by name."""

    kind: Literal["DeleteOptions"] | None = None
    api_version: str | None = None
    dry_run: list[str] = Field(default_factory=list, description="[All]: answer what would be deleted.")
    preconditions: Preconditions | None = Field(default=None, description="uid, resourceVersion the object must have.")


class RunRequest(Body):
    """POST run: a one-off job, as `reconciler run` makes it (unnamed: job-1, job-2, ...)."""

    command: list[str] = Field(min_length=1)
    name: str | None = None
    shell: bool = False
    after_success: list[str] = Field(default_factory=list)
    after_finish: list[str] = Field(default_factory=list)
    pool: str | None = None
    slots: int = 1
    retries: int = 0
    retry_delay: str | None = None
    retryable_exit_codes: list[int] = Field(default_factory=list)
    timeout: str | None = None
    run_timeout: str | None = None
    wait_file: str | None = Field(default=None, description="An absolute path.")
    working_dir: str | None = Field(default=None, description="Absolute; default: the server's working directory.")
    env: dict[str, str] = Field(default_factory=dict)
    job_type: str = "run"
    port: int | None = None
    node_name: str | None = None
    artifact_url: str | None = None

    @classmethod
    def of(cls, one_off: OneOff) -> RunRequest:
        return cls(**dataclasses.asdict(one_off))

    def one_off(self) -> OneOff:
        from .commands import OneOff

        fields = self.model_dump(exclude_none=True)
        return OneOff(**fields)
