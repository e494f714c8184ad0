"""`describe`: everything about one object as readable sections."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..api.meta import to_epoch
from ..api.quantity import format_duration
from ..api.source import shown_url
from ..waiting import why_waiting
from .render import age, dump_yaml, job_state, table

if TYPE_CHECKING:
    from ..store import StoredObject


def _section(title: str, body: str) -> str:
    indented = "\n".join("  " + line if line else line for line in body.splitlines())
    return f"{title}:\n{indented}" if body.strip() else f"{title}:  <none>"


def _kv(pairs: list[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in pairs) + 2
    return "\n".join(f"{(k + ':').ljust(width)}{'<none>' if v is None or v == '' else v}" for k, v in pairs)


def describe_object(obj: StoredObject, events: list[Any], held: list[StoredObject] | None = None) -> str:
    """`held`: for a Node, the jobs holding slots on it."""
    status = obj.status or {}
    head = [
        ("Name", obj.name),
        ("Kind", obj.kind),
        ("Labels", ",".join(f"{k}={v}" for k, v in obj.labels.items()) or None),
        ("Annotations", ",".join(f"{k}={v}" for k, v in obj.annotations.items()) or None),
        ("UID", obj.uid),
        ("Generation", obj.generation),
        ("Resource Version", obj.resource_version),
        ("Created", f"{obj.manifest()['metadata']['creationTimestamp']} ({age(obj.created_at)} ago)"),
    ]
    if obj.deleted_at:
        head.append(("Deletion Requested", age(obj.deleted_at) + " ago"))
    parts = [_kv(head)]
    if obj.kind == "Job":
        parts += _job_sections(obj, status)
    elif obj.kind == "Notifier":
        parts += _notifier_sections(obj, status)
    elif obj.kind == "Source":
        parts += _source_sections(obj, status)
    else:
        parts.append(_section("Spec", dump_yaml(obj.spec)))
        if status:
            parts.append(_section("Status", dump_yaml(status)))
    if obj.kind == "Node":
        parts.append(_section("Jobs", _held_table(held or [])))
    rows = [[age(e.time), e.type, e.reason, e.message] for e in events]
    parts.append(_section("Events", table(["AGE", "TYPE", "REASON", "MESSAGE"], rows) if rows else ""))
    return "\n".join(parts)


def _held_table(jobs: list[StoredObject]) -> str:
    """The jobs holding slots on a node: name, phase, run, slots, since when admitted."""
    rows = []
    for job in jobs:
        status = job.status or {}
        admission, runs = status.get("admission") or {}, status.get("runs") or []
        admitted = admission.get("admittedAt")
        rows.append(
            [
                job.name,
                status.get("phase", ""),
                str(runs[-1]["number"]) if runs else "-",
                str(admission.get("slots", "")),
                age(to_epoch(admitted)) if admitted else "-",
            ]
        )
    return table(["NAME", "PHASE", "RUN", "SLOTS", "ADMITTED"], rows) if rows else "(none holding slots)"


def _job_sections(obj: StoredObject, status: dict[str, Any]) -> list[str]:
    spec = obj.spec
    command = spec.get("command")
    summary = [
        ("Command", " ".join(command) if command else None),
        ("Shell", spec.get("shell")),
        ("Working Dir", spec.get("workingDir")),
        ("Type", spec.get("type")),
        ("Pool", spec.get("pool") or "(global only)"),
        ("Slots", spec.get("slots")),
        ("Priority", spec.get("priority")),
        ("Retry", _retry(spec.get("retry", {}))),
        ("Timeout", spec.get("timeout") or "none"),
        ("Run Timeout", spec.get("runTimeout") or "none"),
        ("Suspend", spec.get("suspend")),
    ]
    if spec.get("type") == "service":
        summary.append(("Port", spec.get("port") or "none"))
        restart = {"delay": "1s", "maxDelay": "5m", "resetAfter": "10m", **spec.get("restart", {})}
        summary.append(("Restart", " ".join(f"{k}={v}" for k, v in restart.items())))
        if readiness := spec.get("readiness"):
            probe = readiness.get("probe", {})
            summary.append(
                ("Readiness", f"{' '.join(probe.get('command', []))} every {readiness.get('interval', '5s')}")
            )
    placement = spec.get("placement", {})
    if placement.get("nodeName") or placement.get("nodeSelector"):
        summary.append(("Placement", dump_yaml(placement).strip().replace("\n", "; ")))
    state = [
        ("Status", job_state(obj)),
        ("Phase", status.get("phase")),
        ("Outcome", status.get("outcome")),
        ("Reason", status.get("reason")),
        ("Message", status.get("message")),
        ("Revision", status.get("revision")),
        ("Observed Generation", status.get("observedGeneration")),
        ("Accepted", status.get("acceptedAt")),
        ("Eligible", status.get("eligibleAt")),
        ("Node", status.get("nodeName")),
        ("Next Run", status.get("nextRunAt")),
        ("Restarts", status.get("restarts")),
        ("Ready", status.get("ready")),
        ("Started", status.get("startTime")),
        ("Completed", status.get("completionTime")),
    ]
    if why := why_waiting(spec, status):  # after Message: the same words as the dashboard's
        state.insert(5, ("Why Waiting", why))
    suspended = [("Suspended Since", status.get("suspendedAt"))]  # the job timeout leaves suspended time out
    if seconds := status.get("suspendedSeconds"):
        suspended.append(("Time Suspended", format_duration(seconds)))
    after = next(i for i, (k, _) in enumerate(state) if k == "Accepted") + 1
    state[after:after] = [(k, v) for k, v in suspended if v]
    if adm := status.get("admission"):
        state.append(
            ("Admission", f"pool={adm.get('pool') or 'global'} slots={adm.get('slots')} at {adm.get('admittedAt')}")
        )
    deps = [[d["job"], ",".join(d.get("outcomes", []))] for d in spec.get("dependsOn", [])]
    receipts = {r["job"]: r for r in status.get("dependencies", [])}
    dep_rows = [[*row, _receipt(receipts.get(row[0]))] for row in deps]
    waits = [
        [w["type"], "yes" if w["satisfied"] else "no", w.get("lastCheckedAt") or "", w.get("message") or ""]
        for w in status.get("waits", [])
    ]
    runs = [
        [
            r["number"],
            r["revision"],
            r.get("node") or "",
            r.get("pid") or "",
            r.get("startedAt") or "",
            r.get("finishedAt") or "",
            _fmt_code(r),
            r.get("outcome") or "running",
            r.get("reason") or "",
            _bytes(r.get("peakMemory")),
            "" if r.get("cpuSeconds") is None else f"{r['cpuSeconds']:.2f}",
            r.get("limits") or "",
        ]
        for r in status.get("runs", [])
    ]
    conditions = [
        [c["type"], c["status"], c.get("reason") or "", c.get("message") or ""] for c in status.get("conditions", [])
    ]
    return [
        _kv(summary),
        _kv(state),
        _section("Dependencies", table(["JOB", "NEEDS", "RECEIPT"], dep_rows) if dep_rows else ""),
        _section("Waits", table(["TYPE", "SATISFIED", "LAST CHECKED", "MESSAGE"], waits) if waits else ""),
        _section(
            "Runs",
            table(
                [
                    *("RUN", "REV", "NODE", "PID", "STARTED", "FINISHED", "EXIT", "OUTCOME", "REASON"),
                    *("PEAK MEMORY", "CPU SECONDS", "LIMITS"),
                ],
                runs,
            )
            if runs
            else "",
        ),
        _section("Conditions", table(["TYPE", "STATUS", "REASON", "MESSAGE"], conditions) if conditions else ""),
    ]


def _bytes(size: int | None) -> str:
    """A run's peak memory as people read it (1 decimal, binary units)."""
    if size is None:
        return ""
    for unit, scale in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f}{unit}"
    return f"{size}B"


