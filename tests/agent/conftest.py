"""Fixtures for the agent tests: real processes, conditions awaited with deadlines."""

from __future__ import annotations

import contextlib
import pathlib
import signal

import psutil
import pytest

from reconciler.agent.cwrapper import build, compiler
from reconciler.agent.forkserver import ForkServer
from reconciler.agent.process import (
    ProcessIdentity,
    group_alive,
    group_pids,
    reap,
    signal_group,
    spawn_run,
)
from tests.helpers import wait_until

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


def group_names(identity: ProcessIdentity) -> list[str]:
    """Sorted names of the live processes in the run's group, the wrapper (the group's
    leader) named "sh" whichever build it is, so that one assertion holds for both.

    Wait for the expected names before signalling: until the sh wrapper's child
    has exec'd, it still runs the wrapper's TERM handler, and a signal landing
    in that window is absorbed instead of reaching the program.
    """
    names = []
    for pid in group_pids(identity):
        with contextlib.suppress(psutil.NoSuchProcess):
            names.append("sh" if pid == identity.pid else psutil.Process(pid).name())
    return sorted(names)


@pytest.fixture(scope="session")
def c_wrapper(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The C run wrapper, built once for the session (skips where no C compiler exists)."""
    if compiler() is None:
        pytest.skip("no C compiler: the C wrapper cannot be built here")
    binary = build(tmp_path_factory.mktemp("wrapper-state"))
    assert binary is not None
    return binary


@pytest.fixture(params=["sh", "c", "forkserver"])
def wrapper(request: pytest.FixtureRequest) -> pathlib.Path | None:
    """Each way to start a run in turn: None for the sh script, else the C build's path (exec'd
    per run, or forking its copies as the fork server: see `fork_server`)."""
    return None if request.param == "sh" else request.getfixturevalue("c_wrapper")


@pytest.fixture
def fork_server(request: pytest.FixtureRequest, tmp_path: pathlib.Path, wrapper: pathlib.Path | None):
    """The C wrapper's fork server where the `wrapper` parameter says so, else None."""
    if request.node.callspec.params.get("wrapper") != "forkserver":
        yield None
        return
    assert wrapper is not None
    server = ForkServer(wrapper, tmp_path / "locks")
    (tmp_path / "locks").mkdir()
    yield server
    server.close()


@pytest.fixture
def spawn(tmp_path: pathlib.Path, wrapper: pathlib.Path | None, fork_server: ForkServer | None):
    """spawn_run with defaults (cwd = tmp_path, run_dir = tmp_path/run-N, the way to start of
    the `wrapper` parameter: every test using it runs under each); kills leftovers."""
    started: list[ProcessIdentity] = []

    def _spawn(*, argv=None, shell=None, env=None, cwd=None, run_dir=None, **kwargs):
        run_dir = run_dir or tmp_path / f"run-{len(started) + 1}"
        identity = spawn_run(
            argv=argv,
            shell=shell,
            env=env or {},
            cwd=str(cwd or tmp_path),
            run_dir=run_dir,
            **{"wrapper": wrapper, "server": fork_server, **kwargs},
        )
        started.append(identity)
        return identity, run_dir

    yield _spawn
    for identity in started:
        signal_group(identity, signal.SIGKILL)
    for identity in started:
        wait_until(lambda identity=identity: not group_alive(identity), timeout=10)
        reap(identity)  # collect our zombie, if it is ours
