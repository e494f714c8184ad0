"""Reading and writing resources and events. Every update is a compare-and-swap on
resourceVersion; every change can append its event in the same transaction."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select, update

from ..api.meta import API_VERSION, format_time
from ..errors import Conflict
from .engine import Tx
from .prepared import Prepared
from .tables import EventRow, ObjectRow


def canonical(document: Any) -> str:
    """One spelling per value, so equal specs compare equal as text."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def _time(epoch: float | None) -> str | None:
    return None if epoch is None else format_time(datetime.fromtimestamp(epoch, UTC))


@dataclass
class StoredObject:
    kind: str
    name: str
    uid: str
    generation: int
    resource_version: int
    labels: dict[str, str]
    annotations: dict[str, str]
    spec: dict[str, Any]
    status: dict[str, Any] | None
    created_at: float
    deleted_at: float | None
    spec_text: str
    status_text: str | None = None  # the stored JSON: a private copy is one json.loads away

    def manifest(self) -> dict[str, Any]:
        """The object as Kubernetes would print it."""
        metadata: dict[str, Any] = {
            "name": self.name,
            "uid": self.uid,
            "generation": self.generation,
            "resourceVersion": str(self.resource_version),
            "creationTimestamp": _time(self.created_at),
        }
        if self.deleted_at is not None:
            metadata["deletionTimestamp"] = _time(self.deleted_at)
        if self.labels:
            metadata["labels"] = self.labels
        if self.annotations:
            metadata["annotations"] = self.annotations
        document = {"apiVersion": API_VERSION, "kind": self.kind, "metadata": metadata, "spec": self.spec}
        if self.status is not None:
            document["status"] = self.status
        return document


OBJECTS = ObjectRow.__table__
EVENTS = EventRow.__table__


def _from_mapping(row) -> StoredObject:
    """A StoredObject from a row of the objects table (any object with its column names)."""
    return StoredObject(
        kind=row.kind,
        name=row.name,
        uid=row.uid,
        generation=row.generation,
        resource_version=row.resource_version,
        labels=json.loads(row.labels),
        annotations=json.loads(row.annotations),
        spec=json.loads(row.spec),
        status=json.loads(row.status) if row.status else None,
        created_at=row.created_at,
        deleted_at=row.deleted_at,
        spec_text=row.spec,
        status_text=row.status,
    )


# built once: statement construction costs more than SQLite's execution on the hot path
_GET = Prepared(select(OBJECTS).where(OBJECTS.c.kind == bindparam("kind"), OBJECTS.c.name == bindparam("name")))


def get(session: Connection, *, kind: str, name: str) -> StoredObject | None:
    row = _GET.execute(session, {"kind": kind, "name": name}).first()
    return _from_mapping(row) if row else None


_VERSION = Prepared(
    select(OBJECTS.c.resource_version).where(OBJECTS.c.kind == bindparam("kind"), OBJECTS.c.name == bindparam("name"))
)


def version(session: Connection, *, kind: str, name: str) -> int | None:
    """The object's resourceVersion now: lets a transaction check that what it decided on
    is still current before it writes anything."""
    return _VERSION.execute(session, {"kind": kind, "name": name}).scalar()


_STATUS = Prepared(
    select(OBJECTS.c.name, OBJECTS.c.uid, OBJECTS.c.status, OBJECTS.c.spec).where(
        OBJECTS.c.kind == bindparam("kind"), OBJECTS.c.name == bindparam("name")
    )
)


@dataclass(frozen=True)
class Observed:
    """What followers of an object's progress read: no labels or annotations decoded."""

    uid: str
    status: dict[str, Any]
    spec_text: str


def statuses(session: Connection, *, kind: str, names: Iterable[str]) -> dict[str, Observed]:
    """name -> uid, status and spec text of the named objects that exist: what a dependency
    check or a follower reads, one point query per name (cheaper than a list query for a
    few names, and only the status is decoded)."""
    found = {}
    for name in names:
        row = _STATUS.execute(session, {"kind": kind, "name": name}).first()
        if row is not None:
            found[name] = Observed(row.uid, json.loads(row.status) if row.status else {}, row.spec)
    return found


