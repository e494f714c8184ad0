"""Progress for `up`: a live rich table on a terminal, timestamped lines otherwise."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Any

from .render import job_state

TERMINAL_STYLE = {
    "Succeeded": "green",
    "Failed": "red",
    "TimedOut": "red",
    "Aborted": "yellow",
    "Cancelled": "yellow",
    "Lost": "red",
}


def _state(status: dict[str, Any]) -> str:
    if status.get("phase") == "Completed":
        return status.get("outcome") or "Completed"
    return status.get("phase") or "Waiting"


class LineProgress:
    """One line per state change; what CI logs want."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self.last: dict[str, str] = {}

    def update(self, statuses: dict[str, dict[str, Any]], changed: set[str]) -> None:
        for name in sorted(changed):
            status = statuses[name]
            state = _state(status)
            detail = status.get("reason") or ""
            key = f"{state}/{detail}/{len(status.get('runs', []))}"
            if self.last.get(name) != key:
                self.last[name] = key
                stamp = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
                runs = status.get("runs", [])
                extra = f" run={runs[-1]['number']}" if runs else ""
                print(
                    f"{stamp} job/{name} {state}{extra}" + (f" ({detail})" if detail and detail != state else ""),
                    file=self.stream,
                    flush=True,
                )

    def close(self) -> None:
        pass


class LiveProgress:
    """A table redrawn in place on a terminal."""

    def __init__(self):
        from rich.console import Console
        from rich.live import Live

        self.console = Console()
        self.live = Live(console=self.console, refresh_per_second=8, transient=False)
        self.live.start()

    def update(self, statuses: dict[str, dict[str, Any]], changed: set[str]) -> None:
        from rich.table import Table

        table = Table(box=None, header_style="bold")
        for header in ("JOB", "STATE", "RUNS", "NODE", "REASON"):
            table.add_column(header)
        done = 0
        for name in sorted(statuses):
            status = statuses[name]
            state = _state(status)
            done += status.get("phase") == "Completed"
            style = TERMINAL_STYLE.get(state, "cyan" if state == "Running" else "")
            table.add_row(
                name,
                f"[{style}]{state}[/]" if style else state,
                str(len(status.get("runs", []))),
                status.get("nodeName") or "",
                status.get("reason") or "",
            )
        table.caption = f"{done}/{len(statuses)} completed"
        self.live.update(table)

    def close(self) -> None:
        self.live.stop()


def make_progress():
    return LiveProgress() if sys.stdout.isatty() else LineProgress()


def summary(statuses: dict[str, dict[str, Any]]) -> str:
    counts: dict[str, int] = {}
    for status in statuses.values():
        state = _state(status)
        counts[state] = counts.get(state, 0) + 1
    parts = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"{len(statuses)} jobs: {parts}"


__all__ = ["job_state", "make_progress", "summary"]
