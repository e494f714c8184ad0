"""apply / diff / prune: bring the store's desired state in line with a set of manifests.

Everything happens in one write transaction: read what is stored, validate the whole set
against it, then write. Any problem raises before commit, so the store is left as it was."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from .api.annotations import APPLIED_FROM, HOSTNAME_LABEL, MANAGED_BY, system_annotations, user_annotations
from .api.job import JobSpec
from .api.kinds import KINDS, KindInfo
from .api.meta import dump, format_time, utcnow
from .api.pool import GLOBAL_POOL
from .api.revisions import execution_hash
from .api.status import ACTIVE_PHASES, LIVE_PHASES, first_events, new_job_status
from .api.validation import validate_apply
from .errors import Conflict, InvalidInput
from .jsontext import canonical
from .manifests import Loaded, Manifest, invalid, paused_gc
from .selectors import Requirement, matches
from .store import Store, StoredObject, eventlog, ingested, outbox, queuing, specview
from .store import repository as repo
from .store.dbapi import Connection
from .store.transactions import Tx


@dataclass
class Change:
    kind: KindInfo
    name: str
    action: str  # created | configured | unchanged | pruned
    old: StoredObject | None = field(default=None, repr=False)  # as stored before, if it was
    new: StoredObject | None = field(default=None, repr=False)  # as stored after, if it is

    # The documents are built when asked for: most applies print one line per object.
    @property
    def before(self) -> dict[str, Any] | None:
        return self.old.manifest() if self.old is not None else None

    @property
    def after(self) -> dict[str, Any] | None:
        return self.new.manifest() if self.new is not None else None


def apply_manifests(
    store: Store,
    manifests: list[Manifest] | Loaded,
    *,
    dry_run: bool = False,
    force: bool = False,
    prune: bool = False,
    selector: list[Requirement] | None = None,
    create_only: bool = False,
    owner: str | None = None,
) -> list[Change]:
    """Apply a set of manifests in one transaction. Given what `manifests.read` loaded,
    the problems of the documents that did not validate are reported together with this
    apply's own (references, cycles, capacities): every problem at once, nothing stored.
    `create_only` (the HTTP API's create): an object that exists already is a Conflict.
    `owner` (a GitOps watch's folder): the objects applied are marked as its, and its prune
    deletes only objects so marked, never what other applies made."""
    loaded = manifests if isinstance(manifests, Loaded) else Loaded(list(manifests))
    with paused_gc():
        try:  # most applies in a GitOps loop change nothing: find that out without the write lock
            with store.read() as conn:
                return _apply(
                    _ReadOnly(conn, store),
                    loaded,
                    force=force,
                    prune=prune,
                    selector=selector,
                    create_only=create_only,
                    owner=owner,
                )
        except _WouldWrite:
            pass
        with store.write() as tx:  # validated and compared again under the lock: the store may have moved
            changes = _apply(
                tx, loaded, force=force, prune=prune, selector=selector, create_only=create_only, owner=owner
            )
            if dry_run:
                tx.discard()
    return changes


class _WouldWrite(Exception):
    pass


class _ReadOnly(Tx):
    """A transaction that may only read: the first write (which always allocates a
    resourceVersion) aborts the attempt."""

    def rv(self) -> int:
        raise _WouldWrite


def _apply(
    tx: Tx,
    loaded: Loaded,
    *,
    force: bool,
    prune: bool,
    selector: list[Requirement] | None,
    create_only: bool = False,
    owner: str | None = None,
) -> list[Change]:
    manifests = loaded.manifests
    if selector:  # as kubectl's: only the objects the selector matches are applied (and pruned)
        manifests = [m for m in manifests if matches(selector, m.obj.metadata.labels)]
        if not manifests and not prune and not loaded.problems:
            raise InvalidInput("no objects passed to apply match the label selector (-l)")
    session = tx.session
    # what the applied objects touch, not the whole store: an apply into a store of 100,000
    # jobs costs what it costs into an empty one (only --prune must see every object)
    doomed: list[StoredObject] = []  # what --prune deletes
    if prune:
        stored = {(i.kind, o.name): o for i in KINDS.values() for o in repo.list_objects(session, kind=i.kind)}
        applied = {(m.kind.kind, m.name) for m in manifests}
        doomed = [
            obj
            for key, obj in sorted(stored.items())
            # not one a node's agent made (its registered node, even once a manifest
            # configured it), or `run`
            if key not in applied
            and obj.annotations.get(MANAGED_BY) == "apply"
            and (owner is None or obj.annotations.get(APPLIED_FROM) == owner)
            and not (obj.kind == "Node" and HOSTNAME_LABEL in obj.labels)
            and (not selector or matches(selector, obj.labels))
        ]
    else:
        stored = {(o.kind, o.name): o for o in _named_objects(session, manifests)}
    # checked against the store this apply leaves: a kept job may not name a pruned one
    view = specview.SpecView(session, stored.values(), pruned=doomed)
    problems = loaded.problems + validate_apply(manifests, view, loaded.refused)
    if problems:
        raise invalid(problems)

    changes: list[Change] = []
    creations: list[tuple[Change, dict[str, Any]]] = []  # written together below: one INSERT for all
    events: list[tuple[StoredObject | Change, str, str]] = []  # in manifest order; a Change stands for its new object
    for m in manifests:
        current = stored.get((m.kind.kind, m.name))
        if create_only and current is not None:
            raise Conflict(f'{m.kind.plural} "{m.name}" already exists')
        change, creation, said = _apply_one(tx, m, current, force=force, owner=owner)
        changes.append(change)
        if creation is not None:
            tx.rv()  # the creations are written after the loop: a read-only attempt ends here, not there
            creations.append((change, creation))
        events += said
    for (change, _), obj in zip(creations, repo.create_many(tx, [c for _, c in creations]), strict=True):
        change.new = obj
    if events:
        eventlog.record(tx, *(eventlog.ObjectEvent(_written(o), reason, message) for o, reason, message in events))
    going = frozenset((o.kind, o.name) for o in doomed)
    for obj in doomed:
        delete_object(tx, obj, going)
        changes.append(Change(KINDS[obj.kind], obj.name, "pruned", old=obj))
    return changes


def _named_objects(session: Connection, manifests: list[Manifest]) -> list[StoredObject]:
    """The stored objects the manifests name (a few statements per kind, whatever the number)."""
    by_kind: dict[str, list[str]] = {}
    for m in manifests:
        by_kind.setdefault(m.kind.kind, []).append(m.name)
    return [o for kind, names in by_kind.items() for o in repo.list_objects(session, kind=kind, names=names)]


def _written(obj: StoredObject | Change) -> StoredObject:
    """The stored object an event is about (a Change stands for the object it created)."""
    if isinstance(obj, Change):
        assert obj.new is not None  # created by create_many before the events are written
        return obj.new
    return obj


def _apply_one(
    tx: Tx, m: Manifest, current: StoredObject | None, *, force: bool, owner: str | None = None
) -> tuple[Change, dict[str, Any] | None, list[tuple[StoredObject | Change, str, str]]]:
    """What one manifest does: its change, the `create` arguments of a new object (the caller
    creates them all at once) and the events to record."""
    spec_model = getattr(m.obj, "spec", None)
    spec = dump(spec_model) if spec_model is not None else {}  # only the spec: metadata is read from the model
    meta = m.obj.metadata
    annotations = {**user_annotations(meta.annotations), MANAGED_BY: "apply"}
    if owner is not None:
        annotations[APPLIED_FROM] = owner
    if current is None:
        # a precondition on an object that is not there fails, as Kubernetes' does: the
        # manifest was read from an object since deleted, which it must not make again
        given = [f for f, v in (("uid", meta.uid), ("resourceVersion", meta.resource_version)) if v is not None]
        if given:
            fields = " and ".join(f"metadata.{f}" for f in given)
            raise Conflict(
                f"{m.where('metadata', given[0])}: there is no {m.kind.kind.lower()} {m.name!r} (deleted since "
                f"the manifest was read): {fields} {'name' if len(given) > 1 else 'names'} an object that is "
                f"gone; drop {'them' if len(given) > 1 else 'it'} to create it"
            )
        status = None
        change = Change(m.kind, m.name, "created")  # `new` is filled in once the object is created
        said: list[tuple[StoredObject | Change, str, str]] = [
            (change, "Created", f"{m.kind.kind.lower()} created by apply")
        ]
        if isinstance(spec_model, JobSpec):
            deps = [d.job for d in spec_model.depends_on]
            status = dict(new_job_status(format_time(utcnow()), deps, suspended=spec_model.suspend))
            # stored as the controller's first look would leave it: said as it would say it
            said += [(change, reason, message) for reason, message in first_events(status)]
        creation = dict(
            kind=m.kind.kind, name=m.name, spec=spec, labels=meta.labels, annotations=annotations, status=status
        )
        return change, creation, said

    if meta.uid is not None and meta.uid != current.uid:  # Kubernetes' UID precondition
        raise Conflict(
            f"{m.where('metadata', 'uid')}: {meta.uid} is not the uid of the stored {m.kind.kind.lower()} "
            f"{m.name!r} ({current.uid}): the manifest describes an object that was deleted and made again"
        )
    if meta.resource_version is not None and meta.resource_version != str(current.resource_version):
        raise Conflict(
            f"{m.where('metadata', 'resourceVersion')}: {meta.resource_version} is stale "
            f"(the stored object is at {current.resource_version})"
        )
    annotations.update(system_annotations(current.annotations))
    annotations[MANAGED_BY] = "apply"
    if owner is not None:  # the watch claims what its folder describes
        annotations[APPLIED_FROM] = owner
    # the system's labels stay as its annotations do (a registered node's hostname), unless
    # the manifest gives them
    labels = {**system_annotations(current.labels), **meta.labels}
    spec_changed = canonical(spec) != current.spec_text
    if not spec_changed and labels == current.labels and annotations == current.annotations:
        return Change(m.kind, m.name, "unchanged", old=current, new=current), None, []
    phase = (current.status or {}).get("phase")
    if (
        spec_changed
        and m.kind.kind == "Job"
        and phase in ACTIVE_PHASES
        and not force
        and execution_hash(spec) != execution_hash(current.spec)
    ):
        raise Conflict(
            f"{m.where('spec')}: job {m.name!r} is {phase}; its spec cannot change while a revision "
            "is under way (wait for it, cancel it, or apply --force to stop it and start the new revision)"
        )
    obj = repo.update_object(tx, current, spec=spec, labels=labels, annotations=annotations)
    event = (
        obj,
        "Configured",
        f"spec changed (generation {obj.generation})" if spec_changed else "labels or annotations changed",
    )
    return Change(m.kind, m.name, "configured", old=current, new=obj), None, [event]


def delete_object(tx: Tx, obj: StoredObject, going: frozenset[tuple[str, str]] = frozenset()) -> str:
    """Delete now, or, for a job whose process may be alive, mark it for deletion so the
    controller stops the process tree first (like a Kubernetes finalizer). Returns what happened.
    `going`: (kind, name) of the objects deleted with it (a running job is only marked): a
    pool may go with the jobs and Sources that name it."""
    if obj.kind == "Pool" and obj.name != GLOBAL_POOL:  # no job names global: it can go whenever
        users = [n for n, _ in specview.jobs_in_pool(tx.session, obj.name) if ("Job", n) not in going]
        if users:
            more = f" and {len(users) - 5} more" if len(users) > 5 else ""
            raise Conflict(
                f'pool "{obj.name}" is used by job(s) {", ".join(users[:5])}{more}; delete or move them first'
            )
        sources = [
            s.name
            for s in repo.list_objects(tx.session, kind="Source")
            if s.spec.get("template", {}).get("pool") == obj.name and ("Source", s.name) not in going
        ]
        if sources:  # every job they make would be refused for naming a missing pool
            raise Conflict(
                f'pool "{obj.name}" is named by the template of source(s) {", ".join(sources)}; '
                "change or delete them first"
            )
    phase = (obj.status or {}).get("phase")
    if obj.kind == "Job" and phase in LIVE_PHASES:
        if obj.deleted_at is None:
            updated = repo.update_object(tx, obj, deleted_at=time.time())
            eventlog.record(
                tx, eventlog.ObjectEvent(updated, "Deleting", "deletion requested; stopping the running process tree")
            )
        return "deleting"
    repo.remove(tx, obj)  # first: it allocates the resourceVersion, which ends a read-only attempt before any write
    if obj.kind == "Job":
        queuing.dequeue(tx, obj.uid)  # a deleted job must not hold its place in line
    elif obj.kind == "Notifier":
        outbox.drop(tx, obj.name)  # its pending events go with it
    elif obj.kind == "Source":
        ingested.drop(tx, obj.name)  # the message ids it remembered (its jobs stay)
    eventlog.record(tx, eventlog.ObjectEvent(obj, "Deleted", f"{obj.kind.lower()} deleted"))
    return "deleted"


_DELETE_ORDER = {"Job": 0, "Notifier": 1, "Source": 1, "Pool": 2, "Node": 3}  # jobs before the pools they use
# `delete -l SEL` without a kind: what manifests describe, as kubectl's `delete all -l`; a
# node is a machine its agent registers, deleted only when named (`delete nodes -l SEL`)
LABELLED = ("Job", "Notifier", "Source", "Pool")


@dataclass
class Deleted:
    done: list[tuple[StoredObject, str]]  # (object, "deleted" | "deleting")
    missing: list[tuple[str, str]]  # (kind, name) not found


def delete(
    store: Store,
    targets: list[tuple[str, str]],
    *,
    kind: str | None = None,
    selector: list[Requirement] | None = None,
    dry_run: bool = False,
    uid: str | None = None,
    resource_version: str | None = None,
) -> Deleted:
    """Delete the (kind, name) targets, or every object of `kind` (of LABELLED's kinds when
    None) matching `selector`, in one transaction: jobs before the pools they use, so one
    `delete -f` of a whole folder works. `dry_run`: every check made, what would be deleted
    answered, nothing stored. `uid`, `resource_version`: preconditions (Kubernetes'
    DeleteOptions) each object must meet, else Conflict."""
    missing: list[tuple[str, str]] = []
    with store.write() as tx:
        if selector and not targets:
            kinds = [kind] if kind is not None else LABELLED
            objs = [o for k in kinds for o in repo.list_objects(tx.session, kind=k) if matches(selector, o.labels)]
        else:
            objs = []
            for k, n in targets:
                obj = repo.get(tx.session, kind=k, name=n)
                if obj is None:
                    missing.append((k, n))
                else:
                    objs.append(obj)
        for o in objs:
            if uid is not None and o.uid != uid:
                raise Conflict(f"precondition failed: uid {uid} is not that of {o.kind} {o.name!r} ({o.uid})")
            if resource_version is not None and str(o.resource_version) != resource_version:
                raise Conflict(
                    f"precondition failed: resourceVersion {resource_version} is not that of {o.kind} "
                    f"{o.name!r} ({o.resource_version})"
                )
        going = frozenset((o.kind, o.name) for o in objs)
        done = [(o, delete_object(tx, o, going)) for o in sorted(objs, key=lambda o: _DELETE_ORDER[o.kind])]
        if dry_run:
            tx.discard()
    return Deleted(done, missing)
