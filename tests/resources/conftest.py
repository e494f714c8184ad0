"""Fixtures for resource limits: real controller processes (tests/crash/harness.py) whose
runs get real cgroups on this machine's hierarchy (the harness removes the cgroups of runs a
test left behind, a controller killed on purpose, at teardown)."""

from __future__ import annotations

from pathlib import Path

from reconciler.agent.cgroups import CgroupUnavailable, Hierarchy, detect
from tests.crash.harness import env  # noqa: F401  (the shared fixture)


def hierarchy() -> Hierarchy | None:
    try:
        return detect()
    except CgroupUnavailable:
        return None


def run_cgroup_dirs(hier: Hierarchy, uid: str) -> list[Path]:
    """Every folder of every run cgroup of the job `uid`, in each hierarchy."""
    return [d for parent in hier.parents() for d in parent.glob(f"*.{uid}.*")]
