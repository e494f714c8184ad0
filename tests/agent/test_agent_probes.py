"""Probes: wait probes run off the reconcile workers. Real probe processes, gated by fifos;
every wait is a condition with a deadline."""

from __future__ import annotations

import os
import threading

from reconciler.agent.probe import Probes
from reconciler.api.job import WaitCondition
from tests.helpers import wait_until


def gated_probe(tmp_path, name: str, code: int) -> WaitCondition:
    """A probe that runs until its gate fifo is written, then exits `code`."""
    gate = tmp_path / name
    os.mkfifo(gate)
    return WaitCondition.model_validate(
        {"probe": {"command": ["sh", "-c", f"read x < '{gate}'; echo said $x; exit {code}"], "timeout": "60s"}})


class Wakes:
    def __init__(self):
        self.names: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, name: str) -> None:
        with self.lock:
            self.names.append(name)


def test_a_probe_runs_in_the_background_and_its_end_wakes_the_job(tmp_path):
    wakes = Wakes()
    probes = Probes(wakes)
    cond = gated_probe(tmp_path, "gate", 3)
    try:
        assert probes.result("job-a", cond, str(tmp_path)) is None  # started, not waited for
        assert probes.result("job-a", cond, str(tmp_path)) is None  # still running: not started twice
        assert wakes.names == []
        (tmp_path / "gate").write_text("hello\n")
        wait_until(lambda: wakes.names == ["job-a"], message="the probe's end did not wake its job")
        assert probes.result("job-a", cond, str(tmp_path)) == (False, "probe exited 3: said hello")
        # handed out once: the next ask starts a new probe
        assert probes.result("job-a", cond, str(tmp_path)) is None
    finally:
        with open(tmp_path / "gate", "w") as gate:  # let the second probe end
            gate.write("bye\n")
        probes.close()


def test_probes_of_different_jobs_run_side_by_side(tmp_path):
    wakes = Wakes()
    probes = Probes(wakes)
    slow, quick = gated_probe(tmp_path, "slow", 0), WaitCondition.model_validate({"probe": {"command": ["true"]}})
    try:
        assert probes.result("slow-job", slow, None) is None
        assert probes.result("quick-job", quick, None) is None
        wait_until(lambda: "quick-job" in wakes.names, message="a quick probe waited for a slow one")
        assert probes.result("quick-job", quick, None) == (True, "probe succeeded")
        assert "slow-job" not in wakes.names
    finally:
        (tmp_path / "slow").write_text("go\n")
        probes.close()


def test_a_forgotten_jobs_running_probe_neither_wakes_nor_leaves_a_result(tmp_path):
    wakes = Wakes()
    probes = Probes(wakes)
    cond = gated_probe(tmp_path, "gate", 0)
    try:
        assert probes.result("gone", cond, None) is None
        probes.forget("gone")  # e.g. it became eligible through another condition
        (tmp_path / "gate").write_text("late\n")
        # the drop mark is cleared exactly when the probe thread has handled the probe's end
        wait_until(lambda: not probes._dropped, message="the forgotten probe did not end")
        assert wakes.names == []
        assert probes.result("gone", cond, None) is None  # no stale verdict: a new probe starts
    finally:
        with open(tmp_path / "gate", "w") as gate:
            gate.write("bye\n")
        probes.close()
