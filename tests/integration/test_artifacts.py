"""spec.artifact (API.md 1.1, "What the runtime does with the fields that touch the machine"):
a zip fetched once per sha256 into the cache, unpacked into a fresh folder per run which is
its working directory; a wrong checksum, a hostile or broken archive refused with reason
ArtifactInvalid before the command starts; an unreachable URL retried per spec.retry; the
loop going on while a download stalls; a controller killed mid-fetch leaving nothing
half-visible. Real zips, a real HTTP server on loopback, real controllers and runs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reconciler.api.job import JobSpec
from reconciler.controller.nodes import local_node_name
from tests.artifacts import Member, bomb, free_port, write_zip
from tests.helpers import wait_until

from .conftest import docs, job_yaml

SCRIPT = Member.script("run.sh", '#!/bin/sh\necho "ran in $(pwd)"\ncat data/greeting.txt\n')
GREETING = Member("data/greeting.txt", "hello from the artifact\n")


def node_yaml(slots: int) -> str:
    return (
        f"apiVersion: reconciler.dev/v1alpha1\nkind: Node\nmetadata:\n  name: {local_node_name()}\n"
        f"spec:\n  capacity: {{slots: {slots}}}\n"
    )


def artifact(url: str, sha: str | None = None) -> str:
    return f"artifact: {{url: '{url}'" + (f", sha256: '{sha}'" if sha else "") + "}"


def marked(marker) -> str:
    """A command that leaves `marker` if it ever runs."""
    return f"command: [touch, '{marker}']"


def cache(env) -> list[str]:
    folder = env.store.state_dir / "artifacts" / "sha256"
    return sorted(os.listdir(folder)) if folder.exists() else []


def outcome(job: dict) -> tuple[str, str]:
    return job["status"]["outcome"], job["status"]["reason"]


def test_a_job_runs_a_script_from_a_file_zip_and_from_an_http_zip(env, http_server):
    sha = write_zip(env.root / "app.zip", SCRIPT, GREETING, Member("tools/where.sh", "pwd\n"))
    served = http_server.put("/app.zip", (env.root / "app.zip").read_bytes())
    manifest = env.write(
        "jobs.yaml",
        docs(
            job_yaml("from-file", f"command: [./run.sh]\n{artifact(f'file://{env.root}/app.zip', sha)}"),
            job_yaml("from-http", f"command: [./run.sh]\n{artifact(served)}"),
            # a relative workingDir is relative to the unpacked folder, and stays so
            job_yaml("relative", f"command: [sh, where.sh]\nworkingDir: ./tools\n{artifact(served, sha)}"),
        ),
    )
    result = env.up(manifest)
    assert result.code == 0, result.stderr + env.controller_log()
    jobs = env.jobs()
    assert jobs["relative"]["spec"]["workingDir"] == "tools"
    for name in ("from-file", "from-http"):
        work = os.path.realpath(env.run_dir(name, 1)) + "/work"
        assert (env.run_dir(name, 1) / "stdout").read_text() == f"ran in {work}\nhello from the artifact\n"
    relative = os.path.realpath(env.run_dir("relative", 1)) + "/work/tools"
    assert (env.run_dir("relative", 1) / "stdout").read_text() == f"{relative}\n"
    # the unpacked folders went with their runs; the logs stay
    for name in jobs:
        assert sorted(os.listdir(env.run_dir(name, 1))) == ["exit", "stderr", "stdout"], name
    assert cache(env) == [f"{sha}.zip"]


def test_a_wrong_sha256_fails_the_run_before_its_command_starts(env):
    write_zip(env.root / "app.zip", SCRIPT)
    marker = env.root / "ran"
    retry = "retry: {limit: 2, backoff: {delay: 100ms}}"  # not retryable: one run only
    manifest = env.write(
        "bad.yaml", job_yaml("bad", f"{marked(marker)}\n{retry}\n{artifact(f'file://{env.root}/app.zip', 'a' * 64)}")
    )
    assert env.up(manifest).code == 1
    job = env.get_job("bad")
    assert outcome(job) == ("Failed", "ArtifactInvalid")
    assert "sha256 mismatch" in job["status"]["message"] and "the spec says aaaa" in job["status"]["message"]
    [run] = job["status"]["runs"]
    assert (run["outcome"], run["reason"], run.get("pid"), run["exitCode"]) == (
        "StartFailed",
        "ArtifactInvalid",
        None,
        None,
    )
    assert not marker.exists()
    logs = env.cli("logs", "job/bad")
    assert logs.code == 1 and "never started (ArtifactInvalid)" in logs.stderr
    assert cache(env) == []


def test_hostile_and_broken_archives_are_refused_and_write_nothing_outside(env):
    outside = env.root / "outside"
    outside.mkdir()
    archives = {
        "dot-dot": (Member("../../../../outside/evil", "x"), "would land outside the folder"),
        "absolute": (Member(f"{outside}/evil", "x"), "is an absolute path"),
        "link-out": (Member.link("out", "../../../../outside"), "pointing outside the folder"),
        "through-link": (Member.link("out", "."), Member("out/evil", "x"), "below the symbolic link 'out'"),
        "device": (Member("tty", mode=0o020644), "is a character device"),
        "not-a-zip": None,
        "bomb": None,
    }
    jobs = []
    for name, spec in archives.items():
        path = env.root / f"{name}.zip"
        if spec is not None:
            write_zip(path, *spec[:-1])
        else:
            path.write_bytes(bomb() if name == "bomb" else b"#!/bin/sh\necho not a zip\n")
        jobs.append(job_yaml(name, f"{marked(env.root / f'ran-{name}')}\n{artifact(f'file://{path}')}"))
    assert env.up(env.write("hostile.yaml", docs(*jobs))).code == 1
    expected = {name: spec[-1] if spec else "" for name, spec in archives.items()}
    expected |= {"not-a-zip": "not a zip file", "bomb": "compression ratio of"}
    for name, job in env.jobs().items():
        assert outcome(job) == ("Failed", "ArtifactInvalid"), (name, job["status"])
        assert expected[name] in job["status"]["message"], (name, job["status"]["message"])
        assert sorted(os.listdir(env.run_dir(name, 1))) == [], f"{name}: nothing unpacked is left"
    assert os.listdir(outside) == []
    assert not any((env.root / f"ran-{name}").exists() for name in archives), "no command ran"
    state = env.store.state_dir
    assert list(state.rglob("*evil*")) == [] and not (state.parent / "evil").exists()


def test_an_unreachable_url_is_retried_per_the_retry_limit_then_fails_saying_so(env):
    url = f"http://127.0.0.1:{free_port()}/app.zip"
    retry = "retry: {limit: 2, onExitCodes: [3], backoff: {policy: constant, delay: 100ms}}"
    manifest = env.write("down.yaml", job_yaml("down", f"command: ['true']\n{retry}\n{artifact(url)}"))
    assert env.up(manifest).code == 1
    status = env.get_job("down")["status"]
    # its retries used up: BackoffLimitExceeded, each run saying ArtifactInvalid
    assert (status["outcome"], status["reason"]) == ("Failed", "BackoffLimitExceeded")
    assert f"{url} is unreachable" in status["message"] and status["message"].endswith("(attempt 3 of 3)")
    runs = status["runs"]
    assert [(r["number"], r["outcome"], r["reason"]) for r in runs] == [
        (n, "StartFailed", "ArtifactInvalid") for n in (1, 2, 3)
    ]


def test_two_jobs_with_the_same_artifact_fetch_it_once(env, http_server):
    app = write_zip(env.root / "app.zip", SCRIPT, GREETING)
    other = write_zip(env.root / "other.zip", Member.script("run.sh", "#!/bin/sh\necho other\n"))
    url = http_server.put("/app.zip", (env.root / "app.zip").read_bytes())
    mirror = http_server.put("/mirror/app.zip", (env.root / "app.zip").read_bytes())
    elsewhere = http_server.put("/other.zip", (env.root / "other.zip").read_bytes())
    manifest = env.write(
        "same.yaml",
        docs(
            node_yaml(4),
            *(job_yaml(n, f"command: [./run.sh]\n{artifact(url, app)}") for n in ("one", "two", "three")),
            job_yaml("mirrored", f"command: [./run.sh]\n{artifact(mirror, app)}\ndependsOn: [one]"),
            job_yaml("other", f"command: [./run.sh]\n{artifact(elsewhere, other)}"),
        ),
    )
    assert env.up(manifest).code == 0
    assert http_server.gets == {"/app.zip": 1, "/other.zip": 1}  # the mirror's copy was in the cache already
    assert cache(env) == sorted([f"{app}.zip", f"{other}.zip"])


def test_the_loop_goes_on_while_a_download_stalls(env, http_server):
    sha = write_zip(env.root / "app.zip", SCRIPT, GREETING)
    url = http_server.put("/app.zip", (env.root / "app.zip").read_bytes())
    http_server.stall.set()
    env.apply("node.yaml", node_yaml(4))
    env.controller()
    env.apply("slow.yaml", job_yaml("slow", f"command: [./run.sh]\n{artifact(url, sha)}"))
    wait_until(http_server.stalled.is_set, timeout=30, message="download under way")
    env.apply("quick.yaml", docs(job_yaml("quick-1", "command: ['true']"), job_yaml("quick-2", "command: ['true']")))
    env.wait_completed("quick-1", "quick-2")
    status = env.status("slow")
    assert status["phase"] == "Starting" and status["admission"]["slots"] == 1, status
    http_server.release()
    env.wait_completed("slow")
    assert outcome(env.get_job("slow")) == ("Succeeded", "Succeeded")
    events = env.ok("get", "events").stdout
    assert "FetchingArtifact" in events and f"fetching {url}" in events


def test_the_fetching_artifact_event_shows_no_password(env, http_server):
    """Events are stored and shown to every reader: the artifact's URL in them is masked."""
    sha = write_zip(env.root / "app.zip", SCRIPT, GREETING)
    url = http_server.put("/app.zip", (env.root / "app.zip").read_bytes())
    secret_url = url.replace("http://", "http://bob:s3cr3t-pw@")
    manifest = env.write(
        "app.yaml", docs(node_yaml(1), job_yaml("app", f"command: [./run.sh]\n{artifact(secret_url, sha)}"))
    )
    assert env.up(manifest).code == 0
    events = env.ok("get", "events").stdout
    assert "FetchingArtifact" in events and f"fetching {url.replace('http://', 'http://***@')}" in events, events
    assert "s3cr3t-pw" not in events


