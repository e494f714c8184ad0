"""Removing run folders (agent/runfolders.remove_tree, which the controller's agent and a node
agent's sweep use): a run may leave read-only folders behind (Go's module cache is one), which
a process that is not root cannot empty as they are."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from reconciler.agent.runfolders import remove_tree


def _run_folder(base: Path) -> Path:
    folder = base / "job.0000.1"
    (folder / "work" / "pkg" / "mod").mkdir(parents=True)
    (folder / "stdout").write_text("logs\n")
    (folder / "work" / "pkg" / "mod" / "go.mod").write_text("module x\n")
    (folder / "work" / "pkg" / "mod").chmod(0o555)
    (folder / "work" / "pkg").chmod(0o555)
    return folder


def test_a_run_folder_with_read_only_folders_in_it_is_removed_by_its_owner():
    base = Path(tempfile.mkdtemp(prefix="reconciler-runfolders-"))
    try:
        base.chmod(0o755)
        folder = _run_folder(base)
        if os.geteuid() == 0:  # root removes anything: the agent's user is who must manage it
            subprocess.run(["chown", "-R", "nobody:nogroup", str(base)], check=True)
            code = "import sys, pathlib, reconciler.agent.runfolders as r; r.remove_tree(pathlib.Path(sys.argv[1]))"
            done = subprocess.run(
                [
                    "setpriv",
                    "--reuid=nobody",
                    "--regid=nogroup",
                    "--clear-groups",
                    sys.executable,
                    "-c",
                    code,
                    str(folder),
                ],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
            )
            assert done.returncode == 0 and "could not be removed" not in done.stderr, done.stderr
        else:
            remove_tree(folder)
        assert not folder.exists()
    finally:
        for root, dirs, _ in os.walk(base):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o700)
        shutil.rmtree(base, ignore_errors=True)
