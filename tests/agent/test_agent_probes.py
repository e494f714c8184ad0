"""Probes: wait probes run off the reconcile worker. Real probe processes, gated by fifos;
the interval is paced by an injected clock; every wait is a condition with a deadline."""

from __future__ import annotations

import os
import threading

import psutil

from reconciler.agent.probe import Probes, run_probe
from reconciler.api.job import WaitCondition
from tests.helpers import wait_until

UID = "0b5e6f3a-8c1d-4f2e-9a7b-1c2d3e4f5a6b"


def gated_probe(tmp_path, name: str, code: int, interval: str = "2s") -> WaitCondition:
    """A probe that notes each run in `name`.runs, waits for its gate fifo, then exits `code`."""
    gate = tmp_path / name
    os.mkfifo(gate)
    script = f"echo run >> '{gate}.runs'; read x < '{gate}'; echo said $x; exit {code}"
    return WaitCondition.model_validate(
        {"probe": {"command": ["sh", "-c", script], "timeout": "60s", "interval": interval}}
    )


def runs(tmp_path, name: str) -> int:
    path = tmp_path / f"{name}.runs"
    return len(path.read_text().splitlines()) if path.exists() else 0


def open_gate(tmp_path, name: str) -> bool:
    """Let a waiting probe go; False when none waits (never blocks, so a failing test ends)."""
    try:
        fd = os.open(tmp_path / name, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.write(fd, b"go\n")
    except BrokenPipeError:  # the reader went away meanwhile (killed by close)
        return False
    finally:
        os.close(fd)
    return True


class Wakes:
    def __init__(self):
        self.names: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, name: str) -> None:
        with self.lock:
            self.names.append(name)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_last_verdict_stands_and_the_next_probe_waits_for_the_interval(tmp_path):
    wakes, clock = Wakes(), Clock()
    probes = Probes(wakes, clock=clock)
    cond = gated_probe(tmp_path, "gate", 3, interval="5s")
    try:
        assert probes.verdict("job-a", UID, cond, str(tmp_path)) is None  # started, not waited for
        wait_until(lambda: runs(tmp_path, "gate") == 1)
        assert probes.verdict("job-a", UID, cond, str(tmp_path)) is None  # running: not started twice
        wait_until(lambda: open_gate(tmp_path, "gate"), message="the probe never waited at its gate")
        wait_until(lambda: wakes.names == ["job-a"], message="the probe's end did not wake its job")
        verdict = (False, "probe exited 3: said go")
        for _ in range(3):  # asked again (a conflict, another wake): the same verdict, no new probe
            assert probes.verdict("job-a", UID, cond, str(tmp_path)) == verdict
        clock.now += 4.4
        assert probes.verdict("job-a", UID, cond, str(tmp_path)) == verdict
        assert runs(tmp_path, "gate") == 1
        clock.now += 0.1  # 90% of the interval (the recheck timer's earliest jitter): the next one starts
        assert probes.verdict("job-a", UID, cond, str(tmp_path)) == verdict  # which stands meanwhile
        wait_until(lambda: runs(tmp_path, "gate") == 2)
    finally:
        probes.close()
        open_gate(tmp_path, "gate")


def test_probes_of_different_jobs_run_side_by_side(tmp_path):
    wakes = Wakes()
    probes = Probes(wakes)
    slow, quick = gated_probe(tmp_path, "slow", 0), WaitCondition.model_validate({"probe": {"command": ["true"]}})
    try:
        assert probes.verdict("slow-job", UID, slow, None) is None
        assert probes.verdict("quick-job", UID, quick, None) is None
        wait_until(lambda: "quick-job" in wakes.names, message="a quick probe waited for a slow one")
        assert probes.verdict("quick-job", UID, quick, None) == (True, "probe succeeded")
        assert "slow-job" not in wakes.names
    finally:
        probes.close()
        open_gate(tmp_path, "slow")


def test_a_forgotten_jobs_running_probe_neither_wakes_nor_leaves_a_verdict(tmp_path):
    wakes = Wakes()
    probes = Probes(wakes, threads=1)  # one thread: it handles the probes strictly in turn
    cond, marker = gated_probe(tmp_path, "gate", 0), WaitCondition.model_validate({"probe": {"command": ["true"]}})
    try:
        assert probes.verdict("gone", UID, cond, None) is None
        wait_until(lambda: runs(tmp_path, "gate") == 1)
        probes.forget("gone")  # e.g. it became eligible through another condition
        assert probes.verdict("marker", UID, marker, None) is None  # queued behind the forgotten probe
        wait_until(lambda: open_gate(tmp_path, "gate"))
        wait_until(lambda: "marker" in wakes.names)  # so the forgotten probe's end was handled
        assert wakes.names == ["marker"]
        assert probes.verdict("gone", UID, cond, None) is None  # no stale verdict: a new probe starts
    finally:
        probes.close()
        open_gate(tmp_path, "gate")


