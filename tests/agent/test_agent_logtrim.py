"""Run logs kept within a limit: the agent's trimmer with real writers (holes punched in the
head, or copytruncate where a filesystem has no holes), and the readers of what it keeps
(whole, tail, follow), which never show a NUL byte or a half line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from reconciler.agent import logs
from reconciler.agent.logs import follow, read_log, rotated
from reconciler.agent.logtrim import LogTrimmer, punch_head
from reconciler.agent.process import read_exit

from .conftest import wait_until

LINE = re.compile(r"line (\d{9})")
LIMIT = 64 * 1024


def numbered(first: int, last: int) -> str:
    return "".join(f"line {i:09d}\n" for i in range(first, last + 1))


def text(path, tail=None) -> str:
    return "".join(read_log(path, tail=tail))


def disk_use(*paths) -> int:
    return sum(os.stat(p).st_blocks * 512 for p in paths if os.path.exists(p))


def numbers(text: str, *, writing: bool = False) -> list[int]:
    """The numbers of whole numbered lines: fails on a half line or a NUL byte, but for the
    last line of a log still `writing` (a write may show before it is whole)."""
    if writing:
        text = text[: text.rfind("\n") + 1]
    assert text.endswith("\n"), text[-40:]
    found = []
    for line in text.splitlines():
        match = LINE.fullmatch(line)
        assert match, f"not a whole line: {line[:40]!r}"
        found.append(int(match.group(1)))
    return found


def assert_newest(text: str, last: int, at_least: int) -> None:
    """Contiguous whole lines ending with `last`, at least `at_least` bytes, the first ones gone."""
    kept = numbers(text)
    assert kept == list(range(kept[0], last + 1))
    assert kept[0] > 1 and len(text) >= at_least


def test_readers_skip_a_punched_head_to_the_next_whole_line(tmp_path):
    path = tmp_path / "stdout"
    path.write_text(numbered(1, 10_000))
    data, used = path.read_bytes(), disk_use(path)
    punch_head(path, 40_960, len(data))
    assert path.stat().st_size == len(data)  # the apparent size stays: the writer's appends go on at its end
    assert disk_use(path) == used - 40_960
    kept = data[data.index(b"\n", 40_960) + 1 :].decode()
    assert text(path) == kept
    assert text(path, tail=2) == numbered(9_999, 10_000)
    assert text(path, tail=100_000) == kept  # no further back than the cut
    assert "".join(follow([path], done=lambda: True)) == kept
    assert "".join(follow([path], done=lambda: True, tail=1)) == numbered(10_000, 10_000)


def test_a_log_that_is_one_unbroken_line_is_shown_from_the_cut(tmp_path):
    path = tmp_path / "stdout"
    path.write_bytes(b"x" * 20_000)
    punch_head(path, 8192, 20_000)
    assert text(path) == "x" * (20_000 - 8192)


def test_whole_reads_keep_characters_split_across_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "_BLOCK", 7)  # tiny blocks: characters straddle them
    path = tmp_path / "stdout"
    body = "".join(f"{i:05d} é ✓\n" for i in range(300))
    path.write_bytes(body.encode() + b"bad \xff byte, no newline")
    assert text(path) == body + "bad \ufffd byte, no newline"


def test_a_followed_line_longer_than_the_bound_goes_out_in_pieces(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "_LONG_LINE", 1000)
    path = tmp_path / "stdout"
    path.write_bytes(b"y" * 300_000)
    pieces = list(follow([path], done=lambda: True))
    assert "".join(pieces) == "y" * 300_000
    assert max(map(len, pieces)) <= 1000 + logs._BLOCK


def _wait_for_trim(trimmer: LogTrimmer, run_dir, *paths, limit: int) -> None:
    # a whole block over the limit is freed; the rest, a block of slack, stays
    wait_until(lambda: disk_use(*paths) <= limit + 16 * 1024, timeout=20, message=f"disk use {disk_use(*paths)}")
    assert read_exit(run_dir) is None, "the run ended: this is about a live one"


def test_the_trimmer_keeps_a_live_runs_logs_within_the_limit(spawn, tmp_path):
    go = tmp_path / "go"
    _, run_dir = spawn(
        shell=f"seq -f 'line %09.0f' 1 300000; seq -f 'line %09.0f' 1 20000 >&2; "
        f"while [ ! -e '{go}' ]; do sleep 0.02; done; seq -f 'line %09.0f' 300001 300100"
    )
    out, err = run_dir / "stdout", run_dir / "stderr"
    trimmer = LogTrimmer(interval=0.05)
    try:
        trimmer.keep(run_dir, LIMIT)
        # the C wrapper makes the log itself, off the spawner's path: it may not exist yet
        wait_until(lambda: out.exists() and out.stat().st_size == 300_000 * 15, timeout=20)
        wait_until(lambda: err.stat().st_size == 20_000 * 15, timeout=20)  # written after stdout's
        _wait_for_trim(trimmer, run_dir, out, limit=LIMIT)
        _wait_for_trim(trimmer, run_dir, err, limit=LIMIT)
        assert_newest(text(out), 300_000, LIMIT - 15)
        assert_newest(text(err), 20_000, LIMIT - 15)
        assert text(out, tail=2) == numbered(299_999, 300_000)

        go.touch()
        wait_until(lambda: read_exit(run_dir) is not None, timeout=20)
        trimmer.release(run_dir)  # one last trim for what the run wrote last, then it is forgotten
        wait_until(lambda: run_dir not in trimmer, timeout=20)
        assert disk_use(out) <= LIMIT + 16 * 1024
        assert_newest(text(out), 300_100, LIMIT - 15)
    finally:
        trimmer.close()


def test_copytruncate_where_the_filesystem_has_no_holes(spawn, tmp_path):
    go = tmp_path / "go"
    _, run_dir = spawn(
        shell=f"seq -f 'line %09.0f' 1 300000; while [ ! -e '{go}' ]; do sleep 0.02; done; "
        "seq -f 'line %09.0f' 300001 300100"
    )
    out = run_dir / "stdout"
    trimmer = LogTrimmer(interval=0.05, holes=False)
    try:
        # trimmed once the run has paused: what it writes during a copy would be lost
        # the C wrapper makes the log itself, off the spawner's path: it may not exist yet
        wait_until(lambda: out.exists() and out.stat().st_size == 300_000 * 15, timeout=20)
        trimmer.keep(run_dir, LIMIT)
        wait_until(rotated(out).exists, timeout=20)  # renamed into place after the truncation
        _wait_for_trim(trimmer, run_dir, out, rotated(out), limit=LIMIT)
        assert out.stat().st_size < LIMIT  # truncated, not sparse
        assert_newest(text(out), 300_000, LIMIT // 2 - 15)  # the older part, then the live file
        assert text(out, tail=2) == numbered(299_999, 300_000)

        go.touch()
        wait_until(lambda: read_exit(run_dir) is not None, timeout=20)
        assert_newest(text(out), 300_100, LIMIT // 2 - 15)
    finally:
        trimmer.close()


WRITER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
end = time.monotonic() + float(sys.argv[2])
i = 0
while time.monotonic() < end:
    for _ in range(100):
        i += 1
        os.write(fd, b"line %09d\\n" % i)
"""


def test_readers_racing_the_trimmer_show_no_nul_and_no_half_line(tmp_path):
    """A writer as fast as it goes, heads punched every few milliseconds: a reader that falls
    behind the cut must skip to the next whole line, never read the hole."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    out = run_dir / "stdout"
    out.touch()
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(out), "2"])
    trimmer = LogTrimmer(interval=0.002)
    try:
        trimmer.keep(run_dir, 16 * 1024)
        followed = follow([out], done=lambda: writer.poll() is not None, poll=0.01)
        reads = 0
        for piece in followed:
            kept = numbers(piece)
            assert kept == sorted(kept)
            reads += 1
            whole = numbers(text(out), writing=True)
            assert whole == sorted(whole)
        assert writer.returncode == 0 and reads > 10
    finally:
        trimmer.close()
        if writer.poll() is None:
            writer.kill()
            writer.wait()
