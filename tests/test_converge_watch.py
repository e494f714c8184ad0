"""JobWatch, what `up` and `run --wait` follow jobs with: each look reads the jobs written
since the last one, on a real SQLite store."""

from __future__ import annotations

from reconciler.converge import JobWatch
from reconciler.store import Store
from reconciler.store import repository as repo


def _job(store: Store, name: str, spec: dict, status: dict) -> None:
    with store.write() as tx:
        repo.create(tx, kind="Job", name=name, spec=spec, labels={}, annotations={}, status=status)


def _rewrite(store: Store, name: str, spec: dict, status: dict) -> None:
    with store.write() as tx:
        current = repo.get(tx.session, kind="Job", name=name)
        assert current is not None
        repo.update_object(tx, current, spec=spec, status=status)


def test_a_job_that_becomes_a_service_is_followed_as_one(sqlite_url):
    """The follower knows a job's type from its spec, decoded again only when the spec text
    changes: a run job made a service while followed settles once Running, as a service does."""
    store = Store(sqlite_url)
    try:
        _job(store, "web", {"command": ["true"], "type": "run"}, {"phase": "Running"})
        watch = JobWatch(store, ["web"])
        assert not watch.jobs["web"].service and not watch.jobs["web"].settled
        _rewrite(store, "web", {"command": ["true"], "type": "run"}, {"phase": "Running", "reason": "Started"})
        assert watch.poll() == {"web"}
        assert not watch.jobs["web"].service, "a status write leaves the type as it was"
        _rewrite(store, "web", {"command": ["true"], "type": "service"}, {"phase": "Running"})
        assert watch.poll() == {"web"}
        assert watch.jobs["web"].service and watch.jobs["web"].settled
        _rewrite(store, "web", {"command": ["true"], "type": "run"}, {"phase": "Running"})
        watch.poll()
        assert not watch.jobs["web"].settled, "and back: a run job is settled only once Completed"
    finally:
        store.dispose()
