"""Every examples/ folder and manifests/ goes through the full declarative round trip on
SQLite and PostgreSQL: apply (all created), get, describe, apply again (all unchanged,
nothing rewritten), delete -f (all gone).

The examples are also checked against what they promise (the seed pipeline's shape), and
their commands are run the way the agent runs them (argv or /bin/sh -c, in the stored
working dir, with the job's env), in dependency order, on a copy of the folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.data.inprocess import cli
from tests.helpers import run_cli

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ["examples/shards", "examples/ci", "examples/service", "examples/retry", "examples/inbox", "manifests"]
NOT_MANIFESTS = [
    "examples/grafana",  # a Grafana dashboard for the metrics, no objects (tests/metrics/test_dashboard.py)
    "examples/systemd",  # how to run reconciler as a service: unit files, no objects
]
KIND_WORDS = {"Job": "jobs", "Pool": "pools", "Node": "nodes", "Notifier": "notifiers", "Source": "sources"}


def declared(folder: Path) -> list[tuple[str, str]]:
    """(kind, name) of every document in the folder's *.yaml / *.yml, in file order."""
    found = []
    for path in sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml")):
        found += [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def ok(*args: str, store: str):
    result = cli(*args, store=store)
    assert result.code == 0, f"{args} -> exit {result.code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    assert "Traceback" not in result.stderr
    return result


def snapshot(store: str, kinds: set[str]) -> dict[tuple[str, str], dict]:
    """Every stored object of these kinds, as `get KIND -o json` prints it."""
    objects = {}
    for kind in kinds:
        for item in json.loads(ok("get", KIND_WORDS[kind], "-o", "json", store=store).stdout)["items"]:
            objects[(item["kind"], item["metadata"]["name"])] = item
    return objects


def test_every_example_folder_is_covered():
    present = sorted(f"examples/{p.name}" for p in (ROOT / "examples").iterdir() if p.is_dir())
    assert present == sorted(f for f in FOLDERS + NOT_MANIFESTS if f.startswith("examples/"))
    assert all((ROOT / folder / "README.md").is_file() for folder in NOT_MANIFESTS)
    for folder in FOLDERS:
        assert (ROOT / folder / "README.md").is_file(), f"{folder} has no README.md"
        assert declared(ROOT / folder), f"{folder} declares nothing"


@pytest.mark.parametrize("folder", FOLDERS)
def test_roundtrip(folder, store_url):
    path = ROOT / folder
    objects = declared(path)
    kinds = {kind for kind, _ in objects}

    applied = ok("apply", "-f", str(path), store=store_url)
    assert sorted(applied.stdout.splitlines()) == sorted(f"{k.lower()}.reconciler.dev/{n} created" for k, n in objects)
    assert applied.stderr == ""

    for kind in kinds:
        table = ok("get", KIND_WORDS[kind], store=store_url).stdout.splitlines()
        assert table[0].startswith("NAME")
        assert sorted(row.split()[0] for row in table[1:]) == sorted(n for k, n in objects if k == kind)
    for kind, name in objects:
        described = ok("describe", KIND_WORDS[kind], name, store=store_url).stdout
        assert described.splitlines()[0].split() == ["Name:", name]
        assert ["Kind:", kind] in [line.split() for line in described.splitlines()]
        assert f"{kind.lower()} created by apply" in described  # the creation event
        by_ref = ok("describe", f"{kind.lower()}/{name}", store=store_url).stdout  # KIND/NAME form
        assert by_ref.splitlines()[:2] == described.splitlines()[:2]
    first = snapshot(store_url, kinds)
    assert set(first) == set(objects)

    again = ok("apply", "-f", str(path), store=store_url)
    assert sorted(again.stdout.splitlines()) == sorted(f"{k.lower()}.reconciler.dev/{n} unchanged" for k, n in objects)
    second = snapshot(store_url, kinds)
    assert {key: o["metadata"]["resourceVersion"] for key, o in second.items()} == {
        key: o["metadata"]["resourceVersion"] for key, o in first.items()
    }
    assert second == first

    deleted = ok("delete", "-f", str(path), store=store_url)
    assert sorted(deleted.stdout.splitlines()) == sorted(f"{k.lower()}.reconciler.dev/{n} deleted" for k, n in objects)
    for kind in kinds:
        assert json.loads(ok("get", KIND_WORDS[kind], "-o", "json", store=store_url).stdout)["items"] == []
        listing = ok("get", KIND_WORDS[kind], store=store_url)
        assert listing.stdout == "" and "No resources found" in listing.stderr
    for kind, name in objects:
        assert cli("get", KIND_WORDS[kind], name, store=store_url).code == 3


def test_roundtrip_through_the_console_script(tmp_path):
    """The same first step through a real subprocess, as `make up` would start it."""
    url = f"sqlite:///{tmp_path / 'state' / 'state.db'}"
    result = run_cli("apply", "-f", str(ROOT / "examples" / "shards"), store=url)
    assert result.code == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        f"{k.lower()}.reconciler.dev/{n} created" for k, n in declared(ROOT / "examples" / "shards")
    )


