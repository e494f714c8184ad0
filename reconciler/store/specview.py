"""Stored specs as the checks of an apply read them (api/validation.py's `Stored`): each
object's spec read by name when first asked for and then kept, and the jobs of a pool, so
that an apply, `run` or a Source's batch reads what it touches, not the whole store."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

from ..api.pool import GLOBAL_POOL
from .dbapi import Connection, Statement
from .repository import StoredObject, list_objects

_SPEC = Statement("SELECT spec FROM objects WHERE kind = :kind AND name = :name")
# A job's canonical spec spells its pool `"pool":"NAME"` (names are DNS labels: no LIKE wildcards)
_IN_POOL = " AND spec LIKE :pattern"
# a completed job waits for no slot (a job's phase is NULL until its first status write)
_UNFINISHED = " AND (phase IS NULL OR phase != 'Completed')"


def _jobs(where: str) -> Statement:
    return Statement(f"SELECT name, spec FROM objects WHERE kind = 'Job'{where} ORDER BY name")


_JOBS_IN_POOL, _JOB_SPECS = _jobs(_IN_POOL), _jobs("")
_UNFINISHED_IN_POOL, _UNFINISHED_SPECS = _jobs(_IN_POOL + _UNFINISHED), _jobs(_UNFINISHED)


def jobs_in_pool(session: Connection, pool: str, *, unfinished: bool = False) -> Iterator[tuple[str, dict[str, Any]]]:
    """(name, spec) of the jobs that name `pool` (every job, for the global pool); only those
    not Completed when `unfinished`."""
    if pool == GLOBAL_POOL:
        rows = (_UNFINISHED_SPECS if unfinished else _JOB_SPECS).execute(session).all()
    else:
        query = _UNFINISHED_IN_POOL if unfinished else _JOBS_IN_POOL
        rows = query.execute(session, {"pattern": f'%"pool":"{pool}"%'}).all()
    for row in rows:
        spec = json.loads(row.spec)
        if pool == GLOBAL_POOL or spec.get("pool") == pool:  # the text matched; the spec decides
            yield row.name, spec


class SpecView:
    """Stored specs by name, each read when first asked for and then kept: what the checks
    of an apply read (api.validation.Stored), so that an apply reads what it touches, not
    the whole store."""

    def __init__(self, session: Connection, known: Iterable[StoredObject] = (), pruned: Iterable[StoredObject] = ()):
        self._session = session
        self._specs: dict[tuple[str, str], dict[str, Any] | None] = {(o.kind, o.name): o.spec for o in known}
        # stored, but deleted by the same apply (--prune): the checks see the store it leaves
        self._pruned = {(o.kind, o.name) for o in pruned}
        self._specs.update((key, None) for key in self._pruned)

    def pruned(self, kind: str, name: str) -> bool:
        return (kind, name) in self._pruned

    def _spec(self, kind: str, name: str) -> dict[str, Any] | None:
        key = (kind, name)
        if key not in self._specs:
            row = _SPEC.execute(self._session, {"kind": kind, "name": name}).first()
            self._specs[key] = json.loads(row.spec) if row else None
        return self._specs[key]

    def job(self, name: str) -> dict[str, Any] | None:
        return self._spec("Job", name)

    def remember(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        """An object this transaction stores later: what is checked after it sees it."""
        self._specs[(kind, name)] = spec

    def pool(self, name: str) -> dict[str, Any] | None:
        return self._spec("Pool", name)

    def sources_in_pool(self, pool: str) -> Iterator[tuple[str, int]]:
        """The stored Sources whose template names `pool` (every one, for global), with the
        slots it gives (those this apply prunes left out)."""
        for obj in list_objects(self._session, kind="Source"):
            template = obj.spec.get("template") or {}
            if ("Source", obj.name) not in self._pruned and (pool == GLOBAL_POOL or template.get("pool") == pool):
                yield obj.name, int(template.get("slots", 1))

    def jobs_in_pool(self, pool: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """Its jobs not Completed, those this apply prunes left out (a pool may shrink below a
        pruned job, or a finished one)."""
        jobs = jobs_in_pool(self._session, pool, unfinished=True)
        return ((name, spec) for name, spec in jobs if ("Job", name) not in self._pruned)
