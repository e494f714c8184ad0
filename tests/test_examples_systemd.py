"""The systemd units in examples/systemd start `reconciler serve` (or `agent`) with flags it
has: each ExecStart's options are checked against the verb's `--help` (and the global ones,
`--server`, `--token`, `--store`, which may come before it), so a renamed flag cannot leave a
unit that fails at boot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import run_cli

UNITS = sorted((Path(__file__).resolve().parent.parent / "examples" / "systemd").glob("*.service"))


def _exec_start(unit: Path) -> str:
    text = unit.read_text().replace("\\\n", " ")
    return next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ExecStart="))


GLOBAL = ("--server", "--token", "--store")


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_a_units_flags_are_flags_its_verb_has(unit, sqlite_url):
    command = _exec_start(unit).split()
    assert command[0].endswith("/reconciler"), command
    words = command[1:]
    while words and words[0] in GLOBAL:  # a global option and its value
        words = words[2:]
    verb = words[0]
    assert verb in ("serve", "agent"), command
    helped = run_cli(verb, "--help", store=sqlite_url, env={"COLUMNS": "200"}).stdout
    known = set(re.findall(r"--[a-z][a-z-]+", helped)) | set(GLOBAL)
    flags = [word for word in command[1:] if word.startswith("--")]
    assert flags and not [f for f in flags if f not in known], (flags, sorted(known))


def test_there_is_a_unit_for_several_servers_on_postgresql():
    names = [u.name for u in UNITS]
    assert "reconciler-serve-postgresql.service" in names
    assert "--no-local-node" in _exec_start(UNITS[names.index("reconciler-serve-postgresql.service")])
