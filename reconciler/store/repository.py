"""Reading and writing resources. Every update is a compare-and-swap on resourceVersion;
every change can append its event in the same transaction (eventlog.py)."""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..api.meta import API_VERSION, format_time
from ..api.status import shown_job_status
from ..errors import Conflict
from ..jsontext import canonical, parse
from .dbapi import Connection, Row, Statement, StoreError
from .transactions import Tx


def new_uid() -> str:
    """A version 7 UUID's text (RFC 9562): the time in milliseconds, then 74 random bits.
    Uids in creation order keep the unique index on them growing at its end; random ones
    (version 4) touched a page of it anywhere per object stored, each a page written at
    commit. Spelled without a UUID object (a third of its cost): an object is created per
    message a Source stores."""
    h = f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"
    return f"{h[:8]}-{h[8:12]}-7{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


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
    created_rv: int = 0  # the resourceVersion that created it (0: before schema 9 recorded it)

    if not TYPE_CHECKING:  # for mypy, the fields above are all there is

        def __getattr__(self, name: str) -> Any:
            """An object read from a row decodes its JSON columns on first use: a reconcile
            step reads its job's status from the text into a private copy and its spec through
            a cache keyed by the text, so decoding them on every read was most of its cost."""
            text = _LAZY.get(name)
            if text is None or text not in self.__dict__:
                raise AttributeError(name)
            raw = self.__dict__[text]
            # a status is the system's document (jsontext.parse); a spec, labels and
            # annotations are the user's
            value = (parse(raw) if name == "status" else json.loads(raw)) if raw else None
            self.__dict__[name] = value
            return value

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
            document["status"] = shown_job_status(self.status) if self.kind == "Job" else self.status
        return document


# attribute -> the text it is decoded from, where an object was read from a row
_LAZY = {"labels": "_labels_text", "annotations": "_annotations_text", "spec": "spec_text", "status": "status_text"}


def _from_mapping(row: Row) -> StoredObject:
    """A StoredObject from a row of the objects table (any object with its column names);
    its labels, annotations, spec and status are decoded when first used."""
    obj = StoredObject.__new__(StoredObject)
    obj.__dict__.update(
        kind=row.kind,
        name=row.name,
        uid=row.uid,
        generation=row.generation,
        resource_version=row.resource_version,
        created_at=row.created_at,
        deleted_at=row.deleted_at,
        created_rv=row.created_rv or 0,
        spec_text=row.spec,
        status_text=row.status,
        _labels_text=row.labels,
        _annotations_text=row.annotations,
    )
    return obj


# what _from_mapping reads; phase and observed_generation are copies of status, for SQL
_OBJECT = (
    "kind, name, uid, generation, resource_version, labels, annotations, spec, status, created_at, deleted_at,"
    " created_rv"
)
_GET = Statement(f"SELECT {_OBJECT} FROM objects WHERE kind = :kind AND name = :name")


def get(session: Connection, *, kind: str, name: str) -> StoredObject | None:
    row = _GET.execute(session, {"kind": kind, "name": name}).first()
    return _from_mapping(row) if row else None


def get_with_statuses(
    session: Connection, *, kind: str, name: str, names: list[str]
) -> tuple[StoredObject | None, dict[str, Observed]]:
    """`get` of one object and `statuses` of others, in one snapshot; on a pipelined
    PostgreSQL connection in one round trip, as the object's query is sent before the
    statuses' answer is read."""
    sent = _GET.execute(session, {"kind": kind, "name": name})
    found = statuses(session, kind=kind, names=names)
    row = sent.first()
    return (_from_mapping(row) if row else None), found


_VERSION = Statement("SELECT resource_version FROM objects WHERE kind = :kind AND name = :name")


def version(session: Connection, *, kind: str, name: str) -> int | None:
    """The object's resourceVersion now: lets a transaction check that what it decided on
    is still current before it writes anything."""
    found = _VERSION.execute(session, {"kind": kind, "name": name}).scalar()
    return None if found is None else int(found)


_OBSERVED = "name, uid, generation, annotations, status, spec"
_STATUS = Statement(f"SELECT {_OBSERVED} FROM objects WHERE kind = :kind AND name = :name")


@functools.cache
def _statuses_named(width: int) -> Statement:
    return Statement(f"SELECT {_OBSERVED} FROM objects WHERE kind = :kind AND name IN ({in_marks(width)})")


@dataclass(frozen=True)
class Observed:
    """What followers of an object's progress read: no labels decoded, annotations only when
    asked for. Enough to tell whether a completion still describes the current version of a
    job (api/revisions.py's Versioned)."""

    name: str
    uid: str
    generation: int
    status: dict[str, Any]
    spec_text: str
    annotations_text: str

    @property
    def annotations(self) -> dict[str, str]:
        found: dict[str, str] = json.loads(self.annotations_text)
        return found