def test_examples_and_manifests_share_one_store(sqlite_url):
    """Every folder can be applied to one store in turn: no job name clashes, and the
    objects two folders both declare (Pool global, Pool analysis) agree on their spec."""
    for folder in FOLDERS:
        ok("apply", "-f", str(ROOT / folder), store=sqlite_url)
    pools = {
        i["metadata"]["name"]: i for i in json.loads(ok("get", "pools", "-o", "json", store=sqlite_url).stdout)["items"]
    }
    assert pools["global"]["spec"]["slots"] == 4 and pools["analysis"]["spec"]["slots"] == 2
    assert pools["global"]["metadata"]["generation"] == 1 and pools["analysis"]["metadata"]["generation"] == 1
    jobs = json.loads(ok("get", "jobs", "-o", "json", store=sqlite_url).stdout)["items"]
    declared_jobs = [n for f in FOLDERS for k, n in declared(ROOT / f) if k == "Job"]
    assert len(declared_jobs) == len(set(declared_jobs)) == len(jobs)


# --- what the examples promise ---------------------------------------------------------------


@pytest.fixture
def applied_copy(tmp_path):
    """Apply a copy of an example folder to a fresh store; returns (folder, {name: job json})."""

    def apply(example: str):
        folder = tmp_path / Path(example).name
        shutil.copytree(ROOT / example, folder, ignore=shutil.ignore_patterns("work"))
        url = f"sqlite:///{tmp_path / 'state' / 'state.db'}"
        ok("apply", "-f", str(folder), store=url)
        jobs = json.loads(ok("get", "jobs", "-o", "json", store=url).stdout)["items"]
        pools = json.loads(ok("get", "pools", "-o", "json", store=url).stdout)["items"]
        return folder, {j["metadata"]["name"]: j for j in jobs}, {p["metadata"]["name"]: p["spec"] for p in pools}

    return apply


def test_shards_is_the_seed_pipeline(applied_copy):
    folder, jobs, pools = applied_copy("examples/shards")
    assert pools["analysis"]["slots"] == 2 and pools["global"]["slots"] == 4
    assert sorted(jobs) == ["analyze-1", "analyze-2", "analyze-3", "analyze-4", "prepare-data"]
    for n in range(1, 5):
        spec = jobs[f"analyze-{n}"]["spec"]
        assert jobs[f"analyze-{n}"]["metadata"]["labels"] == {"pipeline": "shards"}
        assert spec["dependsOn"] == [{"job": "prepare-data", "outcomes": ["Succeeded"]}]
        assert spec["pool"] == "analysis" and spec["slots"] == 1
        assert spec["retry"]["limit"] == 2 and spec["retry"]["onExitCodes"] == [1]
        assert spec["retry"]["backoff"]["delay"] == "1s"
        assert spec["workingDir"] == str(folder)  # relative to the manifest
    assert jobs["prepare-data"]["spec"]["dependsOn"] == []


def _argv(spec: dict) -> list[str]:
    return list(spec["command"]) if "command" in spec else ["/bin/sh", "-c", spec["shell"]]


