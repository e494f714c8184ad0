"""artifacts.py: the cache (fetched once per sha256, across threads and processes, crash-safe),
what is retryable and what is not, and `Artifacts` preparing runs' folders beside the loop.
A real HTTP server on loopback (tests/artifacts.py), real files and processes; conditions
awaited with deadlines."""

from __future__ import annotations

import hashlib
import os
import signal
import stat
import subprocess
import sys
import threading

import psutil
import pytest

from reconciler.agent.artifactcache import Cache, FetchLimits
from reconciler.agent.artifacts import WORK, Artifacts
from reconciler.agent.unzip import ArtifactError
from tests.artifacts import Member, free_port, zip_bytes
from tests.helpers import wait_until

APP = zip_bytes(Member.script("run.sh", "#!/bin/sh\necho hi\n"), Member("data/x.txt", "x\n"))
APP_SHA = hashlib.sha256(APP).hexdigest()
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def listing(folder) -> list[str]:
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_fetched_once_per_sha256_into_private_folders(tmp_path, http_server):
    url = http_server.put("/app.zip", APP)
    cache = Cache(tmp_path / "artifacts")
    first = cache.get(url, APP_SHA)
    assert cache.get(url, APP_SHA) == first == tmp_path / "artifacts" / "sha256" / f"{APP_SHA}.zip"
    assert first.read_bytes() == APP and http_server.gets["/app.zip"] == 1
    # the same content named by another URL is not fetched: one copy per sha256
    assert cache.get(http_server.put("/mirror.zip", APP), APP_SHA) == first
    assert http_server.gets["/mirror.zip"] == 0
    assert stat.S_IMODE(first.stat().st_mode) == 0o600
    for sub in ("", "sha256", "url", "locks", "tmp"):
        assert stat.S_IMODE((tmp_path / "artifacts" / sub).stat().st_mode) == 0o700, sub
    assert listing(tmp_path / "artifacts" / "tmp") == []


def test_a_wrong_sha256_is_refused_and_nothing_is_kept(tmp_path, http_server):
    url = http_server.put("/app.zip", APP)
    cache = Cache(tmp_path / "artifacts")
    with pytest.raises(ArtifactError, match=f"sha256 mismatch: {url} has {APP_SHA}, the spec says 0000") as caught:
        cache.get(url, "0" * 64)
    assert (caught.value.reason, caught.value.retryable) == ("ArtifactInvalid", False)
    assert listing(tmp_path / "artifacts" / "sha256") == listing(tmp_path / "artifacts" / "tmp") == []


@pytest.mark.parametrize(
    ("where", "message"),
    [
        pytest.param("refused", r"is unreachable: .*(Connection refused|connect)", id="nothing-listens"),
        pytest.param("/missing.zip", "is unreachable: the server answered 404 Not Found", id="404"),
        pytest.param("/broken.zip", "is unreachable: the server answered 500 Internal Server Error", id="500"),
        pytest.param("file", "is unreachable: No such file or directory", id="missing-file"),
    ],
)
def test_what_cannot_be_reached_is_retryable(tmp_path, http_server, where, message):
    http_server.put("/broken.zip", b"", status=500)
    url = {
        "refused": f"http://127.0.0.1:{free_port()}/app.zip",
        "file": f"file://{tmp_path}/nowhere/app.zip",
    }.get(where, http_server.url(where))
    with pytest.raises(ArtifactError, match=message) as caught:
        Cache(tmp_path / "artifacts").get(url, APP_SHA)
    assert caught.value.retryable and caught.value.reason == "ArtifactInvalid"
    assert listing(tmp_path / "artifacts" / "tmp") == []


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_local_path_that_is_not_a_file_is_refused_saying_so(tmp_path, kind):
    """Not retried (it will not become a zip), and said in words, not as an errno and a
    file descriptor."""
    path = tmp_path / "art"
    path.mkdir() if kind == "folder" else os.mkfifo(path)
    with pytest.raises(ArtifactError, match=r"art is not a regular file$") as caught:
        Cache(tmp_path / "artifacts").get(path.as_uri(), APP_SHA)
    assert not caught.value.retryable and caught.value.reason == "ArtifactInvalid"
    assert listing(tmp_path / "artifacts" / "tmp") == []


def test_a_server_that_stops_sending_times_out_as_unreachable(tmp_path, http_server):
    url = http_server.put("/app.zip", APP)
    http_server.stall.set()
    with pytest.raises(ArtifactError, match=r"is unreachable: .*timed out") as caught:
        Cache(tmp_path / "artifacts", FetchLimits(read=0.5)).get(url, APP_SHA)
    assert caught.value.retryable
    assert listing(tmp_path / "artifacts" / "tmp") == listing(tmp_path / "artifacts" / "sha256") == []


