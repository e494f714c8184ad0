"""Wait probes: a command run directly (no shell) with a timeout and an output limit."""

from __future__ import annotations

import os
import subprocess

from ..api.job import WaitCondition


def run_probe(cond: WaitCondition, cwd: str | None = None) -> tuple[bool, str]:
    """(exit 0?, a short diagnostic with the output cut to outputLimit bytes)."""
    probe = cond.probe
    try:
        proc = subprocess.Popen(probe.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True)
    except OSError as exc:
        return False, f"probe could not start: {exc.strerror or exc}"
    try:
        out, _ = proc.communicate(timeout=probe.timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.communicate()
        return False, f"probe timed out after {probe.timeout:g}s"
    text = out[: probe.output_limit].decode("utf-8", "replace").strip()
    verdict = "succeeded" if proc.returncode == 0 else f"exited {proc.returncode}"
    return proc.returncode == 0, f"probe {verdict}" + (f": {text}" if text else "")