_LIST = select(OBJECTS).where(OBJECTS.c.kind == bindparam("kind")).order_by(OBJECTS.c.name)
_LIST_NAMED = (
    select(OBJECTS)
    .where(OBJECTS.c.kind == bindparam("kind"), OBJECTS.c.name.in_(bindparam("names", expanding=True)))
    .order_by(OBJECTS.c.name)
)


def list_objects(session: Connection, *, kind: str, names: Iterable[str] | None = None) -> list[StoredObject]:
    if names is None:
        rows = session.execute(_LIST, {"kind": kind})
    else:
        rows = session.execute(_LIST_NAMED, {"kind": kind, "names": list(names)})
    return [_from_mapping(r) for r in rows]


def create(
    tx: Tx, *, kind: str, name: str, spec: dict, labels: dict, annotations: dict, status: dict | None = None
) -> StoredObject:
    return create_many(
        tx, [dict(kind=kind, name=name, spec=spec, labels=labels, annotations=annotations, status=status)]
    )[0]


_INSERT_OBJECT = insert(OBJECTS)  # built once; the rows go in as parameters


def create_many(tx: Tx, objects: Iterable[dict[str, Any]]) -> list[StoredObject]:
    """`create` for many objects in one statement (executemany): what a large apply uses.
    Each item holds `create`'s keyword arguments (kind, name, spec, labels, annotations and
    optionally status)."""
    rows: list[dict[str, Any]] = []
    created: list[StoredObject] = []
    for o in objects:
        status = o.get("status")
        now = time.time()
        row = dict(
            kind=o["kind"],
            name=o["name"],
            uid=str(uuid.uuid4()),
            generation=1,
            resource_version=tx.rv(),
            labels=canonical(o["labels"]),
            annotations=canonical(o["annotations"]),
            spec=canonical(o["spec"]),
            status=canonical(status) if status is not None else None,
            created_at=now,
            phase=(status or {}).get("phase"),
            observed_generation=(status or {}).get("observedGeneration"),
            deleted_at=None,
        )
        rows.append(row)
        created.append(
            StoredObject(
                kind=row["kind"],
                name=row["name"],
                uid=row["uid"],
                generation=1,
                resource_version=row["resource_version"],
                labels=dict(o["labels"]),
                annotations=dict(o["annotations"]),
                spec=dict(o["spec"]),
                status=status,
                created_at=now,
                deleted_at=None,
                spec_text=row["spec"],
            )
        )
    if rows:
        tx.session.execute(_INSERT_OBJECT, rows)
    return created


_UPDATE_STATUS = Prepared(
    update(OBJECTS)
    .where(
        OBJECTS.c.kind == bindparam("k"),
        OBJECTS.c.name == bindparam("n"),
        OBJECTS.c.resource_version == bindparam("old"),
    )
    .values(
        resource_version=bindparam("resource_version"),
        status=bindparam("status"),
        phase=bindparam("phase"),
        observed_generation=bindparam("observed_generation"),
    )
)