@pytest.mark.parametrize(
    "how",
    [
        pytest.param({"length": True}, id="content-length"),
        pytest.param({"length": False}, id="counted-as-received"),
        pytest.param("file", id="file"),
    ],
)
def test_a_download_past_the_size_limit_is_refused(tmp_path, http_server, how):
    if how == "file":
        (tmp_path / "big.zip").write_bytes(APP)
        url = f"file://{tmp_path}/big.zip"
    else:
        url = http_server.put("/big.zip", APP, **how)
    said = "is more than 100 bytes" if how == {"length": False} else f"is {len(APP)} bytes, more than 100"
    with pytest.raises(ArtifactError, match=f"{said}, the limit for an artifact") as caught:
        Cache(tmp_path / "artifacts", FetchLimits(size=100)).get(url, None)
    assert not caught.value.retryable
    assert listing(tmp_path / "artifacts" / "tmp") == []


def test_an_encoded_answer_is_refused(tmp_path, http_server):
    url = http_server.put("/app.zip", APP, encoding="gzip")
    with pytest.raises(ArtifactError, match="gzip-encoded") as caught:
        Cache(tmp_path / "artifacts").get(url, None)
    assert not caught.value.retryable


def test_http_without_sha256_is_revalidated_on_every_fetch(tmp_path, http_server):
    cache = Cache(tmp_path / "artifacts")
    tagged = http_server.put("/tagged.zip", APP, etag='"v1"')
    first = cache.get(tagged, None)
    assert cache.get(tagged, None) == first
    assert (http_server.gets["/tagged.zip"], http_server.conditional["/tagged.zip"]) == (2, 1)  # the second: a 304
    newer = zip_bytes(Member("v2.txt", "2"))
    http_server.put("/tagged.zip", newer, etag='"v2"')
    assert cache.get(tagged, None).read_bytes() == newer
    # a server without validators: fetched every time
    plain = http_server.put("/plain.zip", APP)
    assert cache.get(plain, None) == cache.get(plain, None) == first
    assert http_server.gets["/plain.zip"] == 2
    assert sorted(listing(tmp_path / "artifacts" / "sha256")) == sorted(
        [f"{APP_SHA}.zip", f"{hashlib.sha256(newer).hexdigest()}.zip"]
    )


def test_a_local_file_without_sha256_is_read_again_when_its_size_or_mtime_changes(tmp_path):
    source = tmp_path / "app.zip"
    source.write_bytes(APP)
    url = f"file://{source}"
    cache = Cache(tmp_path / "artifacts")
    first = cache.get(url, None)
    assert first.read_bytes() == APP and cache.get(url, None) == first
    newer = zip_bytes(Member("v2.txt", "version 2"))
    source.write_bytes(newer)
    second = cache.get(url, None)
    assert second.read_bytes() == newer and second != first
    # the rule is size, mtime and inode: the same size written in place with its old mtime is not seen
    facts = source.stat()
    same_size = newer.replace(b"version 2", b"version 3")
    source.write_bytes(same_size)
    os.utime(source, ns=(facts.st_atime_ns, facts.st_mtime_ns))
    assert cache.get(url, None) == second


FETCH = """
import sys
from pathlib import Path
from reconciler.agent.artifactcache import Cache
print(Cache(Path(sys.argv[1])).get(sys.argv[2], sys.argv[3]))
"""


def fetcher(root, url: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", FETCH, str(root), url, APP_SHA], stdout=subprocess.PIPE, text=True, cwd=REPO
    )


def holds_open(proc: subprocess.Popen[str], path) -> bool:
    try:
        return any(f.path == str(path) for f in psutil.Process(proc.pid).open_files())
    except psutil.NoSuchProcess:
        return False


def test_two_processes_fetch_the_same_artifact_once(tmp_path, http_server):
    url = http_server.put("/app.zip", APP)
    root = tmp_path / "artifacts"
    http_server.stall.set()  # the first download hangs half way until released
    procs = [fetcher(root, url), fetcher(root, url)]
    lock = root / "locks" / f"sha256-{APP_SHA}.lock"
    wait_until(http_server.stalled.is_set, timeout=30, message="first download under way")
    wait_until(lambda: all(holds_open(p, lock) for p in procs), timeout=30, message="both at the entry's lock")
    http_server.release()
    outs = [p.communicate(timeout=60)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outs == [str(root / "sha256" / f"{APP_SHA}.zip")] * 2
    assert http_server.gets["/app.zip"] == 1


def test_a_fetch_killed_half_way_leaves_a_temporary_file_the_next_one_removes(tmp_path, http_server):
    url = http_server.put("/app.zip", APP)
    root = tmp_path / "artifacts"
    http_server.stall.set()
    proc = fetcher(root, url)
    wait_until(http_server.stalled.is_set, timeout=30, message="download under way")
    wait_until(lambda: any((root / "tmp").glob("*.part")), timeout=30, message="a temporary file")
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert listing(root / "sha256") == [], "nothing half-visible"
    assert [p.name.split(".")[0] for p in (root / "tmp").iterdir()] == [f"sha256-{APP_SHA}"]
    http_server.stall.clear()
    assert Cache(root).get(url, APP_SHA).read_bytes() == APP
    assert listing(root / "tmp") == []


# -- Artifacts: runs' folders prepared beside the loop -------------------------------------
class Wakes:
    def __init__(self) -> None:
        self.names: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, job: str) -> None:
        with self._lock:
            self.names.append(job)

    def count(self, job: str) -> int:
        with self._lock:
            return self.names.count(job)


