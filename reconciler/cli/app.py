"""The `reconciler` console script: global options, verb registration, exit codes."""

from __future__ import annotations

import atexit
import copy
import gc
import sys

import typer

from ..errors import InvalidInput, ReconcilerError, first_line
from . import resources
from .context import Context

app = typer.Typer(
    name="reconciler",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="A Kubernetes-style declarative job reconciler.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _global(
    ctx: typer.Context,
    store: str | None = typer.Option(
        None,
        "--store",
        envvar="RECONCILER_STORE",
        help="sqlite:///PATH (default under the user's state dir) or postgresql://...",
    ),
    server: str | None = typer.Option(
        None, "--server", envvar="RECONCILER_SERVER", help="Talk to a running `reconciler serve` instead of the store."
    ),
    token: str | None = typer.Option(
        None, "--token", envvar="RECONCILER_TOKEN", help="Bearer token for --server (see `serve --tokens`)."
    ),
) -> None:
    given = {name: _given(ctx, name) for name in ("store", "server", "token")}
    if server and store and given["store"] and given["server"]:
        raise InvalidInput("give --store or --server, not both: a verb acts on a store, or through a server")
    if token and given["token"] and not server:
        raise InvalidInput("--token is for a server: give --server URL (or RECONCILER_SERVER) too")
    ctx.obj = Context(store, server, token)
    ctx.call_on_close(ctx.obj.close)


def _given(ctx: typer.Context, name: str) -> bool:
    """The option was written on the command line (not taken from the environment)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


for verb in (resources.apply, resources.diff, resources.get, resources.describe, resources.delete):
    app.command()(verb)


_registered = False


def _register_optional() -> None:
    """Verb groups that live in their own modules (once per process)."""
    global _registered
    if _registered:
        return
    from . import control, explain, graph, nodeagent, nodes, runner, serve

    for module in (explain, control, runner, graph, nodes, serve, nodeagent):
        module.register(app)
    _registered = True


GLOBAL_OPTIONS = ("--store", "--server", "--token")


def hoist_global_options(argv: list[str]) -> list[str]:
    """Accept `--store URL`, `--server URL`, `--token T` anywhere on the line, as kubectl does
    with its global flags."""
    front, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg in GLOBAL_OPTIONS and i + 1 < len(argv):
            front += argv[i : i + 2]
            i += 2
            continue
        if arg.split("=", 1)[0] in GLOBAL_OPTIONS and "=" in arg:
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


# At exit the interpreter's last collections walk every object still alive (every class and
# function of SQLAlchemy, pydantic, typer: ~0.1 s) although nothing is left to finalize: the
# store is closed with the verb. Frozen objects are skipped.
atexit.register(gc.freeze)


def only_the_verb_given(app: typer.Typer, argv: list[str]) -> typer.Typer:
    """The app with only the command `argv` names (after the global options, which come
    first once hoisted), so that typer builds one command rather than every verb (about
    10 ms of each invocation). Anything else (`--help`, no verb, a verb that does not exist)
    keeps them all, for the listing and the error that name them."""
    rest = argv
    while rest and rest[0].split("=", 1)[0] in GLOBAL_OPTIONS:
        rest = rest[1:] if "=" in rest[0] else rest[2:]
    named = [c for c in app.registered_commands if rest and _command_name(c) == rest[0]]
    if not named:
        return app
    one = copy.copy(app)
    one.registered_commands = named
    return one


def _command_name(command: typer.models.CommandInfo) -> str:
    return command.name or typer.main.get_command_name(command.callback.__name__ if command.callback else "")


def main() -> None:
    try:
        _register_optional()
        argv = hoist_global_options(sys.argv[1:])
        only_the_verb_given(app, argv)(args=argv, prog_name="reconciler", standalone_mode=True)
    except ReconcilerError as exc:
        for line in getattr(exc, "problems", None) or [str(exc)]:
            print(f"error: {line}" if not line.startswith("error") else line, file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # a store that cannot be reached, a broken disk: one line, not a traceback
        from ..store import StoreError

        if isinstance(exc, (StoreError, OSError)):
            print(f"error: {exc.__class__.__name__}: {first_line(exc)}", file=sys.stderr)
            sys.exit(1)
        raise
