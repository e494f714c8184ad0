"""read_log (tail) and follow, on plain files and on a real run's output."""

from __future__ import annotations

import pytest

from reconciler.agent import logs
from reconciler.agent.logs import follow
from reconciler.agent.logs import read_log as read_log_chunks
from reconciler.agent.process import read_exit


def read_log(path, tail=None) -> str:
    return "".join(read_log_chunks(path, tail=tail))


def test_tail_takes_the_last_lines(tmp_path):
    path = tmp_path / "log"
    path.write_text("".join(f"line {i}\n" for i in range(1, 11)))
    assert read_log(path, tail=3) == "line 8\nline 9\nline 10\n"
    assert read_log(path, tail=1) == "line 10\n"
    assert read_log(path, tail=0) == ""
    assert read_log(path, tail=50) == path.read_text()
    assert read_log(path, tail=None) == path.read_text()


def test_tail_without_final_newline_and_of_empty_files(tmp_path):
    path = tmp_path / "log"
    path.write_text("a\nb\nc")
    assert read_log(path, tail=2) == "b\nc"
    path.write_text("")
    assert read_log(path, tail=2) == ""
    path.write_text("\n\n")
    assert read_log(path, tail=1) == "\n"
    with pytest.raises(FileNotFoundError):
        read_log(tmp_path / "absent", tail=1)


def test_tail_across_block_boundaries(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "_BLOCK", 7)  # tiny blocks: lines straddle them
    path = tmp_path / "log"
    lines = [f"{i:05d} é\n" for i in range(1000)]
    path.write_text("".join(lines))
    for n in (1, 2, 3, 17, 999, 1000, 1001):
        assert read_log(path, tail=n) == "".join(lines[-n:]), n


def test_tail_of_a_big_file(tmp_path):
    path = tmp_path / "log"
    with open(path, "w") as f:
        for i in range(200_000):
            f.write(f"line {i}\n")
    assert read_log(path, tail=2) == "line 199998\nline 199999\n"


def test_follow_yields_appended_lines_until_done(tmp_path):
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    out.write_bytes(b"")  # stderr is not created yet: counts as empty
    finished = False
    stream = follow([out, err], done=lambda: finished, poll=0.01)
    with open(out, "ab") as f:
        f.write(b"one\n")
    assert next(stream) == "one\n"
    with open(err, "ab") as f:
        f.write(b"oops\n")
    assert next(stream) == "oops\n"
    with open(out, "ab") as f:
        f.write(b"half a li")  # no newline yet: held back
        f.flush()
        f.write(b"ne\ncaf\xc3")  # a UTF-8 character split across writes
        f.flush()
    assert next(stream) == "half a line\n"
    with open(out, "ab") as f:
        f.write(b"\xa9 tail without newline")
    finished = True
    assert list(stream) == ["café tail without newline"]


def test_follow_a_real_run_to_its_end(spawn):
    _, run_dir = spawn(shell="for i in 1 2 3; do echo out $i; echo err $i >&2; done")
    stream = follow(
        [run_dir / "stdout", run_dir / "stderr"],
        done=lambda: read_exit(run_dir) is not None,
        poll=0.01,
    )
    text = "".join(stream)
    assert sorted(text.splitlines()) == ["err 1", "err 2", "err 3", "out 1", "out 2", "out 3"]


def test_follow_starts_over_after_truncation(tmp_path):
    path = tmp_path / "log"
    path.write_text("first\n")
    finished = False
    stream = follow([path], done=lambda: finished, poll=0.01)
    assert next(stream) == "first\n"
    path.write_text("x\n")  # shorter than what was read: truncated and rewritten
    finished = True
    assert list(stream) == ["x\n"]


def test_a_run_has_one_directory_named_after_job_uid_and_number(tmp_path):
    uid = "0b5e6f3a-8c1d-4f2e-9a7b-1c2d3e4f5a6b"
    assert logs.run_dir(tmp_path, "build-1", uid, 2) == tmp_path / "runs" / f"build-1.{uid}.2"


def test_a_run_started_under_the_earlier_layout_is_found_there(tmp_path):
    uid = "0b5e6f3a-8c1d-4f2e-9a7b-1c2d3e4f5a6b"
    legacy = tmp_path / "runs" / "build-1" / uid / "1"
    legacy.mkdir(parents=True)
    assert logs.run_dir(tmp_path, "build-1", uid, 1) == legacy  # logs and adoption still find it
    assert logs.run_dir(tmp_path, "build-1", uid, 2) == tmp_path / "runs" / f"build-1.{uid}.2"  # new runs: flat
    flat = tmp_path / "runs" / f"build-1.{uid}.1"
    flat.mkdir()
    assert logs.run_dir(tmp_path, "build-1", uid, 1) == flat  # the current layout wins when both exist


def test_legacy_runs_are_looked_for_once_by_directory_name(tmp_path):
    assert not logs.has_legacy_runs(tmp_path)  # no runs folder yet
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "build-1.0b5e6f3a-8c1d-4f2e-9a7b-1c2d3e4f5a6b.1").mkdir()
    assert not logs.has_legacy_runs(tmp_path)
    (runs / "build-1").mkdir()  # runs/<job>/<uid>/<number>
    assert logs.has_legacy_runs(tmp_path)


def test_the_agent_finds_runs_of_the_earlier_layout_only_when_there_are_any(tmp_path):
    from reconciler.agent.local import LocalAgent

    uid = "0b5e6f3a-8c1d-4f2e-9a7b-1c2d3e4f5a6b"
    legacy = tmp_path / "old" / "runs" / "build-1" / uid / "1"
    legacy.mkdir(parents=True)
    for state, expected in (
        (tmp_path / "old", legacy),
        (tmp_path / "new", tmp_path / "new" / "runs" / f"build-1.{uid}.1"),
    ):
        agent = LocalAgent("node-a", state, on_exit=lambda job: None)
        try:
            assert agent.run_dir("build-1", uid, 1) == expected
        finally:
            agent.close()
