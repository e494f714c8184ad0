"""Fixtures for resource limits: real controller processes (tests/crash/harness.py) whose
runs get real cgroups on this machine's hierarchy; every cgroup a test's runs left (a
controller killed on purpose) is removed at teardown, after their processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.agent.cgroups import PARENT, CgroupUnavailable, Hierarchy, detect
from reconciler.store import repository as repo
from tests.crash.harness import Env


def hierarchy() -> Hierarchy | None:
    try:
        return detect()
    except CgroupUnavailable:
        return None


def run_cgroup_dirs(hier: Hierarchy, uid: str) -> list[Path]:
    """Every folder of every run cgroup of the job `uid`, in each hierarchy."""
    parents = {d.parent for d in hier.open("x").dirs}
    return [d for parent in parents for d in parent.glob(f"*.{uid}.*")]


@pytest.fixture
def env(tmp_path: Path) -> Iterator[Env]:
    e = Env(tmp_path)
    try:
        yield e
    finally:
        with e.store.read() as session:
            uids = [o.uid for o in repo.list_objects(session, kind="Job")]
        e.close()
        hier = hierarchy()
        if hier is not None:
            for uid in uids:
                for d in run_cgroup_dirs(hier, uid):
                    with contextlib.suppress(OSError):
                        d.rmdir()


__all__ = ["PARENT", "hierarchy", "run_cgroup_dirs"]