@pytest.fixture
def prepared(tmp_path):
    wakes = Wakes()
    artifacts = Artifacts(tmp_path / "state", wakes)
    yield artifacts, wakes
    artifacts.close()


def test_a_run_folder_is_prepared_in_the_background_and_the_job_woken(tmp_path, http_server, prepared):
    artifacts, wakes = prepared
    url = http_server.put("/app.zip", APP)
    run_dir = tmp_path / "state" / "runs" / "a.uid.1"
    (run_dir / ".work-crashed").mkdir(parents=True)  # an unpacking a crash interrupted
    (run_dir / WORK).mkdir()  # and a folder a crash left before the spawn
    (run_dir / WORK / "stale").touch()
    assert artifacts.prepare("a", run_dir, url, APP_SHA).state == "started"
    assert artifacts.prepare("a", run_dir, url, APP_SHA).state in ("pending", "ready")
    wait_until(lambda: wakes.count("a") == 1, timeout=30, message="woken")
    assert artifacts.prepare("a", run_dir, url, APP_SHA).state == "ready"
    assert listing(run_dir) == [WORK] and listing(run_dir / WORK) == ["data", "run.sh"]
    artifacts.discard(run_dir)  # the run ended: its folder goes
    wait_until(lambda: listing(run_dir) == [], timeout=30, message="folder removed")


def test_concurrent_runs_share_one_fetch(tmp_path, http_server, prepared):
    artifacts, wakes = prepared
    url = http_server.put("/app.zip", APP)
    http_server.stall.set()
    runs = {job: tmp_path / "state" / "runs" / f"{job}.uid.1" for job in ("a", "b", "c")}
    assert artifacts.prepare("a", runs["a"], url, None).state == "started"
    wait_until(http_server.stalled.is_set, timeout=30, message="download under way")
    assert artifacts.prepare("b", runs["b"], url, None).state == "started"
    assert artifacts.prepare("c", runs["c"], url, None).state == "started"
    artifacts.discard(runs["c"])  # c will never start: it is not unpacked and not woken
    http_server.release()
    wait_until(lambda: wakes.count("a") == wakes.count("b") == 1, timeout=30, message="a and b woken")
    assert http_server.gets["/app.zip"] == 1
    assert [artifacts.prepare(j, runs[j], url, None).state for j in ("a", "b")] == ["ready", "ready"]
    assert wakes.count("c") == 0 and not (runs["c"] / WORK).exists()


@pytest.mark.parametrize(
    ("data", "sha", "message"),
    [
        pytest.param(APP, "0" * 64, "sha256 mismatch", id="checksum"),
        pytest.param(b"not a zip", None, "not a zip file", id="not-a-zip"),
        pytest.param(zip_bytes(Member("../evil", "x")), None, "would land outside the folder", id="zip-slip"),
    ],
)
def test_a_failed_preparation_is_answered_once(tmp_path, http_server, prepared, data, sha, message):
    artifacts, wakes = prepared
    url = http_server.put("/app.zip", data)
    run_dir = tmp_path / "state" / "runs" / "a.uid.1"
    assert artifacts.prepare("a", run_dir, url, sha).state == "started"
    wait_until(lambda: wakes.count("a") == 1, timeout=30, message="woken")
    failed = artifacts.prepare("a", run_dir, url, sha)
    assert (failed.state, failed.reason, failed.retryable) == ("failed", "ArtifactInvalid", False)
    assert message in failed.message
    assert listing(run_dir) == [] and not (tmp_path / "state" / "runs" / "evil").exists()


def test_a_run_folder_discarded_then_prepared_again_is_fresh_and_whole(tmp_path, http_server, prepared):
    """A drained admission comes back with its run number: the removal of the first folder
    and the second unpacking into the same place never overlap."""
    artifacts, wakes = prepared
    url = http_server.put("/app.zip", APP)
    run_dir = tmp_path / "state" / "runs" / "a.uid.1"
    assert artifacts.prepare("a", run_dir, url, APP_SHA).state == "started"
    wait_until(lambda: wakes.count("a") == 1, timeout=30, message="first folder ready")
    (run_dir / WORK / "written-by-the-first").touch()
    artifacts.discard(run_dir)
    assert artifacts.prepare("a", run_dir, url, APP_SHA).state == "started"
    wait_until(lambda: wakes.count("a") == 2, timeout=30, message="second folder ready")
    assert artifacts.prepare("a", run_dir, url, APP_SHA).state == "ready"
    assert listing(run_dir) == [WORK] and listing(run_dir / WORK) == ["data", "run.sh"]
