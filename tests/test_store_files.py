"""Store URLs and the store's files (issue 16): a URL that names no store the reconciler can
use is one line and exit 2; a password in a URL is never printed; the state folder is the
owner's only, also when made again; a controller whose SQLite file is deleted under it
stops instead of writing to a file no one reads; a store file that cannot be written can
still be read."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from reconciler.store.connect import redacted
from tests.helpers import run_cli, wait_until


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("mysql://x/y", id="another-database"),
        pytest.param("sqlite:/relative.db", id="sqlite-two-slashes"),
        pytest.param("sqlite://", id="sqlite-in-memory"),
        pytest.param("", id="empty"),
        pytest.param("postgresql://", id="postgresql-without-server"),
    ],
)
def test_a_store_url_that_names_no_usable_store_is_one_line_and_exit_2(url, tmp_path):
    result = run_cli("--store", url, "get", "jobs", store="", cwd=str(tmp_path))
    assert result.code == 2, result
    assert result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert "sqlite:///PATH" in result.stderr and "postgresql://" in result.stderr
    assert not list(tmp_path.iterdir()), "nothing may be created for a refused URL"


def test_a_password_in_a_store_url_is_never_printed(pg_url, tmp_path):
    """The controller's start-up line names its store; with a password, as ***."""
    secret_url = pg_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret-word@")
    assert "s3cret-word" in secret_url  # trust authentication on this server ignores it
    log = tmp_path / "controller.log"
    env = {**os.environ, "RECONCILER_STORE": secret_url, "XDG_STATE_HOME": str(tmp_path / "xdg")}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "reconciler", "controller"], env=env, stderr=out)
    try:
        wait_until(lambda: "controller running" in log.read_text(), timeout=30, message="the controller started")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    text = log.read_text()
    assert "s3cret-word" not in text and "postgres:***@" in text, text
    refused = run_cli("--store", secret_url.replace("postgresql", "mysql"), "get", "jobs", store="")
    assert refused.code == 2 and "s3cret-word" not in refused.stderr and "***" in refused.stderr


def test_a_store_password_holding_an_at_is_hidden_whole():
    assert redacted("postgresql://app:top@secret@db.local:5432/jobs") == "postgresql://app:***@db.local:5432/jobs"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_state_folder_is_the_owners_only_also_when_made_again(pg_url, tmp_path):
    """With a PostgreSQL store the run logs live under the user's state folder: it was
    created 0755, and again 0755 once deleted."""
    xdg = tmp_path / "xdg"
    env = {"XDG_STATE_HOME": str(xdg)}
    state = xdg / "reconciler"
    for attempt in ("first", "after it was deleted"):
        result = run_cli("run", "--wait", "--", "true", store=pg_url, env=env)
        assert result.code == 0, (attempt, result)
        assert mode(state) == 0o700 and mode(state / "runs") == 0o700, attempt
        shutil.rmtree(state)


def test_a_controller_whose_store_file_is_deleted_stops(sqlite_url, tmp_path):
    """It would go on committing into the unlinked file while every other process, the CLI
    included, sees a new empty store: a silent split brain."""
    db = Path(sqlite_url.removeprefix("sqlite:///"))
    log = tmp_path / "controller.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "reconciler", "controller"],
            env={**os.environ, "RECONCILER_STORE": sqlite_url},
            stderr=out,
        )
    try:
        wait_until(lambda: "controller running" in log.read_text(), timeout=30, message="the controller started")
        for path in db.parent.glob(db.name + "*"):  # the file, and its -wal and -shm
            path.unlink()
        assert proc.wait(20) == 1, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert f"the store file {db} was deleted or replaced under this controller" in log.read_text()


def test_a_store_file_that_cannot_be_written_can_still_be_read(tmp_path):
    """Reads open nothing for writing: `get` works on a store this process may not write
    (here made immutable, which even root cannot write); a change fails with one line."""
    if shutil.which("chattr") is None:
        pytest.skip("chattr is not installed: no way to make a file unwritable for root")
    db = tmp_path / "state" / "state.db"
    url = f"sqlite:///{db}"
    manifest = tmp_path / "job.yaml"
    manifest.write_text(
        "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: x}\nspec: {command: ['true']}\n"
    )
    assert run_cli("apply", "-f", str(manifest), store=url).code == 0
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip(f"this filesystem refuses chattr +i: {tmp_path}")
    try:
        got = run_cli("get", "jobs", "-o", "name", store=url)
        assert (got.code, got.stdout.strip()) == (0, "job.reconciler.dev/x"), got
        manifest.write_text(manifest.read_text().replace("'true'", "'false'"))
        changed = run_cli("apply", "-f", str(manifest), store=url)
        assert changed.code == 1 and len(changed.stderr.splitlines()) == 1 and "Traceback" not in changed.stderr
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