def test_a_controller_killed_mid_fetch_leaves_nothing_half_visible(env, http_server):
    sha = write_zip(env.root / "app.zip", SCRIPT, GREETING)
    url = http_server.put("/app.zip", (env.root / "app.zip").read_bytes())
    http_server.stall.set()
    first = env.controller()
    env.apply("slow.yaml", job_yaml("slow", f"command: [./run.sh]\n{artifact(url, sha)}"))
    wait_until(http_server.stalled.is_set, timeout=30, message="download under way")
    first.proc.kill()
    first.proc.wait(30)
    tmp = env.store.state_dir / "artifacts" / "tmp"
    assert cache(env) == [] and [p.suffix for p in tmp.iterdir()] == [".part"]
    assert not (env.run_dir("slow", 1) / "work").exists()
    http_server.stall.clear()
    http_server.release()
    env.controller()
    env.wait_completed("slow")
    job = env.get_job("slow")
    assert outcome(job) == ("Succeeded", "Succeeded") and len(job["status"]["runs"]) == 1
    assert cache(env) == [f"{sha}.zip"] and list(tmp.iterdir()) == []
    assert http_server.gets["/app.zip"] == 2


@pytest.mark.parametrize(
    ("working_dir", "problem"),
    [
        pytest.param("/srv/app", "an absolute path is refused", id="absolute"),
        pytest.param("~/app", "an absolute path is refused", id="home"),
        pytest.param("sub/../../up", "leaves the unpacked folder", id="leaves"),
    ],
)
def test_a_working_dir_outside_the_unpacked_folder_is_refused_at_apply(env, working_dir, problem):
    path = env.write(
        "wd.yaml", job_yaml("wd", f"command: ['true']\nworkingDir: '{working_dir}'\n{artifact('file:///a.zip')}")
    )
    result = env.cli("apply", "-f", str(path))
    assert result.code == 2 and problem in result.stderr and "wd.yaml:" in result.stderr, result.stderr


