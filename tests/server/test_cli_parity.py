"""API parity: the CLI prints the same and exits the same through `--server` as straight on
the store, verb by verb, on the same store contents (SQLite and PostgreSQL)."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.integration.conftest import REPO_ROOT
from tests.server.conftest import settled

AGE = re.compile(r"\b\d+(?:m\d+s|[smhd])\b")  # 45s, 3m12s, 5h, 2d: they move between two runs


def _same(text: str) -> str:
    """Output with ages masked and runs of spaces folded (a table's widths follow its ages)."""
    return re.sub(r"[ \t]+", " ", AGE.sub("AGE", text))


def _parity(server, *args: str, stdin: str | None = None) -> tuple[int, str]:
    """Run a verb locally and through the server; both must agree. Returns (exit code, stdout)."""
    local = server.local(*args) if stdin is None else _with_stdin(server, False, args, stdin)
    remote = server.cli(*args) if stdin is None else _with_stdin(server, True, args, stdin)
    assert remote.code == local.code, (args, local, remote)
    assert _same(remote.stdout) == _same(local.stdout), (args, local.stdout, remote.stdout)
    assert _same(remote.stderr) == _same(local.stderr), (args, local.stderr, remote.stderr)
    return local.code, local.stdout


def _with_stdin(server, remote: bool, args: tuple[str, ...], text: str):
    from tests.helpers import run_cli

    env = {"RECONCILER_SERVER": server.url} if remote else None
    return run_cli(*args, store=server.store, input=text, env=env)


BAD = textwrap.dedent(
    """\
    apiVersion: reconciler.dev/v1alpha1
    kind: Job
    metadata: {name: broken}
    spec:
      command: [x]
      dependsOn: [ghost, prepare-data]
    ---
    apiVersion: reconciler.dev/v1alpha1
    kind: Job
    metadata: {name: also-broken}
    spec:
      comand: [x]
    ---
    apiVersion: reconciler.dev/v1alpha1
    kind: Job
    metadata: {name: uses-broken}
    spec:
      command: [x]
      dependsOn: [also-broken]
      pool: nowhere
    """
)


@pytest.fixture
def shards(tmp_path) -> str:
    """The seed pipeline, copied: its runs write beside it."""
    folder = tmp_path / "shards"
    shutil.copytree(REPO_ROOT / "examples" / "shards", folder, ignore=shutil.ignore_patterns("work"))
    return str(folder)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_verbs_print_and_exit_the_same_through_the_server(serve, request, backend, shards):
    store = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    server = serve(store)
    up = server.cli("up", "-f", shards, "--timeout", "90s", timeout=120)
    assert up.code == 0, up.stderr
    settled(server, "prepare-data", "analyze-1", "analyze-2", "analyze-3", "analyze-4")

    reads = READS if backend == "sqlite" else READS[:6]  # PostgreSQL: the reads the store answers differently
    for args in reads:
        _parity(server, *(shards if a == "SHARDS" else a for a in args))

    # refusals name the file and line on both sides, the server's own checks included
    code, _ = _parity(server, "apply", "-f", "-", stdin=BAD)
    assert code == 2
    stale = (Path(shards) / "jobs.yaml").read_text()
    code, _ = _parity(server, "apply", "-f", "-", stdin=stale.replace("name: prepare-data", _stale_meta(), 1))
    assert code == 4


READS = [
    ("get", "jobs"),
    ("get", "jobs", "-o", "wide"),
    ("get", "jobs", "-o", "json"),
    ("get", "jobs", "-o", "yaml"),
    ("get", "jobs", "-o", "name", "-l", "pipeline=shards"),
    ("get", "jobs,pools"),
    ("get", "job/analyze-1", "pool/analysis", "-o", "json"),
    ("get", "jobs,pools", "analysis"),
    ("get", "pools", "-o", "wide"),
    ("get", "services"),
    ("get", "job", "analyze-3"),
    ("get", "job", "nope"),
    ("get", "widgets"),
    ("get", "jobs", "-l", "a in (b"),
    ("describe", "job", "analyze-3"),
    ("describe", "pool/analysis"),
    ("describe", "job", "nope"),
    ("logs", "job/analyze-3", "--run", "1"),
    ("logs", "job/analyze-3", "--stream", "stderr", "--tail", "1"),
    ("logs", "job/analyze-3", "--run", "9"),
    ("logs", "job/analyze-3", "--stream", "bogus"),
    ("graph",),
    ("graph", "-o", "dot", "-l", "pipeline=shards"),
    ("graph", "-f", "SHARDS"),
    ("wait", "--all", "--for", "condition=Succeeded", "--timeout", "5s"),
    ("wait", "job/analyze-1", "job/nope", "--for", "condition=Completed", "--timeout", "5s"),
    ("diff", "-f", "SHARDS"),
    ("apply", "-f", "SHARDS", "--dry-run"),
    ("apply", "-f", "SHARDS", "-o", "json"),
    ("cancel", "job/analyze-1"),
    ("rerun", "job/nope"),
    ("delete", "job", "nope"),
    ("delete", "-l", "pipeline=none-such"),
    ("wait", "-l", "pipeline=none-such", "--for", "condition=Completed", "--timeout", "5s"),
    ("run", "--name", "analyze-1", "--", "true"),
]


def _stale_meta() -> str:
    return "name: prepare-data\n  resourceVersion: '1'"


def test_mutating_verbs_answer_the_same_through_the_server(serve, sqlite_url):
    """Each mutation made once locally and once remotely on twin jobs: the same lines."""
    server = serve(sqlite_url)
    for name in ("l", "r"):
        assert server.local("run", "--name", f"{name}-job", "--", "true").code == 0
    settled(server, "l-job", "r-job")
    for verb in (("suspend",), ("suspend",), ("resume",), ("rerun", "--downstream")):
        local = server.local(*verb, "job/l-job")
        remote = server.cli(*verb, "job/r-job")
        assert remote.code == local.code and remote.stdout.replace("r-job", "l-job") == local.stdout, (
            verb,
            local,
            remote,
        )
    wait_until(
        lambda: all(server.job(n)["status"].get("revision") == 2 for n in ("l-job", "r-job")), message="both rerun"
    )
    settled(server, "l-job", "r-job")
    local, remote = server.local("delete", "job", "l-job"), server.cli("delete", "job", "r-job")
    assert (local.code, local.stdout) == (remote.code, remote.stdout.replace("r-job", "l-job"))