def test_close_kills_the_probes_still_running(tmp_path):
    probes = Probes(Wakes())
    cond = WaitCondition.model_validate(
        {"probe": {"command": ["sh", "-c", f"echo $$ > '{tmp_path}/pid'; exec sleep 60"], "timeout": "120s"}}
    )
    assert probes.verdict("job", UID, cond, None) is None
    pid = int(wait_until(lambda: (tmp_path / "pid").exists() and (tmp_path / "pid").read_text().strip()))
    assert psutil.pid_exists(pid)
    probes.close()
    wait_until(lambda: gone(pid), message="the probe outlived close()")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_probe_records_kill_only_what_a_gone_owner_left_and_never_a_stranger(tmp_path):
    """reap_orphans kills a recorded probe whose owner is gone; leaves a probe whose owner
    (another controller) lives; and a record whose pid now names another process (another
    start time) kills nothing. Each file of a probe it is done with goes."""
    import signal
    import subprocess

    from reconciler.agent.probeprocs import ProbeProcs

    def started(proc: subprocess.Popen) -> float:
        return psutil.Process(proc.pid).create_time()

    folder = tmp_path / "probes"
    ProbeProcs(folder)  # makes the folder
    orphan, kept, stranger, live_owner = (subprocess.Popen(["sleep", "300"], start_new_session=True) for _ in range(4))
    gone_owner = subprocess.Popen(["true"])
    gone_owner.wait()
    try:
        (folder / str(orphan.pid)).write_text(f"{started(orphan)} {gone_owner.pid} 1.0\n")
        (folder / str(kept.pid)).write_text(f"{started(kept)} {live_owner.pid} {started(live_owner)}\n")
        (folder / str(stranger.pid)).write_text(f"12345.0 {gone_owner.pid} 1.0\n")  # its pid, another start
        assert ProbeProcs(folder).reap_orphans() == 1
        assert orphan.wait(10) == -signal.SIGKILL
        assert kept.poll() is None and stranger.poll() is None
        assert sorted(p.name for p in folder.iterdir()) == [str(kept.pid)]
    finally:
        for proc in (orphan, kept, stranger, live_owner):
            proc.kill()
            proc.wait()


def probe(command: list[str], timeout: str = "5s", limit: str = "4Ki") -> WaitCondition:
    return WaitCondition.model_validate({"probe": {"command": command, "timeout": timeout, "outputLimit": limit}})


def test_a_probe_keeps_its_output_up_to_the_limit_and_no_more(tmp_path):
    ok, said = run_probe(probe(["sh", "-c", "echo ready; exit 0"]))
    assert (ok, said) == (True, "probe succeeded: ready")
    ok, said = run_probe(probe(["sh", "-c", "echo not yet; exit 3"]))
    assert (ok, said) == (False, "probe exited 3: not yet")
    # 64 MiB of output: read and dropped past the limit, not held (nor blocking the probe)
    ok, said = run_probe(probe(["sh", "-c", "head -c 67108864 /dev/zero | tr '\\0' x; exit 0"], timeout="60s"))
    assert ok and said == "probe succeeded: " + "x" * 4096


def test_a_chatty_probe_is_timed_out_without_its_output_filling_memory(tmp_path):
    before = psutil.Process().memory_info().rss
    ok, said = run_probe(probe(["yes"], timeout="1s"))
    assert (ok, said) == (False, "probe timed out after 1s")
    assert psutil.Process().memory_info().rss - before < 64 * 2**20


def test_a_child_left_holding_the_pipe_is_not_waited_for(tmp_path):
    """A probe that exits leaving a child of its own session holding the pipe gets its verdict
    at its exit, and the child is killed with its group; one in another session (setsid)
    does not hold the probe to its timeout."""
    marker = tmp_path / "child"
    ok, said = run_probe(probe(["sh", "-c", f"sleep 30 & echo $! > {marker}; echo done; exit 0"], timeout="20s"))
    assert (ok, said) == (True, "probe succeeded: done")
    child = int(marker.read_text())
    wait_until(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == "zombie", timeout=10)
    escaped = tmp_path / "escaped"
    # its verdict at its exit (waiting for the pipe's end, it was "timed out")
    ok, said = run_probe(probe(["sh", "-c", f"setsid sleep 600 & echo $! > {escaped}; exit 1"], timeout="20s"))
    assert (ok, said) == (False, "probe exited 1")
    os.kill(int(escaped.read_text()), 9)
    # timed out, it is not waited for either (it was, until the escaped child's end: the
    # test's own timeout would end it first)
    ok, said = run_probe(probe(["sh", "-c", f"setsid sleep 600 & echo $! > {escaped}; sleep 600"], timeout="1s"))
    assert (ok, said) == (False, "probe timed out after 1s")
    os.kill(int(escaped.read_text()), 9)


def test_a_probe_gets_a_runs_environment_without_reconcilers_own_variables(monkeypatch):
    """The store's URL (and its password) or a token must not reach a probe, as they do not
    reach a run; the job's spec.env does."""
    monkeypatch.setenv("RECONCILER_STORE", "postgresql://app:S3cret@db/jobs")
    monkeypatch.setenv("PLAIN_VARIABLE", "inherited")
    command = ["sh", "-c", 'echo "[$RECONCILER_STORE] [$PLAIN_VARIABLE] [$FROM_SPEC]"; exit 0']
    ok, said = run_probe(probe(command), env={"FROM_SPEC": "given"})
    assert ok and said == "probe succeeded: [] [inherited] [given]", said
