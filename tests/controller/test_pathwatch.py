"""The path watcher wakes a job once one of its paths appears, and never a forgotten job."""

from __future__ import annotations

import threading

from reconciler.clock import RealClock
from reconciler.controller.pathwatch import PathWatch
from tests.helpers import wait_until


def _watcher():
    woken: list[str] = []
    lock = threading.Lock()

    def wake(job: str) -> None:
        with lock:
            woken.append(job)

    return PathWatch(wake, RealClock()), woken


def test_wakes_the_job_when_its_path_appears(tmp_path):
    watch, woken = _watcher()
    try:
        watch.watch("a", [(str(tmp_path / "ready"), None, 0.05)])
        watch.watch("b", [(str(tmp_path / "other"), None, 0.05)])
        (tmp_path / "ready").touch()
        wait_until(lambda: woken == ["a"], timeout=5, message="a woken")
        assert len(watch) == 1  # a is no longer watched, b still is
    finally:
        watch.close()


def test_type_dir_is_not_satisfied_by_a_file(tmp_path):
    watch, woken = _watcher()
    try:
        target = tmp_path / "x"
        target.touch()
        watch.watch("dir-job", [(str(target), "dir", 0.05)])
        watch.watch("probe", [(str(tmp_path / "marker"), None, 0.05)])
        (tmp_path / "marker").touch()
        wait_until(lambda: "probe" in woken, timeout=5, message="a later sweep ran")
        assert "dir-job" not in woken
        target.unlink()
        target.mkdir()
        wait_until(lambda: "dir-job" in woken, timeout=5, message="dir-job woken")
    finally:
        watch.close()


def test_forgotten_jobs_are_not_woken(tmp_path):
    watch, woken = _watcher()
    try:
        watch.watch("gone", [(str(tmp_path / "g"), None, 0.05)])
        watch.watch("kept", [(str(tmp_path / "k"), None, 0.05)])
        watch.forget("gone")
        (tmp_path / "g").touch()
        (tmp_path / "k").touch()
        wait_until(lambda: "kept" in woken, timeout=5, message="kept woken")
        assert "gone" not in woken
    finally:
        watch.close()


def test_watch_again_replaces_the_paths(tmp_path):
    watch, woken = _watcher()
    try:
        watch.watch("j", [(str(tmp_path / "old"), None, 0.05)])
        watch.watch("j", [(str(tmp_path / "new"), None, 0.05)])
        watch.watch("other", [(str(tmp_path / "o"), None, 0.05)])
        (tmp_path / "old").touch()
        (tmp_path / "o").touch()
        wait_until(lambda: "other" in woken, timeout=5, message="other woken")
        assert "j" not in woken
        (tmp_path / "new").touch()
        wait_until(lambda: "j" in woken, timeout=5, message="j woken by its new path")
    finally:
        watch.close()
