"""`up --junit FILE`: a JUnit XML report, the format CI report viewers read (GitHub Actions'
test reporters, GitLab, Jenkins): one testcase per job, with its duration; a job that did
not succeed is a failure carrying its outcome, reason, exit code and the tail of its
stderr."""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from ..api.meta import to_epoch
from ..api.status import JobStatusDict, RunDict
from .progress import state_of

if TYPE_CHECKING:
    from ..converge import Watched

STDERR_TAIL = 30  # lines of the last run's stderr in a failure

Tail = Callable[[str], str]  # job name -> the tail of its last run's stderr ('' when none)


def report(jobs: Mapping[str, Watched], *, suite: str, started: float, wall: float, tail: Tail) -> bytes:
    """The report as UTF-8 XML, for the jobs `up` followed."""
    cases = []
    failures = 0
    for name in sorted(jobs):
        job = jobs[name]
        status = job.status
        case = ET.Element("testcase", name=name, classname="reconciler.job", time=f"{_duration(status):.3f}")
        if not job.succeeded:
            failures += 1
            failure = ET.SubElement(case, "failure", type=state_of(job), message=_xml_text(_why(status)))
            failure.text = _xml_text(tail(name))
        cases.append(case)
    counts = {"tests": str(len(cases)), "failures": str(failures), "errors": "0", "skipped": "0"}
    root = ET.Element("testsuites", {"name": suite, **counts, "time": f"{wall:.3f}"})
    stamp = datetime.fromtimestamp(started, UTC).isoformat(timespec="seconds")
    testsuite = ET.SubElement(
        root,
        "testsuite",
        {"name": suite, **counts, "time": f"{wall:.3f}", "timestamp": stamp, "hostname": socket.gethostname()},
    )
    testsuite.extend(cases)
    ET.indent(root)
    xml: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return xml


# what XML 1.0 cannot hold: control characters but tab, newline and return (a colour
# escape's ESC among them), surrogates, U+FFFE and U+FFFF; written raw, no viewer parses the file
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    """`text` with what XML 1.0 cannot hold spelled as \\xNN (a colour code reads \\x1b[31m)."""
    return _NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _runs(status: JobStatusDict) -> list[RunDict]:
    revision = status.get("revision", 1)
    return [r for r in status.get("runs", []) if r.get("revision") == revision]


def _duration(status: JobStatusDict) -> float:
    """From its first run's start to its last run's end (or completion), this revision."""
    runs = _runs(status)
    if not runs or not runs[0].get("startedAt"):
        return 0.0
    end = runs[-1].get("finishedAt") or status.get("completionTime")
    return max(0.0, to_epoch(end) - to_epoch(runs[0]["startedAt"])) if end else 0.0


def _why(status: JobStatusDict) -> str:
    """Outcome, reason, the last run's exit code, and the job's message."""
    parts = [status.get("outcome") or status.get("phase") or "Waiting"]
    if status.get("reason"):
        parts.append(str(status["reason"]))
    runs = _runs(status)
    if runs and runs[-1].get("exitCode") is not None:
        parts.append(f"exit code {runs[-1]['exitCode']} (run {runs[-1]['number']})")
    head = ", ".join(parts)
    return f"{head}: {status['message']}" if status.get("message") else head