def update_object(
    tx: Tx,
    current: StoredObject,
    *,
    spec: dict | None = None,
    labels: dict | None = None,
    annotations: dict | None = None,
    status: dict | None = None,
    deleted_at: float | None = None,
) -> StoredObject:
    """Compare-and-swap: succeeds only if the row still has `current.resource_version`.
    A spec change bumps `generation`; anything else does not."""
    values: dict[str, Any] = {"resource_version": tx.rv()}
    generation = current.generation
    if spec is not None and (text := canonical(spec)) != current.spec_text:
        generation += 1
        values.update(spec=text, generation=generation)
    if labels is not None:
        values["labels"] = canonical(labels)
    if annotations is not None:
        values["annotations"] = canonical(annotations)
    if status is not None:
        values["status"] = canonical(status)
        values["phase"] = status.get("phase")
        values["observed_generation"] = status.get("observedGeneration")
    if deleted_at is not None:
        values["deleted_at"] = deleted_at
    if values.keys() == {
        "resource_version",
        "status",
        "phase",
        "observed_generation",
    }:  # the controller's status writes
        result = _UPDATE_STATUS.execute(
            tx.session, {**values, "k": current.kind, "n": current.name, "old": current.resource_version}
        )
    else:
        result = tx.session.execute(
            update(OBJECTS)
            .where(
                OBJECTS.c.kind == current.kind,
                OBJECTS.c.name == current.name,
                OBJECTS.c.resource_version == current.resource_version,
            )
            .values(**values)
        )
    if result.rowcount != 1:
        raise Conflict(
            f'Operation cannot be fulfilled on {current.kind.lower()} "{current.name}": '
            "the object has been modified; please apply your changes to the latest version and try again"
        )
    # the new state is known: build it rather than read it back
    return StoredObject(
        kind=current.kind,
        name=current.name,
        uid=current.uid,
        generation=generation,
        resource_version=values["resource_version"],
        labels=dict(labels) if labels is not None else current.labels,
        annotations=dict(annotations) if annotations is not None else current.annotations,
        spec=dict(spec) if "spec" in values else current.spec,
        status=status if status is not None else current.status,
        created_at=current.created_at,
        deleted_at=deleted_at if deleted_at is not None else current.deleted_at,
        spec_text=values.get("spec", current.spec_text),
        status_text=values["status"] if status is not None else current.status_text,
    )


def remove(tx: Tx, current: StoredObject) -> None:
    """Compare-and-swap delete."""
    tx.rv()
    result = tx.session.execute(
        delete(OBJECTS).where(
            OBJECTS.c.kind == current.kind,
            OBJECTS.c.name == current.name,
            OBJECTS.c.resource_version == current.resource_version,
        )
    )
    if result.rowcount != 1:
        raise Conflict(f'{current.kind.lower()} "{current.name}" was modified meanwhile; try again')


def record_event(tx: Tx, obj: StoredObject, reason: str, message: str, *, warning: bool = False) -> None:
    record_typed_events(tx, [(obj, reason, message, warning)])


def record_events(tx: Tx, entries: Iterable[tuple[StoredObject, str, str]], *, warning: bool = False) -> None:
    """`record_event` for many (object, reason, message) at once, in one statement, in order."""
    record_typed_events(tx, ((obj, reason, message, warning) for obj, reason, message in entries))


def record_typed_events(tx: Tx, entries: Iterable[tuple[StoredObject, str, str, bool]]) -> None:
    """Events given as (object, reason, message, warning), in one statement, in order."""
    rows = [
        dict(
            resource_version=tx.rv(),
            time=time.time(),
            kind=obj.kind,
            name=obj.name,
            uid=obj.uid,
            type="Warning" if warning else "Normal",
            reason=reason,
            message=message,
        )
        for obj, reason, message, warning in entries
    ]
    if len(rows) == 1:
        _INSERT_EVENT.execute(tx.session, rows[0])
    elif rows:
        _INSERT_EVENT.execute_many(tx.session, rows)


_INSERT_EVENT = Prepared(
    insert(EVENTS).values(
        {c: bindparam(c) for c in ("resource_version", "time", "kind", "name", "uid", "type", "reason", "message")}
    )
)


def events(session: Connection, *, kind: str | None = None, name: str | None = None, limit: int = 500) -> list:
    """Newest `limit` events, oldest first; rows with .time, .type, .reason, .kind, .name, .message."""
    query = select(EVENTS)
    if kind is not None:
        query = query.where(EVENTS.c.kind == kind)
    if name is not None:
        query = query.where(EVENTS.c.name == name)
    rows = list(session.execute(query.order_by(EVENTS.c.id.desc()).limit(limit)))
    return rows[::-1]