def _notifier_sections(obj: StoredObject, status: dict[str, Any]) -> list[str]:
    spec = obj.spec
    secret = (spec.get("secretRef") or {}).get("file")
    summary = [
        ("URL", spec.get("url")),
        ("Command", " ".join(spec["command"]) if spec.get("command") else None),
        ("Events", ",".join(spec.get("events", []))),
        ("Selector", spec.get("selector") or "(every job)"),
        ("Secret File", secret),
    ]
    deliveries = [
        ("Delivered", status.get("delivered", 0)),
        ("Pending", status.get("pending", 0)),
        ("Failed", status.get("failed", 0)),
        ("Last Delivery", status.get("lastDeliveryTime")),
        ("Last Error", status.get("lastError")),
        ("Last Error Time", status.get("lastErrorTime")),
    ]
    return [_kv([(k, v) for k, v in summary if v is not None]), _section("Deliveries", _kv(deliveries))]


def _source_sections(obj: StoredObject, status: dict[str, Any]) -> list[str]:
    protocol = "amqp" if obj.spec.get("amqp") else "http"
    queue = obj.spec.get(protocol) or {}
    summary = [("Protocol", protocol), ("URL", shown_url(queue.get("url", ""))), ("Queue", queue.get("queue"))]
    template = obj.spec.get("template") or {}
    counts = [
        ("Connected", bool(status.get("connected"))),
        ("Received", status.get("received", 0)),
        ("Created", status.get("created", 0)),
        ("Duplicates", status.get("duplicates", 0)),
        ("Rejected", status.get("rejected", 0)),
        ("Last Message", status.get("lastMessageTime")),
        ("Last Error", status.get("lastError")),
        ("Last Error Time", status.get("lastErrorTime")),
    ]
    return [
        _kv(summary),
        _section("Template", dump_yaml(template) if template else ""),
        _section("Ingestion", _kv(counts)),
    ]


def _retry(retry: dict[str, Any]) -> str:
    backoff = retry.get("backoff", {})
    codes = ",".join(map(str, retry.get("onExitCodes", []))) or "any non-zero"
    return (
        f"limit={retry.get('limit', 0)} onExitCodes={codes} onTimeout={retry.get('onTimeout', False)} "
        f"onLost={retry.get('onLost', True)} backoff={backoff.get('policy')}/{backoff.get('delay')}"
        f"x{backoff.get('factor')}<= {backoff.get('maxDelay')}±{backoff.get('jitter')}"
    )


def _receipt(receipt: dict[str, Any] | None) -> str:
    if receipt is None:
        return "pending"
    verdict = "satisfied" if receipt.get("satisfied") else "unsatisfiable"
    return f"{verdict}: {receipt.get('outcome')} at revision {receipt.get('revision')} ({receipt.get('observedAt')})"


def _fmt_code(run: dict[str, Any]) -> str:
    if run.get("signal"):
        return f"{run.get('exitCode')} (signal {run['signal']})"
    return "" if run.get("exitCode") is None else str(run["exitCode"])
