"""Verbs that run the reconcile loop: up, controller, run."""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time

import typer

from ..errors import InvalidInput
from .context import ctx_of, err


def _duration(text: str | None, flag: str) -> float | None:
    from ..api.quantity import parse_duration

    if text is None:
        return None
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise InvalidInput(f"{flag}: {exc}") from None


def _converge(store, names: list[str], timeout: float | None) -> int:
    """Run a controller in this process until every named job is settled; 0 if all run jobs
    Succeeded and every service is Running. Services keep running after `up` returns (the
    next controller adopts them)."""
    from ..controller.manager import Controller
    from ..converge import JobWatch, succeeded
    from .progress import make_progress, summary

    controller = Controller(store).start()
    progress = make_progress()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    deadline = None if timeout is None else time.monotonic() + timeout
    watch = JobWatch(store, names)
    progress.update(watch.statuses, set(names))
    look = True  # whether to check for convergence: at first and after every change
    try:
        while not stop.is_set():
            if changed := watch.poll():
                progress.update(watch.statuses, changed)
                look = True
            if look:
                look = False
                if watch.all_settled():
                    break
            if deadline is not None and time.monotonic() >= deadline:
                err(f"error: timed out after {timeout:g}s; jobs not completed: {', '.join(watch.unsettled())}")
                return 1
            stop.wait(0.05)
    except KeyboardInterrupt:
        err("interrupted; runs keep going and are adopted by the next controller")
        return 130
    finally:
        progress.close()
        controller.stop()
    err(summary(watch.statuses))
    return 0 if all(succeeded(s) for s in watch.statuses.values()) and not stop.is_set() else 1


def up(
    ctx: typer.Context,
    filename: list[str] = typer.Option([], "-f", "--filename"),
    recursive: bool = typer.Option(False, "-R", "--recursive"),
    timeout: str | None = typer.Option(None, "--timeout", help="Give up (exit 1) after this long."),
) -> None:
    """Apply, then reconcile in the foreground until every applied job is Completed."""
    from ..apply import apply_manifests
    from .resources import _load

    limit = _duration(timeout, "--timeout")
    store = ctx_of(ctx).store
    changes = apply_manifests(store, _load(filename, recursive))
    for c in changes:
        if c.action != "unchanged":
            err(f"{c.kind.qualified}/{c.name} {c.action}")
    names = [c.name for c in changes if c.kind.kind == "Job"]
    raise typer.Exit(_converge(store, names, limit))


def controller(
    ctx: typer.Context,
    watch: str | None = typer.Option(None, "--watch", help="Apply and prune this folder on every change."),
    workers: int = typer.Option(
        1,
        "--workers",
        help="Reconcile workers. One is fastest: steps do not wait for "
        "other processes, and threads of one interpreter contend for its lock.",
    ),
    verbose: bool = typer.Option(False, "-v", "--verbose"),
) -> None:
    """The reconcile loop as a long-running process, with this machine's agent inside it."""
    from ..controller.manager import Controller

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    store = ctx_of(ctx).store
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    running = Controller(store, workers=workers).start()
    err(f"controller running on node {running.node} (store {store.url})")
    try:
        if watch:
            from .gitops import watch_folder

            watch_folder(store, watch, stop)
        else:
            stop.wait()
    finally:
        running.stop()


def run(
    ctx: typer.Context,
    command: list[str] = typer.Argument(..., help="The command, after --"),
    name: str | None = typer.Option(None, "--name"),
    after_success: list[str] = typer.Option([], "--after-success"),
    after_finish: list[str] = typer.Option([], "--after-finish"),
    pool: str | None = typer.Option(None, "--pool"),
    slots: int = typer.Option(1, "--slots"),
    retries: int = typer.Option(0, "--retries"),
    retry_delay: str | None = typer.Option(None, "--retry-delay"),
    retryable_exit_code: list[int] = typer.Option([], "--retryable-exit-code"),
    timeout: str | None = typer.Option(None, "--timeout"),
    run_timeout: str | None = typer.Option(None, "--run-timeout"),
    wait_file: str | None = typer.Option(None, "--wait-file"),
    shell: bool = typer.Option(False, "--shell", help="Run the command through /bin/sh -c."),
    wait: bool = typer.Option(False, "--wait", help="Reconcile in this process until the job completes."),
) -> None:
    """A one-off job without a manifest (Jobman-style); unnamed jobs get job-1, job-2, ..."""
    import os

    from pydantic import ValidationError

    from ..api.job import Job
    from ..commands import create_job

    spec: dict = {"shell": " ".join(command)} if shell else {"command": list(command)}
    spec.update(slots=slots, workingDir=os.getcwd())
    deps = [{"job": j, "outcomes": ["Succeeded"]} for j in after_success]
    deps += [{"job": j, "outcomes": ["Finished"]} for j in after_finish]
    if deps:
        spec["dependsOn"] = deps
    if pool:
        spec["pool"] = pool
    retry: dict = {"limit": retries}
    if retry_delay:
        retry["backoff"] = {"policy": "constant", "delay": retry_delay}
    if retryable_exit_code:
        retry["onExitCodes"] = retryable_exit_code
    spec["retry"] = retry
    if timeout:
        spec["timeout"] = timeout
    if run_timeout:
        spec["runTimeout"] = run_timeout
    if wait_file:
        spec["waitFor"] = {"conditions": [{"path": os.path.abspath(wait_file)}]}
    try:
        job = Job.model_validate({"metadata": {"name": name or "placeholder"}, "spec": spec})
    except ValidationError as exc:
        from ..manifests import _clean_loc, _message, format_path

        raise InvalidInput(
            "; ".join(f"{format_path(_clean_loc(e['loc']))}: {_message(e)}" for e in exc.errors())
        ) from None
    store = ctx_of(ctx).store
    created = create_job(store, job, auto_name=name is None)
    typer.echo(f"job.reconciler.dev/{created} created")
    if wait:
        raise typer.Exit(_converge(store, [created], None))


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(controller)
    app.command(context_settings={"allow_interspersed_args": False})(run)
