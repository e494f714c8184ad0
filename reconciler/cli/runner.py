"""Verbs that run the reconcile loop: up, controller, run."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from ..errors import InvalidInput
from .context import NODE_ADDRESS, address_of, ctx_of, duration_of, err

if TYPE_CHECKING:
    from ..client import Client
    from ..converge import Watched


class Interrupts:
    """Ctrl-C as `up` and `run --wait` take it, from before they write anything: the first
    press asks them to stop (what they applied is cancelled and followed until it is gone,
    then exit 130), a second raises KeyboardInterrupt (the rest is left to the controller).
    Taken from the start because through a server a job runs as soon as it is stored: a
    press between the write and the first look would otherwise leave it running."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.interrupt = threading.Event()

    def __enter__(self) -> Interrupts:
        self._previous = signal.signal(signal.SIGINT, self._pressed)
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def _pressed(self, *_: object) -> None:
        if self.interrupt.is_set():
            raise KeyboardInterrupt
        self.interrupt.set()
        self.stop.set()


def _converge(
    client: Client,
    names: list[str],
    timeout: float | None,
    interrupts: Interrupts,
    *,
    fail_fast: bool = False,
    junit: Path | None = None,
    suite: str = "reconciler up",
    spare: frozenset[str] = frozenset(),
) -> int:
    """Reconcile in this process until every named job is settled; 0 if all run jobs
    Succeeded and every service is Running. Services keep running after `up` returns (the
    next controller adopts them). On a timeout, Ctrl-C, SIGTERM or (with `fail_fast`) a
    failed job, what it started is stopped first, and it says so. Through a server, its
    controller does the work and what is stopped is cancelled through the API."""
    from ..converge import Until
    from .progress import make_progress, summary

    progress = make_progress()
    started = time.time()
    until = Until(timeout, interrupts.stop, progress.update, fail_fast, interrupts.interrupt, spare)
    try:
        result = client.converge(names, until)
    except KeyboardInterrupt:  # a second Ctrl-C, while stopping
        err("interrupted again; what still runs is adopted by the next controller")
        return 130
    finally:
        progress.close()
    if junit is not None:
        _write_junit(client, result.jobs, junit, suite=suite, started=started)
    if result.cancelled:
        err(f"stopped {len(result.cancelled)} job(s) it started: {', '.join(result.cancelled)}")
    if result.ending == "timed out":
        err(f"error: timed out after {timeout:g}s")
    elif result.ending == "failed fast":
        err(f"error: job {result.failed} did not succeed (--fail-fast)")
    err(summary(result.jobs))
    if result.ending == "interrupted":
        return 130
    return 0 if result.all_succeeded else 1


def _dependency(ref: str) -> str:
    from ..api.kinds import split_ref

    info, name = split_ref(ref, default_kind="Job")
    if info.kind != "Job":
        raise InvalidInput(f"{ref}: a one-off job depends on jobs only")
    return name


def _live(status: dict[str, Any] | None) -> bool:
    """Whether a job had a run under way (or about to be) when `up` looked."""
    return (status or {}).get("phase") in ("Starting", "Running", "Stopping", "Backoff")


def _write_junit(client: Client, jobs: dict[str, Watched], path: Path, *, suite: str, started: float) -> None:
    from ..errors import ReconcilerError
    from .junit import STDERR_TAIL, report

    def tail(name: str) -> str:
        try:
            return "".join(client.run_logs(name, None).read("stderr", tail=STDERR_TAIL))
        except ReconcilerError:  # no run, or one that never started: nothing to show
            return ""

    path.write_bytes(report(jobs, suite=suite, started=started, wall=time.time() - started, tail=tail))
    err(f"wrote {path}")


