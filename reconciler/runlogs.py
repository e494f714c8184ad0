"""A run's captured output, as `logs` and the API's log endpoint read it: where the agent
keeps each stream, its kept text (or its last lines), and following it until the run has
ended. Nothing here writes."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .api.status import RunDict
from .errors import InvalidInput, NotFound, ReconcilerError
from .store import Store
from .store import repository as repo


@dataclass(frozen=True)
class RunLogs:
    """Where one run's output is, and how to tell when it can grow no more."""

    job: str
    run: RunDict
    dir: Path
    store: Store

    def paths(self, stream: str | None) -> list[Path]:
        """The files of the streams asked for; raises when the run has none of them."""
        if stream not in (None, "stdout", "stderr"):
            raise InvalidInput(f"--stream {stream!r}: must be stdout or stderr")
        paths = [self.dir / s for s in ([stream] if stream else ["stdout", "stderr"])]
        if not any(p.exists() for p in paths):
            raise ReconcilerError(self._no_logs())
        return paths

    def _no_logs(self) -> str:
        number = self.run["number"]
        if self.run.get("pid") is None:  # its command was never spawned
            reason = self.run.get("reason") or self.run.get("outcome") or "not started"
            return f'run {number} of job "{self.job}" never started ({reason}): it has no logs'
        node = self.run.get("node")
        if node and self._remote(node):
            return (
                f'run {number} of job "{self.job}" ran on node {node}, whose agent keeps its logs: '
                "read them through the server (--server URL)"
            )
        return f'run {number} of job "{self.job}" has no logs (nothing in {self.dir})'

    def _remote(self, node: str) -> bool:
        """Whether a node's runs are a remote agent's (their files are on its machine)."""
        with self.store.read() as session:
            found = repo.get(session, kind="Node", name=node)
        return found is not None and bool((found.status or {}).get("remote"))

    def read(self, stream: str | None, tail: int | None = None) -> Iterator[str]:
        """The kept text of each stream (or its last `tail` lines), in pieces of bounded
        size; each stream's text ends with a newline, so two never run together on a line."""
        from .agent.logs import read_logs

        return read_logs(self.paths(stream), tail=tail)

    def follow(self, stream: str | None, tail: int | None = None, stop: threading.Event | None = None) -> Iterator[str]:
        """The streams' kept text (or their last `tail` lines), then what is written, until
        the run has ended and all is read, or `stop` is set (the reader went away)."""
        from .agent.logs import follow

        def done() -> bool:
            return (stop is not None and stop.is_set()) or self.finished()

        return follow(self.paths(stream), done=done, tail=tail)

    def finished(self) -> bool:
        """The run has ended (or the job is gone): its logs are complete."""
        with self.store.read() as session:
            current = repo.get(session, kind="Job", name=self.job)
        if current is None:
            return True
        runs = [r for r in (current.status or {}).get("runs", []) if r["number"] == self.run["number"]]
        return not runs or runs[0].get("finishedAt") is not None


def run_logs(store: Store, name: str, run: int | None) -> RunLogs:
    """The logs of run `run` of a job (the latest by default)."""
    from .agent.logs import run_dir

    with store.read() as session:
        obj = repo.get(session, kind="Job", name=name)
    if obj is None:
        raise NotFound(f'jobs "{name}" not found')
    runs: list[RunDict] = (obj.status or {}).get("runs", [])
    if not runs:
        raise NotFound(f'job "{name}" has no runs yet')
    chosen = runs[-1] if run is None else next((r for r in runs if r["number"] == run), None)
    if chosen is None:
        numbers = ", ".join(str(r["number"]) for r in runs)
        raise NotFound(f'job "{name}" has no run {run} (runs: {numbers})')
    return RunLogs(name, chosen, run_dir(store.state_dir, name, obj.uid, chosen["number"]), store)
