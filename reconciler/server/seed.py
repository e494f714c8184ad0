"""The seed scheduler's endpoints, for its clients: `POST /jobs` (its job request) and
`GET /jobs?node_id=&status=` (a bare JSON array), over the same jobs as everything else.

A job request becomes a one-off job as `reconciler run` makes it (named job-1, job-2, ...):
`command` is one string run by /bin/sh -c (the seed ran it so), `deploy_url` the job's
artifact, `job_type` its type, `port`, `env_vars` its environment, `instance_id` the node it
is pinned to. A job's seed `status` is pending (not started: Waiting, Queued, Backoff,
Suspended), running (Starting, Running, Stopping), done (Succeeded) or failed (any other
outcome)."""

from __future__ import annotations

import json
import os
import shlex
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import Response

from .. import commands, reads
from ..api.oneoff import JobRequest
from ..api.source import shown_url
from ..api.status import Outcome, Phase
from ..errors import InvalidInput
from ..store import Store, StoredObject
from .redact import viewer

SEED_STATUSES = ("pending", "running", "done", "failed")
_RUNNING = (Phase.STARTING, Phase.RUNNING, Phase.STOPPING)


def seed_status(status: dict[str, Any]) -> str:
    phase = status.get("phase")
    if phase == Phase.COMPLETED:
        return "done" if status.get("outcome") == Outcome.SUCCEEDED else "failed"
    return "running" if phase in _RUNNING else "pending"


def seed_job(obj: StoredObject, *, secrets: bool = True) -> dict[str, Any]:
    """A job in the seed's JSON shape (its optional fields left out when empty, as it did);
    without `secrets` (a viewer's token), a password in its deploy_url as ***."""
    spec, status = obj.spec, obj.status or {}
    revision = status.get("revision", 1)
    runs = [r for r in status.get("runs", []) if r.get("revision") == revision]
    done = status.get("phase") == Phase.COMPLETED
    job: dict[str, Any] = {
        "job_id": obj.name,
        "node_id": status.get("nodeName") or "",
        "command": spec.get("shell") or shlex.join(spec.get("command") or []),
        "job_type": spec.get("type", "run"),
        "status": seed_status(status),
        "retry_count": max(0, len(runs) - 1),
        "exit_code": runs[-1].get("exitCode") if done and runs else None,
        "created_at": obj.manifest()["metadata"]["creationTimestamp"],
    }
    optional = {
        "instance_id": (spec.get("placement") or {}).get("nodeName"),
        "deploy_url": (spec.get("artifact") or {}).get("url"),
        "port": spec.get("port"),
        "env_vars": spec.get("env") or None,
        "running_at": runs[0].get("startedAt") if runs else None,
        "finished_at": status.get("completionTime") if done else None,
    }
    job.update({k: v for k, v in optional.items() if v is not None})
    if not secrets and "deploy_url" in job:
        job["deploy_url"] = shown_url(job["deploy_url"])
    return job


def routes(app: FastAPI, store: Store) -> None:
    @app.post("/jobs", status_code=201, tags=["seed"])
    def submit(request: JobRequest) -> Response:
        """Create a job from the seed's job request; 201 with the job in the seed's shape."""
        if (problem := request.problem()) is not None:
            raise InvalidInput(problem)
        one_off = request.one_off(os.getcwd())
        name = commands.run_job(store, one_off)
        job = reads.objects(store, "jobs", [name], None).objects[0]
        return Response(json.dumps(seed_job(job)), status_code=201, media_type="application/json")

    @app.get("/jobs", tags=["seed"])
    def jobs(request: Request, node_id: str | None = Query(None), status: str | None = Query(None)) -> Response:
        """Every job in the seed's shape, filtered by node and seed status: a bare JSON array."""
        if status is not None and status not in SEED_STATUSES:
            raise InvalidInput(f"status {status!r}: use one of {', '.join(SEED_STATUSES)}")
        secrets = not viewer(request)
        found = [seed_job(o, secrets=secrets) for o in reads.objects(store, "jobs", [], None).objects]
        found = [j for j in found if (node_id is None or j["node_id"] == node_id)]
        found = [j for j in found if (status is None or j["status"] == status)]
        return Response(json.dumps(found), media_type="application/json")