def statuses(session: Connection, *, kind: str, names: Iterable[str]) -> dict[str, Observed]:
    """name -> uid, status and spec text of the named objects that exist: what a dependency
    check or a follower reads (only the status is decoded). On SQLite one point query per
    name, cheaper than a list query for a few names; on PostgreSQL, where each statement is
    a round trip, one query for them all."""
    names = list(names)
    if session.is_postgresql and len(names) > 1:
        rows = [
            r
            for width, params in in_chunks(names)
            for r in _statuses_named(width).execute(session, {"kind": kind, **params})
        ]
    else:
        rows = [
            r for name in names if (r := _STATUS.execute(session, {"kind": kind, "name": name}).first()) is not None
        ]
    return {
        row.name: Observed(
            row.name, row.uid, row.generation, parse(row.status) if row.status else {}, row.spec, row.annotations
        )
        for row in rows
    }


_NAMES_STARTING = Statement("SELECT name FROM objects WHERE kind = :kind AND name LIKE :pattern")


def names_starting(session: Connection, *, kind: str, prefix: str) -> list[str]:
    """Names of the objects of a kind that start with `prefix` (a DNS label: no wildcards)."""
    return [row.name for row in _NAMES_STARTING.execute(session, {"kind": kind, "pattern": f"{prefix}%"}).all()]


_LIST = Statement(f"SELECT {_OBJECT} FROM objects WHERE kind = :kind ORDER BY name")
_NAMES_AT_ONCE = 1024  # SQLite takes at most 32,766 parameters a statement


@functools.cache
def _list_named(width: int) -> Statement:
    return Statement(f"SELECT {_OBJECT} FROM objects WHERE kind = :kind AND name IN ({in_marks(width)}) ORDER BY name")


def in_marks(width: int) -> str:
    """`width` placeholders `:n0, :n1, ...` for an IN list (SQLite has no array parameter),
    as `in_chunks` gives their values."""
    return ", ".join(f":n{i}" for i in range(width))


