"""Imperative verbs: cancel, suspend, resume, rerun, wait, logs."""

from __future__ import annotations

import time

import typer

from ..errors import InvalidInput, NotFound
from .context import ctx_of, err


def _job_name(ref: str) -> str:
    from ..api.kinds import split_ref

    info, name = split_ref(ref, default_kind="Job")
    if info.kind != "Job":
        raise InvalidInput(f"{ref}: only jobs can be controlled this way")
    return name


def cancel(ctx: typer.Context, refs: list[str] = typer.Argument(..., help="job/NAME ...")) -> None:
    """Cancel jobs: a running process tree is stopped; the job ends Cancelled."""
    from ..commands import cancel as do_cancel

    for ref in refs:
        typer.echo(f"job.reconciler.dev/{_job_name(ref)} {do_cancel(ctx_of(ctx).store, _job_name(ref))}")


def suspend(ctx: typer.Context, refs: list[str] = typer.Argument(...)) -> None:
    """Pause jobs: no new run is admitted; an active run is stopped and keeps its place."""
    from ..commands import set_suspend

    for ref in refs:
        typer.echo(f"job.reconciler.dev/{_job_name(ref)} {set_suspend(ctx_of(ctx).store, _job_name(ref), True)}")


def resume(ctx: typer.Context, refs: list[str] = typer.Argument(...)) -> None:
    """Resume suspended jobs."""
    from ..commands import set_suspend

    for ref in refs:
        typer.echo(f"job.reconciler.dev/{_job_name(ref)} {set_suspend(ctx_of(ctx).store, _job_name(ref), False)}")


def rerun(
    ctx: typer.Context,
    refs: list[str] = typer.Argument(...),
    downstream: bool = typer.Option(False, "--downstream", help="Jobs depending on it run again after it."),
) -> None:
    """Run completed jobs again at a new revision."""
    from ..commands import rerun as do_rerun

    for ref in refs:
        typer.echo(
            f"job.reconciler.dev/{_job_name(ref)} {do_rerun(ctx_of(ctx).store, _job_name(ref), downstream=downstream)}"
        )


def wait(
    ctx: typer.Context,
    refs: list[str] = typer.Argument(None),
    all_jobs: bool = typer.Option(False, "--all"),
    selector: str | None = typer.Option(None, "-l", "--selector"),
    for_: str = typer.Option(..., "--for", help="condition=Succeeded | condition=Completed"),
    timeout: str = typer.Option("30s", "--timeout"),
) -> None:
    """Exit 0 when every selected job meets the condition; 1 when one cannot or time runs out."""
    from ..api.quantity import parse_duration
    from ..commands import stale_jobs, wait_state
    from ..selectors import matches, parse
    from ..store import repository as repo

    kind, _, condition = for_.partition("=")
    if kind != "condition" or condition not in (
        "Succeeded",
        "Completed",
        "Failed",
        "TimedOut",
        "Cancelled",
        "Aborted",
        "Lost",
    ):
        raise InvalidInput(f"--for {for_!r}: use condition=Succeeded or condition=Completed")
    try:
        limit = parse_duration(timeout)
    except ValueError as exc:
        raise InvalidInput(f"--timeout: {exc}") from None
    names = [_job_name(r) for r in refs or []]
    if not names and not all_jobs and not selector:
        raise InvalidInput("wait: name jobs (job/NAME), or use --all or -l SELECTOR")
    requirements = parse(selector) if selector else None
    store = ctx_of(ctx).store
    deadline = time.monotonic() + limit
    seq = None
    while True:
        current = store.change_seq()
        if current != seq:
            seq = current
            with store.read() as session:
                objs = repo.list_objects(session, kind="Job", names=names or None)
                if names and (missing := set(names) - {o.name for o in objs}):
                    raise NotFound("; ".join(f'jobs "{n}" not found' for n in sorted(missing)))
                if requirements:
                    objs = [o for o in objs if matches(requirements, o.labels)]
                # a completion that predates a spec change, a rerun or a dependency's new
                # revision is not an answer yet: the controller will run the job again
                stale = stale_jobs(session, objs)
            states = {o.name: wait_state(o.status or {}, condition, stale=o.name in stale) for o in objs}
            if never := [n for n, s in states.items() if s == "never"]:
                for n in never:
                    err(f"job.reconciler.dev/{n} can no longer be {condition}")
                raise typer.Exit(1)
            if all(s == "met" for s in states.values()):
                for n in states:
                    typer.echo(f"job.reconciler.dev/{n} condition met")
                return
        if time.monotonic() >= deadline:
            pending = [n for n, s in states.items() if s != "met"]
            err(f"error: timed out waiting for condition {condition} on {', '.join(pending)}")
            raise typer.Exit(1)
        time.sleep(0.05)  # a CLI follower polling the cheap change sequence


def logs(
    ctx: typer.Context,
    ref: str = typer.Argument(..., help="job/NAME"),
    follow: bool = typer.Option(False, "-f", "--follow"),
    run: int | None = typer.Option(None, "--run", help="Run number (default: the latest)."),
    stream: str | None = typer.Option(None, "--stream", help="stdout | stderr (default: both)"),
    tail: int | None = typer.Option(None, "--tail", help="Only the last N lines."),
) -> None:
    """Print the captured output of a run."""
    from ..agent.logs import follow as follow_files
    from ..agent.logs import read_log
    from ..agent.logs import run_dir as run_dir_of
    from ..store import repository as repo

    name = _job_name(ref)
    if stream not in (None, "stdout", "stderr"):
        raise InvalidInput(f"--stream {stream!r}: must be stdout or stderr")
    store = ctx_of(ctx).store
    with store.read() as session:
        obj = repo.get(session, kind="Job", name=name)
    if obj is None:
        raise NotFound(f'jobs "{name}" not found')
    runs = (obj.status or {}).get("runs", [])
    if not runs:
        raise NotFound(f'job "{name}" has no runs yet')
    chosen = runs[-1] if run is None else next((r for r in runs if r["number"] == run), None)
    if chosen is None:
        raise NotFound(f'job "{name}" has no run {run} (runs: {", ".join(str(r["number"]) for r in runs)})')
    run_dir = run_dir_of(store.state_dir, name, obj.uid, chosen["number"])
    streams = [stream] if stream else ["stdout", "stderr"]
    if not follow:
        for s in streams:
            text = read_log(run_dir / s, tail=tail)
            if text:
                typer.echo(text, nl=not text.endswith("\n"))
        return

    def finished() -> bool:
        with store.read() as session:
            current = repo.get(session, kind="Job", name=name)
        rs = [r for r in ((current.status or {}).get("runs", []) if current else []) if r["number"] == chosen["number"]]
        return current is None or not rs or rs[0].get("finishedAt") is not None

    for chunk in follow_files([run_dir / s for s in streams], done=finished):
        typer.echo(chunk, nl=False)


def register(app: typer.Typer) -> None:
    for verb in (cancel, suspend, resume, rerun, wait, logs):
        app.command()(verb)
