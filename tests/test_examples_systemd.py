"""The systemd units in examples/systemd start `reconciler serve` with flags it has: each
ExecStart's options are checked against `reconciler serve --help`, so a renamed flag cannot
leave a unit that fails at boot."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import run_cli

UNITS = sorted((Path(__file__).resolve().parent.parent / "examples" / "systemd").glob("*.service"))


def _exec_start(unit: Path) -> str:
    text = unit.read_text().replace("\\\n", " ")
    return next(line.split("=", 1)[1] for line in text.splitlines() if line.startswith("ExecStart="))


@pytest.mark.parametrize("unit", UNITS, ids=[u.name for u in UNITS])
def test_a_units_serve_flags_are_flags_serve_has(unit, sqlite_url):
    command = _exec_start(unit).split()
    assert command[0].endswith("/reconciler") and command[1] == "serve", command
    helped = run_cli("serve", "--help", store=sqlite_url, env={"COLUMNS": "200"}).stdout
    known = set(re.findall(r"--[a-z][a-z-]+", helped))
    flags = [word for word in command[2:] if word.startswith("--")]
    assert flags and not [f for f in flags if f not in known], (flags, sorted(known))


def test_there_is_a_unit_for_several_servers_on_postgresql():
    names = [u.name for u in UNITS]
    assert "reconciler-serve-postgresql.service" in names
    assert "--no-local-node" in _exec_start(UNITS[names.index("reconciler-serve-postgresql.service")])