def up(
    ctx: typer.Context,
    filename: list[str] = typer.Option([], "-f", "--filename"),
    recursive: bool = typer.Option(False, "-R", "--recursive"),
    timeout: str | None = typer.Option(
        None, "--timeout", help="Give up after this long: stop what it started, exit 1."
    ),
    junit: Path | None = typer.Option(None, "--junit", help="Write a JUnit XML report here (a testcase per job)."),
    fail_fast: bool = typer.Option(False, "--fail-fast", help="Once a job fails, cancel the rest; exit 1."),
) -> None:
    """Apply, then reconcile in the foreground until every applied job is Completed."""
    from .resources import read_manifests

    limit = duration_of(timeout, "--timeout")
    if junit is not None and (junit.is_dir() or not os.access(junit.parent, os.W_OK)):  # said before the jobs run
        raise InvalidInput(f"--junit {junit}: not a file in a folder that exists and can be written")
    client = ctx_of(ctx).client
    manifests = read_manifests(filename, recursive, verb="up")
    with Interrupts() as interrupts:
        changes = client.apply(manifests, selector=None)
        for c in changes:
            if c.action != "unchanged":
                err(f"{c.kind.qualified}/{c.name} {c.action}")
        names = [c.name for c in changes if c.kind.kind == "Job"]
        # a job that ran before `up` and that its apply left unchanged is followed, not stopped
        spare = frozenset(
            c.name
            for c in changes
            if c.kind.kind == "Job" and c.action == "unchanged" and c.old is not None and _live(c.old.status)
        )
        suite = "reconciler up -f " + " ".join(filename)
        code = _converge(client, names, limit, interrupts, fail_fast=fail_fast, junit=junit, suite=suite, spare=spare)
    raise typer.Exit(code)


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
    node_address: str = NODE_ADDRESS,
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=1, max=65535, help="Serve Prometheus metrics at /metrics on this port."
    ),
    metrics_host: str = typer.Option(
        "127.0.0.1", "--metrics-host", help="Address the metrics endpoint binds (loopback by default)."
    ),
) -> None:
    """The reconcile loop as a long-running process, with this machine's agent inside it."""
    from ..converge import controller_running
    from ..logsetup import process_log

    process_log(verbose=verbose)
    if watch is not None and not os.path.exists(watch):  # said now, not by the watcher's thread later
        raise InvalidInput(f"--watch {watch}: no such file or folder")
    store = ctx_of(ctx).local_only("controller")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with controller_running(store, workers=workers, address=address_of(node_address)) as running:
        if metrics_port is not None:
            from ..metrics import serve_metrics

            try:
                metrics = serve_metrics(store, metrics_host, metrics_port)
            except OSError as exc:
                raise InvalidInput(f"--metrics-port {metrics_port}: cannot listen on {metrics_host}: {exc}") from None
            stop_metrics = metrics.shutdown
            err(f"metrics at http://{metrics_host}:{metrics_port}/metrics")
        else:
            stop_metrics = None
        err(f"controller running on node {running.node} (store {store.display_url})")
        try:
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
        finally:
            if stop_metrics is not None:
                stop_metrics()


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
    from ..commands import OneOff

    one_off = OneOff(
        command=list(command),
        name=name,
        shell=shell,
        # `job/NAME`, as every other verb takes a job
        after_success=[_dependency(ref) for ref in after_success],
        after_finish=[_dependency(ref) for ref in after_finish],
        pool=pool,
        slots=slots,
        retries=retries,
        retry_delay=retry_delay,
        retryable_exit_codes=retryable_exit_code,
        timeout=timeout,
        run_timeout=run_timeout,
        wait_file=os.path.abspath(wait_file) if wait_file else None,  # where this command was given
    )
    client = ctx_of(ctx).client
    if not wait:
        typer.echo(f"job.reconciler.dev/{client.run_job(one_off)} created")
        return
    with Interrupts() as interrupts:
        created = client.run_job(one_off)
        typer.echo(f"job.reconciler.dev/{created} created")
        code = _converge(client, [created], None, interrupts)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command()(up)
    app.command()(controller)
    app.command(context_settings={"allow_interspersed_args": False})(run)
