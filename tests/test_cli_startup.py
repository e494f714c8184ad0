"""The CLI's start-up: typer builds only the command a line names (every verb's click
command cost about 10 ms of each invocation), and what it builds is what it ran before."""

from __future__ import annotations

import pytest

from reconciler.cli import app as cli


@pytest.fixture
def app():
    cli._register_optional()
    return cli.app


def _names(app) -> list[str]:
    return [cli._command_name(c) for c in app.registered_commands]


def test_every_verb_has_a_name_and_each_is_kept_alone(app):
    every = _names(app)
    assert {"apply", "get", "up", "run", "controller", "serve", "wait", "logs", "explain", "graph", "drain"} <= set(
        every
    )
    assert len(every) == len(set(every))
    for name in every:
        assert _names(cli.only_the_verb_given(app, [name, "--help"])) == [name]
    assert _names(app) == every, "the app itself keeps every verb"


@pytest.mark.parametrize(
    "argv, kept",
    [
        (["--store", "sqlite:///x.db", "up", "-f", "a.yaml"], ["up"]),
        (["--store=sqlite:///x.db", "--token", "t", "get", "jobs"], ["get"]),
        (["run", "--", "up"], ["run"]),
    ],
)
def test_the_verb_after_the_global_options_is_the_one_built(app, argv, kept):
    assert _names(cli.only_the_verb_given(app, cli.hoist_global_options(argv))) == kept


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h"], ["upp"], ["--store", "sqlite:///x.db"]])
def test_a_line_without_a_known_verb_keeps_them_all_for_the_listing_and_the_error(app, argv):
    assert cli.only_the_verb_given(app, cli.hoist_global_options(argv)) is app
