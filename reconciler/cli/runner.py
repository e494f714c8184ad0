"""Verbs that run the reconcile loop: up, controller, run."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING

import typer

from .context import ctx_of, duration_of, err

if TYPE_CHECKING:
    from ..store import Store


def _converge(store: Store, names: list[str], timeout: float | None) -> int:
    """Reconcile in this process until every named job is settled; 0 if all run jobs
    Succeeded and every service is Running. Services keep running after `up` returns (the
    next controller adopts them)."""
    from ..converge import converge
    from .progress import make_progress, summary

    progress = make_progress()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        result = converge(store, names, timeout=timeout, stop=stop, on_change=progress.update)
    except KeyboardInterrupt:
        err("interrupted; runs keep going and are adopted by the next controller")
        return 130
    finally:
        progress.close()
    if result.timed_out:
        err(f"error: timed out after {timeout:g}s; jobs not completed: {', '.join(result.unsettled)}")
        return 1
    err(summary(result.jobs))
    return 0 if result.all_succeeded else 1


def up(
    ctx: typer.Context,
    filename: list[str] = typer.Option([], "-f", "--filename"),
    recursive: bool = typer.Option(False, "-R", "--recursive"),
    timeout: str | None = typer.Option(None, "--timeout", help="Give up (exit 1) after this long."),
) -> None:
    """Apply, then reconcile in the foreground until every applied job is Completed."""
    from ..apply import apply_manifests
    from .resources import read_manifests

    limit = duration_of(timeout, "--timeout")
    store = ctx_of(ctx).store
    changes = apply_manifests(store, read_manifests(filename, recursive, verb="up"))
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
    from ..converge import controller_running

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    store = ctx_of(ctx).store
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with controller_running(store, workers=workers) as running:
        err(f"controller running on node {running.node} (store {store.display_url})")
        if watch:
            from ..store import Store
            from .gitops import watch_folder

            # the folder's applies are another client's writes, as a `reconciler apply` would
            # be: through a handle of their own, the controller's change feed sees them
            folder_client = Store(store.url)
            try:
                watch_folder(folder_client, watch, stop)
            finally:
                folder_client.dispose()
        else:
            stop.wait()


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
    from ..commands import OneOff, run_job

    one_off = OneOff(
        command=list(command),
        name=name,
        shell=shell,
        after_success=after_success,
        after_finish=after_finish,
        pool=pool,
        slots=slots,
        retries=retries,
        retry_delay=retry_delay,
        retryable_exit_codes=retryable_exit_code,
        timeout=timeout,
        run_timeout=run_timeout,
        wait_file=wait_file,
    )
    store = ctx_of(ctx).store
    created = run_job(store, one_off)
    typer.echo(f"job.reconciler.dev/{created} created")
    if wait:
        raise typer.Exit(_converge(store, [created], None))


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(controller)
    app.command(context_settings={"allow_interspersed_args": False})(run)
