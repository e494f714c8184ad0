"""`controller --watch DIR` applies and prunes a folder as it changes; `get -w` follows changes."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

from tests.helpers import run_cli, wait_until


def _job(name: str) -> str:
    return f"apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {{name: {name}}}\nspec: {{command: ['true']}}\n"


def _names(store: str) -> set[str]:
    result = run_cli("get", "jobs", "-o", "name", store=store)
    return {line.split("/", 1)[1] for line in result.stdout.split()}


def _start(args: list[str], store: str, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "reconciler", *args],
        env={**os.environ, "RECONCILER_STORE": store},
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> tuple[str, str]:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()


def test_controller_watch_applies_and_prunes_the_folder(sqlite_url, tmp_path):
    """...and prunes only what it applied: a job `apply -f` made from elsewhere in the same
    store stays (it was deleted at the watch's start and at every change)."""
    folder = tmp_path / "gitops"
    folder.mkdir()
    (folder / "a.yaml").write_text(_job("alpha"))
    (tmp_path / "other.yaml").write_text(_job("elsewhere"))
    assert run_cli("apply", "-f", str(tmp_path / "other.yaml"), store=sqlite_url).code == 0
    log = tmp_path / "controller.log"
    controller = _start(["controller", "--watch", str(folder)], sqlite_url, stderr=log.open("w"))
    try:
        wait_until(lambda: _names(sqlite_url) == {"alpha", "elsewhere"}, timeout=30, message="alpha applied at start")
        (folder / "b.yaml").write_text(_job("beta"))
        wait_until(
            lambda: _names(sqlite_url) == {"alpha", "beta", "elsewhere"}, timeout=30, message="beta applied on change"
        )
        (folder / "a.yaml").unlink()
        wait_until(lambda: _names(sqlite_url) == {"beta", "elsewhere"}, timeout=30, message="alpha pruned")
        # a bad file is reported with its line and field, and the folder stores nothing
        (folder / "c.yaml").write_text(_job("gamma").replace("spec: {command: ['true']}", "spec:\n  comand: ['true']"))
        wait_until(
            lambda: "c.yaml:5: spec.comand: unknown field" in log.read_text(), timeout=30, message="error logged"
        )
        assert _names(sqlite_url) == {"beta", "elsewhere"}
        (folder / "c.yaml").write_text(_job("gamma"))
        wait_until(
            lambda: _names(sqlite_url) == {"beta", "gamma", "elsewhere"}, timeout=30, message="gamma applied once fixed"
        )
    finally:
        _stop(controller)
    assert "watch: job.reconciler.dev/alpha pruned" in log.read_text()


def test_a_change_refused_while_a_job_runs_is_applied_once_it_ends(sqlite_url, tmp_path):
    """A running job's spec cannot change (a conflict): the folder wins once the run is over,
    without another change to the folder (as Argo CD and Flux resync)."""
    folder = tmp_path / "gitops"
    folder.mkdir()
    go = tmp_path / "go"
    held = (
        "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: held}\nspec:\n"
        f"  shell: \"while [ ! -e '{go}' ]; do sleep 0.05; done\"\n"
    )
    (folder / "held.yaml").write_text(held)
    log = tmp_path / "controller.log"
    controller = _start(["controller", "--watch", str(folder)], sqlite_url, stderr=log.open("w"))
    try:
        wait_until(lambda: _state(sqlite_url, "held")[0] == "Running", timeout=30, message="held running")
        (folder / "held.yaml").write_text(held.replace("done", "done; echo second"))
        wait_until(lambda: "its spec cannot change" in log.read_text(), timeout=30, message="the conflict said")
        go.touch()
        wait_until(lambda: _state(sqlite_url, "held") == ("Succeeded", 2), timeout=60, message="the change applied")
        assert log.read_text().count("its spec cannot change") == 1  # said once, not at every retry
    finally:
        _stop(controller)


def _state(store: str, name: str) -> tuple[str | None, int | None]:
    """(what `get` shows, revision) of a job, or (None, None) while it does not exist."""
    import json

    result = run_cli("get", "job", name, "-o", "json", store=store)
    if result.code != 0:
        return None, None
    status = json.loads(result.stdout).get("status") or {}
    return status.get("outcome") or status.get("phase"), status.get("revision")


def test_a_watched_folder_converges_as_it_changes(sqlite_url, tmp_path):
    """The folder's jobs run, not only get stored: the watcher's writes went through the
    controller's own store handle and its change feed skipped them as its own, so they
    stayed Waiting. Added, changed and removed files are followed while it runs, and a
    folder that empties by accident prunes nothing."""
    folder = tmp_path / "gitops"
    folder.mkdir()
    (folder / "a.yaml").write_text(_job("alpha"))
    log = tmp_path / "controller.log"
    controller = _start(["controller", "--watch", str(folder)], sqlite_url, stderr=log.open("w"))
    try:
        wait_until(lambda: _state(sqlite_url, "alpha") == ("Succeeded", 1), timeout=30, message="alpha ran")
        (folder / "b.yaml").write_text(_job("beta"))
        wait_until(lambda: _state(sqlite_url, "beta") == ("Succeeded", 1), timeout=30, message="beta ran")
        (folder / "a.yaml").write_text(_job("alpha").replace("['true']", "[sh, -c, 'exit 0']"))
        wait_until(lambda: _state(sqlite_url, "alpha") == ("Succeeded", 2), timeout=30, message="alpha ran again")
        (folder / "b.yaml").unlink()
        wait_until(lambda: _state(sqlite_url, "beta") == (None, None), timeout=30, message="beta pruned")
        (folder / "a.yaml").unlink()  # the folder is empty now: refused, nothing pruned
        wait_until(lambda: "no objects passed to apply" in log.read_text(), timeout=30, message="refusal logged")
        assert _state(sqlite_url, "alpha") == ("Succeeded", 2)
    finally:
        _stop(controller)


def _lines(proc: subprocess.Popen) -> queue.Queue[str]:
    """The process's stdout lines as they come ('' at its end), read by a thread so that a
    test can wait for the next one with a deadline."""
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    return lines


def test_get_watch_prints_a_row_when_a_job_changes(sqlite_url, tmp_path):
    (tmp_path / "j.yaml").write_text(_job("watched"))
    assert run_cli("apply", "-f", str(tmp_path / "j.yaml"), store=sqlite_url).code == 0
    follower = _start(["get", "jobs", "-w"], sqlite_url)
    try:
        lines = _lines(follower)
        first = lines.get(timeout=30)  # the table header
        assert first.split()[:2] == ["NAME", "STATUS"]
        assert lines.get(timeout=30).split()[:2] == ["watched", "Waiting"]
        # `other` runs after `watched`, so the controller of `run --wait` runs `watched` to its end
        assert (
            run_cli(
                "run", "--wait", "--name", "other", "--after-success", "watched", "--", "true", store=sqlite_url
            ).code
            == 0
        )
        states = []
        while "Succeeded" not in states:
            line = lines.get(timeout=30)
            assert line, "get -w ended early"
            if line.split()[0] == "watched":
                states.append(line.split()[1])
    finally:
        _stop(follower)
    assert states[-1] == "Succeeded"


def test_get_events_watch_prints_each_event_as_it_is_recorded(sqlite_url, tmp_path):
    """As kubectl's `get events -w`: the listing, then every new event, until interrupted."""
    (tmp_path / "a.yaml").write_text(_job("before"))
    assert run_cli("apply", "-f", str(tmp_path / "a.yaml"), store=sqlite_url).code == 0
    table, named = (
        _start(["get", "events", "-w"], sqlite_url),
        _start(["get", "events", "-w", "-o", "name"], sqlite_url),
    )
    try:
        rows, names = _lines(table), _lines(named)
        assert rows.get(timeout=30).split()[:3] == ["LAST", "SEEN", "TYPE"]
        assert "job/before" in rows.get(timeout=30)
        assert names.get(timeout=30).startswith("event/before.")
        (tmp_path / "b.yaml").write_text(_job("after"))
        assert run_cli("apply", "-f", str(tmp_path / "b.yaml"), store=sqlite_url).code == 0
        row = rows.get(timeout=30)
        assert row.split()[1:4] == ["Normal", "Created", "job/after"], row
        assert names.get(timeout=30).startswith("event/after.")
        assert table.poll() is None  # still following
    finally:
        _stop(table)
        _stop(named)


def _documents(lines: queue.Queue[str], count: int) -> list[dict]:
    """The next `count` JSON documents of a stream of indented ones, as they come."""
    decoder, text, found = json.JSONDecoder(), "", []
    while len(found) < count:
        line = lines.get(timeout=30)
        assert line, f"the stream ended after {found}"
        text += line
        try:
            document, end = decoder.raw_decode(text.strip())
        except json.JSONDecodeError:
            continue  # not whole yet
        found.append(document)
        text = text.strip()[end:]
    return found


def test_get_watch_prints_each_change_in_the_format_asked_for(sqlite_url, tmp_path):
    """As kubectl: with -o json each change is the object as a JSON document, with -o name
    its name, not a table row."""
    (tmp_path / "j.yaml").write_text(_job("watched"))
    assert run_cli("apply", "-f", str(tmp_path / "j.yaml"), store=sqlite_url).code == 0
    as_json = _start(["get", "jobs", "watched", "-w", "-o", "json"], sqlite_url)
    as_name = _start(["get", "jobs", "-w", "-o", "name"], sqlite_url)
    try:
        json_lines, name_lines = _lines(as_json), _lines(as_name)
        [listed] = _documents(json_lines, 1)
        assert (listed["kind"], listed["metadata"]["name"], listed["spec"].get("suspend")) == ("Job", "watched", False)
        assert name_lines.get(timeout=30).strip() == "job.reconciler.dev/watched"
        assert run_cli("suspend", "job/watched", store=sqlite_url).code == 0
        [changed] = _documents(json_lines, 1)
        assert (changed["kind"], changed["metadata"]["name"], changed["spec"]["suspend"]) == ("Job", "watched", True)
        assert name_lines.get(timeout=30).strip() == "job.reconciler.dev/watched"
    finally:
        _stop(as_json)
        _stop(as_name)


def test_get_watch_of_pools_prints_usage_as_it_changes(sqlite_url, tmp_path):
    """A pool's USED is derived when read (no write to the pool): `get -w` looks again on a
    timer and prints the row once a job holds the slot, and again when it gives it back."""
    gate = tmp_path / "gate"
    pool = "apiVersion: reconciler.dev/v1alpha1\nkind: Pool\nmetadata: {name: lane}\nspec: {slots: 1}\n"
    job = (
        "apiVersion: reconciler.dev/v1alpha1\nkind: Job\nmetadata: {name: held}\n"
        f"spec: {{pool: lane, shell: 'while [ ! -e {gate} ]; do sleep 0.05; done'}}\n"
    )
    (tmp_path / "p.yaml").write_text(pool + "---\n" + job)
    assert run_cli("apply", "-f", str(tmp_path / "p.yaml"), store=sqlite_url).code == 0
    follower = _start(["get", "pools", "lane", "-w"], sqlite_url)
    controller = None
    try:
        lines = _lines(follower)
        assert lines.get(timeout=30).split()[:3] == ["NAME", "SLOTS", "USED"]
        assert lines.get(timeout=30).split()[:3] == ["lane", "1", "0"]
        # started once the first row is out: before, a quick admission could be its first look
        controller = _start(["controller"], sqlite_url, stderr=subprocess.DEVNULL)
        assert lines.get(timeout=30).split()[:3] == ["lane", "1", "1"]  # the job holds the slot
        gate.touch()
        assert lines.get(timeout=30).split()[:3] == ["lane", "1", "0"]  # and gave it back
    finally:
        if controller is not None:
            _stop(controller)
        _stop(follower)


def test_a_watch_of_a_path_that_does_not_exist_is_refused_at_once(sqlite_url, tmp_path):
    result = run_cli("controller", "--watch", str(tmp_path / "nothing"), store=sqlite_url)
    assert result.code == 2 and "--watch" in result.stderr and "no such file or folder" in result.stderr, result
    assert "Traceback" not in result.stderr


def test_get_watch_says_what_each_change_is_and_shows_a_deletion(sqlite_url, tmp_path):
    """kubectl's --output-watch-events: the listing as ADDED events (one table, an EVENT
    column first), then MODIFIED and DELETED, the last with the object as it was last shown
    (a deleted object was printed by no watch before)."""
    (tmp_path / "j.yaml").write_text(_job("watched"))
    assert run_cli("apply", "-f", str(tmp_path / "j.yaml"), store=sqlite_url).code == 0
    as_json = _start(["get", "jobs", "-w", "--output-watch-events", "-o", "json"], sqlite_url)
    as_table = _start(["get", "jobs", "-w", "--output-watch-events"], sqlite_url)
    json_lines, table_lines = _lines(as_json), _lines(as_table)
    try:
        [listed] = _documents(json_lines, 1)  # the listing: now it watches
        assert (listed["type"], listed["object"]["metadata"]["name"]) == ("ADDED", "watched")
        assert table_lines.get(timeout=30).split()[:3] == ["EVENT", "NAME", "STATUS"]
        assert table_lines.get(timeout=30).split()[:2] == ["ADDED", "watched"]
        assert run_cli("suspend", "job/watched", store=sqlite_url).code == 0
        [changed] = _documents(json_lines, 1)
        assert (changed["type"], changed["object"]["spec"]["suspend"]) == ("MODIFIED", True)
        # each follower looks on its own timer: a look after the deletion would find no change
        # to tell, only the deletion, so both are seen to tell the change before the delete
        assert table_lines.get(timeout=30).split()[:2] == ["MODIFIED", "watched"]
        assert run_cli("delete", "job", "watched", store=sqlite_url).code == 0
        [deleted] = _documents(json_lines, 1)
        assert (deleted["type"], deleted["object"]["metadata"]["name"]) == ("DELETED", "watched")
        assert table_lines.get(timeout=30).split()[:2] == ["DELETED", "watched"]
    finally:
        _stop(as_json)
        _stop(as_table)
    assert run_cli("get", "jobs", "--output-watch-events", store=sqlite_url).code == 2


def test_a_change_made_while_the_listing_is_printed_is_not_lost(sqlite_url, tmp_path):
    """The watch follows the store from before its listing, and the listing `get -w` prints
    is that one (not a read of its own before the watch began): a write made after the
    listing was read (while it was printed, or its reader was slow) still comes."""
    from pathlib import Path as _Path

    from reconciler.apply import apply_manifests
    from reconciler.manifests import documents
    from reconciler.store import Store
    from reconciler.watching import watch
    from tests.server.conftest import job_manifest

    store = Store(sqlite_url)
    try:
        apply_manifests(store, documents([job_manifest("w", suspend=True)], _Path.cwd()))
        listing, events = watch(store, "jobs", [], None)
        assert [o.name for o in listing.objects] == ["w"]  # the listing read; the watch not resumed yet
        apply_manifests(store, documents([job_manifest("w", suspend=True, labels={"k": "v"})], _Path.cwd()))
        told: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: told.put(next(events)), daemon=True).start()
        event, obj = told.get(timeout=30)
        assert (event, obj.labels) == ("MODIFIED", {"k": "v"})
    finally:
        store.dispose()


def test_get_watch_wide_prints_the_wide_row(sqlite_url, tmp_path):
    (tmp_path / "j.yaml").write_text(_job("watched"))
    assert run_cli("apply", "-f", str(tmp_path / "j.yaml"), store=sqlite_url).code == 0
    wide = _start(["get", "jobs", "-w", "-o", "wide"], sqlite_url)
    try:
        lines = _lines(wide)
        assert "MESSAGE" in lines.get(timeout=30) and lines.get(timeout=30).split()[0] == "watched"
        assert run_cli("suspend", "job/watched", store=sqlite_url).code == 0
        changed = lines.get(timeout=30)  # a wide row (it crashed on the first change)
        assert changed.split()[0] == "watched" and len(changed.split()) >= 10, changed
    finally:
        _stop(wide)
