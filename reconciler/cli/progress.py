"""Progress for `up`: a live rich table on a terminal, timestamped lines otherwise."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, TextIO

from ..api.status import Outcome, Phase, RunDict, shown_state

if TYPE_CHECKING:
    from ..converge import Watched

TERMINAL_STYLE = {
    Outcome.SUCCEEDED: "green",
    Outcome.FAILED: "red",
    Outcome.TIMED_OUT: "red",
    Outcome.ABORTED: "yellow",
    Outcome.CANCELLED: "yellow",
    Outcome.LOST: "red",
}


def state_of(job: Watched) -> str:
    """What `up` shows for a job: its outcome once Completed, its phase before."""
    return "Deleted" if job.deleted else shown_state(job.status)


class Progress(Protocol):
    def update(self, jobs: Mapping[str, Watched], changed: set[str]) -> None: ...
    def close(self) -> None: ...


def _run_number(state: str, runs: list[RunDict]) -> int:
    """The run a line is about: a Starting job's next run once its last one has ended (the
    record of the run being started is written with its start), else the last run."""
    last = runs[-1]
    return int(last["number"]) + 1 if state == "Starting" and last.get("finishedAt") else int(last["number"])


class LineProgress:
    """One line per state change; what CI logs want."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout
        self.last: dict[str, str] = {}

    def update(self, jobs: Mapping[str, Watched], changed: set[str]) -> None:
        for name in sorted(changed):
            job = jobs[name]
            state = state_of(job)
            detail = job.status.get("reason") or ("Deleted" if job.deleted else "")
            runs = job.status.get("runs", [])
            key = f"{state}/{detail}/{len(runs)}"
            if self.last.get(name) != key:
                self.last[name] = key
                stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
                extra = f" run={_run_number(state, runs)}" if runs else ""
                reason = f" ({detail})" if detail and detail != state else ""
                print(f"{stamp} job/{name} {state}{extra}{reason}", file=self.stream, flush=True)

    def close(self) -> None:
        pass


class LiveProgress:
    """A table redrawn in place on a terminal."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self.live = Live(console=self.console, refresh_per_second=8, transient=False)
        self.live.start()

    def update(self, jobs: Mapping[str, Watched], changed: set[str]) -> None:
        from rich.table import Table

        del changed  # the whole table is drawn again
        table = Table(box=None, header_style="bold")
        for header in ("JOB", "STATE", "RUNS", "NODE", "REASON"):
            table.add_column(header)
        done = 0
        for name in sorted(jobs):
            job = jobs[name]
            state = state_of(job)
            done += job.status.get("phase") == Phase.COMPLETED
            style = TERMINAL_STYLE.get(state, "cyan" if state == Phase.RUNNING else "")  # type: ignore[call-overload]
            table.add_row(
                name,
                f"[{style}]{state}[/]" if style else state,
                str(len(job.status.get("runs", []))),
                job.status.get("nodeName") or "",
                job.status.get("reason") or "",
            )
        table.caption = f"{done}/{len(jobs)} completed"
        self.live.update(table)

    def close(self) -> None:
        self.live.stop()


def make_progress() -> Progress:
    return LiveProgress() if sys.stdout.isatty() else LineProgress()


def summary(jobs: Mapping[str, Watched]) -> str:
    counts: dict[str, int] = {}
    for job in jobs.values():
        state = state_of(job)
        counts[state] = counts.get(state, 0) + 1
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"{len(jobs)} jobs: {parts}"