def test_a_wait_probe_of_an_artifact_job_runs_on_the_host():
    spec = JobSpec.model_validate({"command": ["true"], "workingDir": "sub", "artifact": {"url": "file:///a.zip"}})
    assert spec.host_dir is None  # "sub" exists only in a run's unpacked folder
    plain = JobSpec.model_validate({"command": ["true"], "workingDir": "/srv"})
    assert plain.host_dir == "/srv"


def test_each_run_of_a_service_gets_a_fresh_folder(env):
    mark = env.root / "cwd"
    body = f'#!/bin/sh\npwd > "{mark}.$RECONCILER_RUN"\nif [ "$RECONCILER_RUN" = 1 ]; then exit 1; fi\nexec sleep 60\n'
    sha = write_zip(env.root / "svc.zip", Member.script("run.sh", body))
    env.controller()
    env.apply(
        "svc.yaml",
        job_yaml(
            "svc",
            "type: service\nrestart: {delay: 100ms}\nstopGracePeriod: 2s\ncommand: [./run.sh]\n"
            + artifact(f"file://{env.root}/svc.zip", sha),
        ),
    )
    env.wait_status("svc", lambda s: len(s.get("runs", [])) == 2 and s["phase"] == "Running", what="second run")
    wait_until(lambda: os.path.exists(f"{mark}.2"), timeout=30, message="second run wrote where it ran")
    for number in (1, 2):
        assert Path(f"{mark}.{number}").read_text().strip() == os.path.realpath(env.run_dir("svc", number)) + "/work"
    wait_until(lambda: not (env.run_dir("svc", 1) / "work").exists(), timeout=30, message="first folder removed")
    assert (env.run_dir("svc", 2) / "work" / "run.sh").exists()
    env.ok("cancel", "job/svc")
    env.wait_completed("svc")
    wait_until(lambda: not (env.run_dir("svc", 2) / "work").exists(), timeout=30, message="second folder removed")