def _start(spec: dict) -> subprocess.Popen:
    """One attempt, the way the agent starts it: argv or /bin/sh -c, stored workingDir, env merged."""
    return subprocess.Popen(
        _argv(spec),
        cwd=spec["workingDir"],
        env={**os.environ, **spec.get("env", {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(spec: dict, timeout: float = 20) -> subprocess.CompletedProcess:
    proc = _start(spec)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _levels(jobs: dict[str, dict]) -> list[list[str]]:
    """The jobs in dependency order, as groups whose members may run at the same time."""
    done: list[str] = []
    levels = []
    while len(done) < len(jobs):
        ready = sorted(
            n for n, j in jobs.items() if n not in done and all(d["job"] in done for d in j["spec"]["dependsOn"])
        )
        assert ready, "dependency cycle in an example"
        levels.append(ready)
        done += ready
    return levels


def _run_pipeline(jobs: dict[str, dict]) -> dict[str, list[subprocess.CompletedProcess]]:
    """Every job, level by level (a level's jobs concurrently), retried as its retry policy says."""
    attempts: dict[str, list[subprocess.CompletedProcess]] = {}
    for level in _levels(jobs):
        pending = list(level)
        while pending:
            started = {name: _start(jobs[name]["spec"]) for name in pending}
            pending = []
            for name, proc in started.items():
                out, err = proc.communicate(timeout=20)
                attempts.setdefault(name, []).append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
                retry = jobs[name]["spec"]["retry"]
                codes = retry["onExitCodes"]
                if (
                    proc.returncode != 0
                    and (not codes or proc.returncode in codes)
                    and len(attempts[name]) <= retry["limit"]
                ):
                    pending.append(name)
        for name in level:
            assert attempts[name][-1].returncode == 0, (name, attempts[name][-1].stdout, attempts[name][-1].stderr)
    return attempts


def test_shards_commands_run_and_one_shard_fails_once(applied_copy):
    folder, jobs, _ = applied_copy("examples/shards")
    attempts = _run_pipeline(jobs)
    assert {name: [a.returncode for a in runs] for name, runs in attempts.items()} == {
        "prepare-data": [0],
        "analyze-1": [0],
        "analyze-2": [0],
        "analyze-3": [1, 0],
        "analyze-4": [0],
    }
    results = [int((folder / "work" / f"result-{n}.txt").read_text()) for n in range(1, 5)]
    assert sum(results) == sum(range(1, 1001))
    # running the pipeline again starts from a fresh work folder: the flaky shard fails once again
    assert _run(jobs["prepare-data"]["spec"]).returncode == 0
    assert not (folder / "work" / "result-1.txt").exists()
    assert [_run(jobs["analyze-3"]["spec"]).returncode for _ in range(2)] == [1, 0]


def test_ci_commands_run(applied_copy):
    folder, jobs, pools = applied_copy("examples/ci")
    assert pools["ci"]["slots"] == 2
    assert {n for n, j in jobs.items() if j["spec"].get("pool") == "ci"} == {"test-1", "test-2", "test-3"}
    assert [d["job"] for d in jobs["build"]["spec"]["dependsOn"]] == ["test-1", "test-2", "test-3"]
    assert [d["job"] for d in jobs["publish"]["spec"]["dependsOn"]] == ["build"]
    assert {"command", "shell"} <= {k for j in jobs.values() for k in j["spec"]}
    attempts = _run_pipeline(jobs)
    assert all(len(runs) == 1 for runs in attempts.values())
    assert attempts["lint"][0].stdout.count(" ok") == 4  # every script was checked
    assert len(list((folder / "work" / "published").glob("app-*.tar"))) == 1


def test_retry_commands_fail_then_succeed(applied_copy):
    _folder, jobs, _ = applied_copy("examples/retry")
    backoff = jobs["flaky-exponential"]["spec"]["retry"]["backoff"]
    assert backoff["policy"] == "exponential" and backoff["factor"] == 2
    assert backoff["maxDelay"] == "1s" and backoff["jitter"] == "100ms"
    assert jobs["slow-then-fast"]["spec"]["runTimeout"] == "1s" and jobs["slow-then-fast"]["spec"]["retry"]["onTimeout"]
    assert _run(jobs["retry-reset"]["spec"]).returncode == 0
    assert [_run(jobs["flaky-exponential"]["spec"]).returncode for _ in range(3)] == [75, 75, 0]
    assert [_run(jobs["flaky-linear"]["spec"]).returncode for _ in range(3)] == [1, 1, 0]
    slow = jobs["slow-then-fast"]["spec"]
    with pytest.raises(subprocess.TimeoutExpired):  # attempt 1 hangs past its run timeout
        _run(slow, timeout=1.0)
    assert _run(slow).returncode == 0  # attempt 2 is quick


def test_service_example_is_a_service(applied_copy):
    folder, jobs, _ = applied_copy("examples/service")
    web = jobs["web"]["spec"]
    assert web["type"] == "service" and isinstance(web["port"], int)
    assert web["workingDir"] == str(folder / "public") and (folder / "public" / "index.html").is_file()
    assert "fetch-index" in jobs and jobs["fetch-index"]["spec"]["waitFor"]["conditions"][0]["probe"]


def test_the_github_workflow_runs_up_with_a_junit_report_and_publishes_it():
    """.github/workflows/examples-ci.yml is the CI example issue 10 asks for: a valid
    workflow whose steps install reconciler, run `up -f examples/ci --junit`, and publish
    the report even when a job failed (up then exits 1)."""
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "examples-ci.yml").read_text())
    assert set(workflow) >= {"name", True, "jobs"}  # YAML 1.1 reads the key `on` as True
    (job,) = workflow["jobs"].values()
    steps = job["steps"]
    runs = " ".join(step.get("run", "") for step in steps)
    assert "pip install ." in runs
    assert "reconciler up -f examples/ci" in runs and "--junit report.xml" in runs
    publish = next(step for step in steps if "junit-report" in step.get("uses", ""))
    assert publish["with"]["report_paths"] == "report.xml" and "cancelled()" in publish["if"]
