"""Reading and writing resources and events. Every update is a compare-and-swap on
resourceVersion; every change can append its event in the same transaction."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

from sqlalchemy import delete, select, update
from sqlmodel import Session

from ..api.meta import API_VERSION, format_time
from ..errors import Conflict
from .engine import Tx
from .tables import EventRow, ObjectRow


def canonical(document: Any) -> str:
    """One spelling per value, so equal specs compare equal as text."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def _time(epoch: float | None) -> str | None:
    return None if epoch is None else format_time(datetime.fromtimestamp(epoch, timezone.utc))


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

    @classmethod
    def from_row(cls, row: ObjectRow) -> "StoredObject":
        return cls(
            kind=row.kind, name=row.name, uid=row.uid, generation=row.generation,
            resource_version=row.resource_version, labels=json.loads(row.labels),
            annotations=json.loads(row.annotations), spec=json.loads(row.spec),
            status=json.loads(row.status) if row.status else None,
            created_at=row.created_at, deleted_at=row.deleted_at, spec_text=row.spec,
        )

    def manifest(self) -> dict[str, Any]:
        """The object as Kubernetes would print it."""
        metadata: dict[str, Any] = {
            "name": self.name, "uid": self.uid, "generation": self.generation,
            "resourceVersion": str(self.resource_version), "creationTimestamp": _time(self.created_at),
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


def get(session: Session, *, kind: str, name: str) -> StoredObject | None:
    row = session.get(ObjectRow, (kind, name))
    return StoredObject.from_row(row) if row else None


def list_objects(session: Session, *, kind: str, names: Iterable[str] | None = None) -> list[StoredObject]:
    query = select(ObjectRow).where(ObjectRow.kind == kind)
    if names is not None:
        query = query.where(ObjectRow.name.in_(list(names)))
    return [StoredObject.from_row(r) for r in session.scalars(query.order_by(ObjectRow.name))]


def create(
    tx: Tx, *, kind: str, name: str, spec: dict, labels: dict, annotations: dict, status: dict | None = None
) -> StoredObject:
    now = time.time()
    row = ObjectRow(
        kind=kind, name=name, uid=str(uuid.uuid4()), generation=1, resource_version=tx.rv(),
        labels=canonical(labels), annotations=canonical(annotations), spec=canonical(spec),
        status=canonical(status) if status is not None else None, created_at=now,
    )
    tx.session.add(row)
    return StoredObject.from_row(row)


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
    if deleted_at is not None:
        values["deleted_at"] = deleted_at
    result = tx.session.execute(
        update(ObjectRow)
        .where(ObjectRow.kind == current.kind, ObjectRow.name == current.name,
               ObjectRow.resource_version == current.resource_version)
        .values(**values)
    )
    if result.rowcount != 1:
        raise Conflict(
            f'Operation cannot be fulfilled on {current.kind.lower()} "{current.name}": '
            "the object has been modified; please apply your changes to the latest version and try again"
        )
    row = tx.session.get(ObjectRow, (current.kind, current.name), populate_existing=True)
    return StoredObject.from_row(row)


def remove(tx: Tx, current: StoredObject) -> None:
    """Compare-and-swap delete."""
    tx.rv()
    result = tx.session.execute(
        delete(ObjectRow).where(ObjectRow.kind == current.kind, ObjectRow.name == current.name,
                                ObjectRow.resource_version == current.resource_version)
    )
    if result.rowcount != 1:
        raise Conflict(f'{current.kind.lower()} "{current.name}" was modified meanwhile; try again')


def record_event(tx: Tx, obj: StoredObject, reason: str, message: str, *, warning: bool = False) -> None:
    tx.session.add(EventRow(
        resource_version=tx.rv(), time=time.time(), kind=obj.kind, name=obj.name, uid=obj.uid,
        type="Warning" if warning else "Normal", reason=reason, message=message,
    ))


def events(session: Session, *, kind: str | None = None, name: str | None = None, limit: int = 500) -> list[EventRow]:
    query = select(EventRow)
    if kind is not None:
        query = query.where(EventRow.kind == kind)
    if name is not None:
        query = query.where(EventRow.name == name)
    rows = list(session.scalars(query.order_by(EventRow.id.desc()).limit(limit)))
    return rows[::-1]