def in_chunks(names: Iterable[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """The names (or uids) in chunks for `name IN (:n0, :n1, ...)`: each chunk's placeholder
    count (1, 2, 4 ...: the last one repeated, so a few statements serve every count) and
    parameters."""
    wanted = sorted(set(names))
    for start in range(0, len(wanted), _NAMES_AT_ONCE):
        chunk = wanted[start : start + _NAMES_AT_ONCE]
        width = 1 << (len(chunk) - 1).bit_length()
        yield width, {f"n{i}": chunk[min(i, len(chunk) - 1)] for i in range(width)}


def list_objects(session: Connection, *, kind: str, names: Iterable[str] | None = None) -> list[StoredObject]:
    """Ordered by name; `names` picks those of them that exist."""
    if names is None:
        return [_from_mapping(r) for r in _LIST.execute(session, {"kind": kind})]
    found: list[StoredObject] = []
    for width, params in in_chunks(names):
        found += (_from_mapping(r) for r in _list_named(width).execute(session, {"kind": kind, **params}))
    return found


def create(
    tx: Tx,
    *,
    kind: str,
    name: str,
    spec: dict[str, Any],
    labels: dict[str, str],
    annotations: dict[str, str],
    status: dict[str, Any] | None = None,
) -> StoredObject:
    return create_many(
        tx, [{"kind": kind, "name": name, "spec": spec, "labels": labels, "annotations": annotations, "status": status}]
    )[0]


_INSERT_OBJECT = Statement(
    "INSERT INTO objects (kind, name, uid, generation, resource_version, labels, annotations, spec, status,"
    " phase, observed_generation, outcome, reason, pool, created_at, deleted_at, created_rv) VALUES (:kind, :name,"
    " :uid, :generation, :resource_version, :labels, :annotations, :spec, :status, :phase, :observed_generation,"
    " :outcome, :reason, :pool, :created_at, :deleted_at, :created_rv)"
)


_STATUS_COLUMNS = ("phase", "observed_generation", "outcome", "reason")


def _status_copies(status: dict[str, Any] | None) -> tuple[Any, ...]:
    """The status fields the objects table copies into columns (_STATUS_COLUMNS), for SQL
    to find and count."""
    status = status or {}
    return (status.get("phase"), status.get("observedGeneration"), status.get("outcome"), status.get("reason"))


def create_many(tx: Tx, objects: Iterable[dict[str, Any]]) -> list[StoredObject]:
    """`create` for many objects in one statement (executemany): what a large apply uses.
    Each item holds `create`'s keyword arguments (kind, name, spec, labels, annotations and
    optionally status). Objects that share one status dict (a Source's batch of new jobs)
    have it spelled once."""
    rows: list[tuple[Any, ...]] = []
    created: list[StoredObject] = []
    # the last status, its text and its columns (the dict is held: its id is not reused)
    spelled: tuple[Any, str | None, tuple[Any, ...]] = (None, None, _status_copies(None))
    for o in objects:
        kind, name, spec, status = o["kind"], o["name"], o["spec"], o.get("status")
        tx.writes(kind)
        if status is not spelled[0]:
            spelled = (status, canonical(status) if status is not None else None, _status_copies(status))
        uid, rv, now, spec_text = new_uid(), tx.rv(), time.time(), canonical(spec)
        pool = spec.get("pool") if kind == "Job" else None
        # in _INSERT_OBJECT's order
        rows.append(
            (kind, name, uid, 1, rv, canonical(o["labels"]), canonical(o["annotations"]), spec_text, spelled[1])
            + spelled[2]
            + (pool, now, None, rv)
        )
        created.append(
            StoredObject(
                kind=kind,
                name=name,
                uid=uid,
                generation=1,
                resource_version=rv,
                labels=dict(o["labels"]),
                annotations=dict(o["annotations"]),
                spec=dict(spec),
                status=status,
                created_at=now,
                deleted_at=None,
                spec_text=spec_text,
                created_rv=rv,
            )
        )
    _INSERT_OBJECT.execute_values(tx.session, rows)
    return created


@functools.cache
def _update(columns: tuple[str, ...]) -> Statement:
    """The compare-and-swap UPDATE of these columns: a few combinations occur (the
    controller's status writes, apply's spec and labels, deletion marks)."""
    assignments = ", ".join(f"{c} = :{c}" for c in columns)
    return Statement(f"UPDATE objects SET {assignments} WHERE kind = :k AND name = :n AND resource_version = :old")


@functools.cache
def _update_certain(columns: tuple[str, ...]) -> Statement:
    """The same swap as a statement that fails when it changes no row (PostgreSQL), for a
    swap that cannot fail unless the write lock did not hold (a bug): on a pipelined
    connection nobody waits for its answer, and its failure aborts the transaction, so the
    commit that follows in the same round trip commits nothing. The CASE depends on the
    count, so PostgreSQL evaluates the cast only when it is reached."""
    update = _update(columns).sqlite
    return Statement(
        f"WITH changed AS ({update} RETURNING 1) SELECT CAST(CASE count(*) WHEN 1 THEN '1' ELSE"
        " 'the update of an object under the write lock changed ' || count(*) || ' rows, not 1' END AS integer)"
        " FROM changed"
    )


def update_object(
    tx: Tx,
    current: StoredObject,
    *,
    spec: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    status: dict[str, Any] | None = None,
    deleted_at: float | None = None,
    certain: bool = False,
) -> StoredObject:
    """Compare-and-swap: succeeds only if the row still has `current.resource_version`.
    A spec change bumps `generation`; anything else does not. `certain`: `current` was read
    or written in this thread's batch epoch (`Store.epoch`), so the swap cannot fail: on a
    pipelined connection it is not waited for, and the server fails the transaction if it
    did; elsewhere it raises StoreError, which rolls a batch back, not Conflict."""
    tx.writes(current.kind)
    values: dict[str, Any] = {"resource_version": tx.rv()}
    generation = current.generation
    if spec is not None and (text := canonical(spec)) != current.spec_text:
        generation += 1
        values.update(spec=text, generation=generation)
        if current.kind == "Job":
            values["pool"] = spec.get("pool")
    if labels is not None:
        values["labels"] = canonical(labels)
    if annotations is not None:
        values["annotations"] = canonical(annotations)
    if status is not None:
        values["status"] = canonical(status)
        values.update(zip(_STATUS_COLUMNS, _status_copies(status), strict=True))
    if deleted_at is not None:
        values["deleted_at"] = deleted_at
    params = {**values, "k": current.kind, "n": current.name, "old": current.resource_version}
    if certain and tx.session.pipelined:
        _update_certain(tuple(values)).execute(tx.session, params)  # not waited for; checked by the server
    elif (changed := _update(tuple(values)).execute(tx.session, params).rowcount) != 1:
        if certain:  # as the server fails a pipelined one: what the transaction wrote before goes too
            raise StoreError(
                f"the update of an object under the write lock changed {changed} rows, not 1: "
                f"{current.kind} {current.name} (a bug): nothing is committed"
            )
        raise Conflict(
            f'Operation cannot be fulfilled on {current.kind.lower()} "{current.name}": '
            "the object has been modified; please apply your changes to the latest version and try again"
        )
    # the new state is known: build it rather than read it back, from `current` as it is
    # (what it has not decoded yet stays undecoded)
    new = StoredObject.__new__(StoredObject)
    new.__dict__.update(current.__dict__, generation=generation, resource_version=values["resource_version"])
    if labels is not None:
        new.__dict__.update(labels=dict(labels), _labels_text=values["labels"])
    if annotations is not None:
        new.__dict__.update(annotations=dict(annotations), _annotations_text=values["annotations"])
    if spec is not None and "spec" in values:
        new.__dict__.update(spec=dict(spec), spec_text=values["spec"])
    if status is not None:
        new.__dict__.update(status=status, status_text=values["status"])
    if deleted_at is not None:
        new.deleted_at = deleted_at
    return new


_REMOVE = Statement("DELETE FROM objects WHERE kind = :kind AND name = :name AND resource_version = :old")


def remove(tx: Tx, current: StoredObject) -> None:
    """Compare-and-swap delete."""
    tx.writes(current.kind)
    tx.rv()
    result = _REMOVE.execute(tx.session, {"kind": current.kind, "name": current.name, "old": current.resource_version})
    if result.rowcount != 1:
        raise Conflict(f'{current.kind.lower()} "{current.name}" was modified meanwhile; try again')