def test_a_service_whose_artifact_cannot_be_fetched_restarts_in_place_keeping_its_port(env):
    """Like after any exit: its admission (slots, node, port) is kept and the restart counted;
    it is not sent back to the queue, where another service could take its port."""
    url, port = f"http://127.0.0.1:{free_port()}/app.zip", free_port()
    env.controller()
    spec = f"type: service\nport: {port}\nrestart: {{delay: 200ms, maxDelay: 400ms}}\ncommand: ['true']\n"
    env.apply("cf.yaml", job_yaml("cf", spec + artifact(url)))
    looping = env.wait_status("cf", lambda s: s.get("restarts", 0) >= 2, what="two restarts")
    assert (looping["phase"], looping["reason"]) == ("Running", "CrashLoop"), looping
    assert "admission" in looping, "its slots are held between runs"
    assert {(r["outcome"], r["reason"]) for r in looping["runs"]} == {("StartFailed", "ArtifactInvalid")}
    env.apply("other.yaml", job_yaml("other", f"type: service\nport: {port}\ncommand: [sleep, '60']\n"))
    held = env.wait_status("other", lambda s: f"port {port}" in (s.get("message") or ""), what="port taken")
    assert held["phase"] == "Queued", held
    still = env.get_job("cf")["status"]  # between restarts, or starting the next: its admission kept
    assert still["phase"] in ("Running", "Starting") and "admission" in still, still
