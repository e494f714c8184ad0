"""Reports handed to the reconcile workers with `--workers 2`: a hand taken by one worker
whose write waits for the write lock the other worker's batch holds, while that other
worker steps the job the hand woke and finds no report yet. The handed write is the
controller's own (the change feed skips it), so the job is woken again once it commits:
it acts on its agent's end report at once, not at a timer's end (about 40 s). The
interleaving is forced with gated steps of a real controller on a real store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from reconciler import noderuns
from reconciler.apply import apply_manifests
from reconciler.controller import runtime
from reconciler.controller.manager import Controller
from reconciler.controller.runtime import DONE
from reconciler.manifests import parse_text
from reconciler.store import Store
from reconciler.store import repository as repo
from reconciler.store import scheduling as sched
from tests.helpers import wait_until

JOB = "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata:\n  name: j\nspec:\n  command: [/bin/true]\n"
AGENT = "farhost:1:1.0"


def _job(store: Store):
    with store.read() as conn:
        return repo.get(conn, kind="Job", name="j")


def test_a_report_written_by_another_worker_after_the_woken_step_still_gets_the_job_stepped(
    store_url, tmp_path, monkeypatch
):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(runtime, "MAX_BATCH_AGE", 5.0)  # a batch stays young through the test's gates
    store = Store(store_url)
    noderuns.heartbeat(store, "far", noderuns.Beat(agent=AGENT, address="10.0.0.2", capacity={"slots": 1}), time.time())
    manifests, problems = parse_text(JOB, "job.yaml", Path(tmp_path))
    assert not problems
    apply_manifests(store, manifests)
    controller = Controller(store, local_node=False, sources=False, workers=2)
    with store.batch():
        controller.jobs("j")  # admitted and placed on the remote node: Starting
    assert _job(store).status["phase"] == "Starting"

    real = controller.jobs
    release_s, release_t = threading.Event(), threading.Event()
    in_s, in_t = threading.Event(), threading.Event()
    stepped: list[str] = []

    class Gated:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, name: str):
            stepped.append(name)
            if name == "s":  # a step holding its batch's transaction (the write lock)
                with store.read():
                    pass
                in_s.set()
                release_s.wait(20)
                return DONE
            if name == "t":  # a step that holds no transaction
                in_t.set()
                release_t.wait(20)
                return DONE
            return real(name)

    controller.jobs = Gated()
    controller.start()
    try:
        wait_until(lambda: controller.queue.idle(), timeout=10, message="the initial look at j")
        controller.queue.add("s", urgent=True)
        assert in_s.wait(10)
        controller.queue.add("t", urgent=True)
        assert in_t.wait(10)
        controller.queue.add("c", urgent=True)  # the next key the worker of t takes

        job = _job(store)
        with store.read() as conn:
            held = sched.admission(conn, job.uid)
        stamp = "2026-12-07T00:00:00.000Z"
        facts = {"pid": 4242, "processStartTime": 1.0, "startedAt": stamp, "finishedAt": stamp, "exitCode": 0}
        report = noderuns.Report(job.uid, held.run_number, held.epoch or 0, facts, "j")
        answer: list = []
        route = threading.Thread(
            target=lambda: answer.append(
                noderuns.report_many(store, "far", [report], AGENT, hand=controller.handoff.hand)
            )
        )
        route.start()  # as the reports route: handed, it wakes nothing itself
        wait_until(lambda: controller.handoff._pending, timeout=10, message="the hand is pending")
        release_t.set()  # its worker takes c; c's step takes the hand and waits for the write lock
        wait_until(lambda: not controller.handoff._pending, timeout=10, message="the hand is taken")
        release_s.set()  # the other worker's young batch takes j: its step reads no report yet
        route.join(10)
        assert answer and answer[0] == ([True], True), answer  # the route answers 200: kept
        wait_until(
            lambda: _job(store).status.get("phase") == "Completed",
            timeout=8,
            message=f"the job never acted on its committed end report (steps: {stepped})",
        )
    finally:
        controller.stop(drain=False)
        store.dispose()
