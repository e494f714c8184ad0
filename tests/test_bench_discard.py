"""The benchmarks' scratch is removed only when their process exits (bench/common.discard):
deleting it between measurements made the next runs' inode allocations slow on this
machine's journal-less ext4, so the harness's cleanup was being timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bench import common

tree = Path(sys.argv[2])
common.discard(tree)
assert not tree.exists(), "still in its place"
kept = list(common._trash.iterdir())
assert len(kept) == 1 and (kept[0] / "run" / "stdout").read_text() == "out", kept
common.discard(tree)  # gone already: nothing to do
print(common._trash)
"""


def test_discarded_tree_waits_in_the_trash_until_the_process_exits(tmp_path: Path) -> None:
    tree = tmp_path / "scratch"
    (tree / "run").mkdir(parents=True)
    (tree / "run" / "stdout").write_text("out")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(ROOT), str(tree)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    trash = Path(done.stdout.strip())
    assert trash.name.startswith("reconciler-bench-trash-")
    assert not trash.exists()  # removed at exit
    assert not tree.exists()
