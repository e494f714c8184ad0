"""Imperative verbs: cancel, suspend, resume, rerun, wait, logs."""

from __future__ import annotations

import sys

import typer

from ..errors import InvalidInput
from .context import ctx_of, duration_of, err, selector_of


def _job_name(ref: str) -> str:
    from ..api.kinds import split_ref

    info, name = split_ref(ref, default_kind="Job")
    if info.kind != "Job":
        raise InvalidInput(f"{ref}: only jobs can be controlled this way")
    return name


def _targets(ctx: typer.Context, verb: str, refs: list[str] | None, selector: str | None) -> list[str]:
    """The jobs a control verb acts on: named (job/NAME...), or every job matching -l."""
    if bool(refs) == bool(selector):
        raise InvalidInput(f"{verb}: name jobs (job/NAME...) or select them with -l SELECTOR, one of the two")
    if refs:
        return [_job_name(ref) for ref in refs]
    selector_of(selector)
    found = ctx_of(ctx).client.objects("jobs", [], selector).objects
    if not found:
        err("No resources found.")
    return [o.name for o in found]


SELECTOR = typer.Option(None, "-l", "--selector", help="Every job matching this label selector.")


def cancel(
    ctx: typer.Context, refs: list[str] = typer.Argument(None, help="job/NAME ..."), selector: str | None = SELECTOR
) -> None:
    """Cancel jobs: a running process tree is stopped; the job ends Cancelled."""
    client = ctx_of(ctx).client
    for name in _targets(ctx, "cancel", refs, selector):
        typer.echo(f"job.reconciler.dev/{name} {client.cancel(name)}")


def suspend(ctx: typer.Context, refs: list[str] = typer.Argument(None), selector: str | None = SELECTOR) -> None:
    """Pause jobs: no new run is admitted; an active run is stopped and keeps its place."""
    client = ctx_of(ctx).client
    for name in _targets(ctx, "suspend", refs, selector):
        typer.echo(f"job.reconciler.dev/{name} {client.set_suspend(name, True)}")


def resume(ctx: typer.Context, refs: list[str] = typer.Argument(None), selector: str | None = SELECTOR) -> None:
    """Resume suspended jobs."""
    client = ctx_of(ctx).client
    for name in _targets(ctx, "resume", refs, selector):
        typer.echo(f"job.reconciler.dev/{name} {client.set_suspend(name, False)}")


def rerun(
    ctx: typer.Context,
    refs: list[str] = typer.Argument(None, help="job/NAME ..."),
    downstream: bool = typer.Option(False, "--downstream", help="Jobs depending on it run again after it."),
    failed: bool = typer.Option(
        False, "--failed", help="Every completed job whose outcome is not Succeeded, with its dependents."
    ),
    selector: str | None = typer.Option(
        None, "-l", "--selector", help="Every job matching it; with --failed, the failed ones among them."
    ),
) -> None:
    """Run completed jobs again at a new revision.

    Name them (job/NAME...), select them (-l), or take every completed job whose outcome is not
    Succeeded (--failed), whose dependents then run again after it."""
    client = ctx_of(ctx).client
    if refs and (failed or selector):
        raise InvalidInput("rerun: give job/NAME..., or select with -l SELECTOR or --failed, not both")
    if refs:
        for ref in refs:
            name = _job_name(ref)
            typer.echo(f"job.reconciler.dev/{name} {client.rerun(name, downstream=downstream)}")
        return
    selector_of(selector)
    if failed:
        names = client.rerun_failed(selector)
    elif selector:
        names = client.rerun_selected(selector, downstream=downstream)
    else:
        raise InvalidInput("rerun: name jobs (job/NAME), or use -l SELECTOR or --failed")
    if not names:
        err("No failed jobs found." if failed else "No resources found.")
    for name in names:
        typer.echo(f"job.reconciler.dev/{name} rerun requested")


def wait(
    ctx: typer.Context,
    refs: list[str] = typer.Argument(None),
    all_jobs: bool = typer.Option(False, "--all"),
    selector: str | None = typer.Option(None, "-l", "--selector"),
    for_: str = typer.Option(
        ...,
        "--for",
        help="condition=Completed, or condition=OUTCOME (Succeeded, Failed, Cancelled, Aborted, TimedOut, Lost)",
    ),
    timeout: str = typer.Option("30s", "--timeout"),
) -> None:
    """Exit 0 when every selected job meets the condition; 1 when one cannot or time runs out."""
    from ..converge import WAITABLE

    kind, _, condition = for_.partition("=")
    if kind != "condition" or condition not in WAITABLE:
        raise InvalidInput(f"--for {for_!r}: use condition=C, C one of {', '.join(WAITABLE)}")
    limit = duration_of(timeout, "--timeout") or 0.0
    names = [_job_name(r) for r in refs or []]
    if not names and not all_jobs and not selector:
        raise InvalidInput("wait: name jobs (job/NAME), or use --all or -l SELECTOR")
    selector_of(selector)
    result = ctx_of(ctx).client.wait_for(names, condition, limit, selector)
    if not result.states:  # -l or --all selected nothing: as kubectl, not a vacuous success
        err(f"error: no matching jobs found{f' (-l {selector})' if selector else ''}")
        raise typer.Exit(1)
    if never := result.names("never"):
        for n in never:
            err(f"job.reconciler.dev/{n} can no longer be {condition}")
        raise typer.Exit(1)
    if pending := result.names("pending"):
        err(f"error: timed out waiting for condition {condition} on {', '.join(pending)}")
        raise typer.Exit(1)
    for n in result.states:
        typer.echo(f"job.reconciler.dev/{n} condition met")


def logs(
    ctx: typer.Context,
    ref: str = typer.Argument(..., help="job/NAME"),
    follow: bool = typer.Option(False, "-f", "--follow"),
    run: int | None = typer.Option(None, "--run", help="Run number (default: the latest)."),
    stream: str | None = typer.Option(None, "--stream", help="stdout | stderr (default: both)"),
    tail: int | None = typer.Option(None, "--tail", help="Only the last N lines (-1: all, as kubectl)."),
) -> None:
    """Print the captured output of a run."""
    name = _job_name(ref)
    if tail is not None and tail < 0:  # kubectl's --tail=-1: every line
        tail = None
    if stream not in (None, "stdout", "stderr"):
        raise InvalidInput(f"--stream {stream!r}: must be stdout or stderr")
    found = ctx_of(ctx).client.run_logs(name, run)
    pieces = found.follow(stream, tail=tail) if follow else found.read(stream, tail=tail)
    out = sys.stdout
    for text in pieces:  # a piece at a time: a log of any size takes little memory
        # written as kept: click's echo strips colour codes when stdout is no terminal
        out.write(text)
        out.flush()


def register(app: typer.Typer) -> None:
    for verb in (cancel, suspend, resume, rerun, wait, logs):
        app.command()(verb)
