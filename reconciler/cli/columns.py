"""Table columns per kind, normal and wide (-o wide), like kubectl's printer columns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..waiting import why_waiting
from .render import age, attempts, job_state

if TYPE_CHECKING:
    from ..store import StoredObject


def _ready(obj: StoredObject) -> str:
    """Ready only while its Ready condition, as observed now (reads.objects), says True: a
    node whose agent stopped is NotReady, as kubectl shows it."""
    status = obj.status or {}
    ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), None)
    state = "Ready" if ready and ready.get("status") == "True" else ("NotReady" if ready else "Unknown")
    return state + (",SchedulingDisabled" if obj.spec.get("unschedulable") else "")


def job_row(o: StoredObject, wide: bool) -> list[Any]:
    s = o.status or {}
    row = [o.name, job_state(o), o.spec.get("pool") or "", s.get("nodeName") or "", attempts(s), age(o.created_at)]
    if wide:
        deps = ",".join(d["job"] for d in o.spec.get("dependsOn", []))
        row += [s.get("revision", 1), o.spec.get("priority", 0), o.spec.get("slots", 1), s.get("reason") or "", deps]
        row.append(why_waiting(o.spec, s) or s.get("message") or "")  # last: the one free-text column
    return row


def pool_row(o: StoredObject, wide: bool) -> list[Any]:
    s = o.status or {}
    row = [o.name, o.spec.get("slots", "unlimited"), s.get("used", 0), s.get("queued", 0), age(o.created_at)]
    return row + ([o.spec.get("maxBypass", 3)] if wide else [])


def node_row(o: StoredObject, wide: bool) -> list[Any]:
    s = o.status or {}
    cap = o.spec.get("capacity", {}).get("slots") or s.get("cpuCount") or ""
    row = [o.name, _ready(o), cap, s.get("allocated", {}).get("slots", 0), age(o.created_at)]
    if wide:
        row += [
            age(s.get("heartbeatAt")) if s.get("heartbeatAt") else "",
            ",".join(f"{k}={v}" for k, v in o.labels.items()),
        ]
    return row


def notifier_row(o: StoredObject, wide: bool) -> list[Any]:
    s = o.status or {}
    target = o.spec.get("url") or " ".join(o.spec.get("command") or [])
    row = [o.name, target, ",".join(o.spec.get("events", [])), s.get("delivered", 0), s.get("pending", 0)]
    row += [s.get("failed", 0), age(o.created_at)]
    return row + ([o.spec.get("selector") or "", s.get("lastError") or ""] if wide else [])


def _clipped(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def source_row(o: StoredObject, wide: bool) -> list[Any]:
    s = o.status or {}
    protocol = "amqp" if o.spec.get("amqp") else "http"
    queue = f"{protocol}:{(o.spec.get(protocol) or {}).get('queue', '')}"
    row = [o.name, queue, s.get("received", 0), s.get("created", 0), s.get("rejected", 0)]
    row += [str(bool(s.get("connected"))).lower(), _clipped(s.get("lastError") or ""), age(o.created_at)]
    return row + ([s.get("duplicates", 0), s.get("lastMessageTime") or ""] if wide else [])


def service_row(o: StoredObject, _wide: bool) -> list[Any]:
    s = o.status or {}
    ready = "True" if s.get("readinessProbe") else "-"  # listed means ready; "-": it has no probe
    return [
        o.name,
        s.get("node") or "",
        s.get("address") or "",
        s.get("port") or "",
        s.get("run"),
        ready,
        age(s.get("startedAt")),
    ]


COLUMNS = {
    "Job": (
        ["NAME", "STATUS", "POOL", "NODE", "ATTEMPTS", "AGE"],
        ["REVISION", "PRIORITY", "SLOTS", "REASON", "DEPENDS-ON", "MESSAGE"],
        job_row,
    ),
    "Pool": (["NAME", "SLOTS", "USED", "QUEUED", "AGE"], ["MAX-BYPASS"], pool_row),
    "Node": (["NAME", "STATUS", "SLOTS", "ALLOCATED", "AGE"], ["HEARTBEAT", "LABELS"], node_row),
    "Notifier": (
        ["NAME", "TARGET", "EVENTS", "DELIVERED", "PENDING", "FAILED", "AGE"],
        ["SELECTOR", "LAST-ERROR"],
        notifier_row,
    ),
    "Source": (
        ["NAME", "QUEUE", "RECEIVED", "CREATED", "REJECTED", "CONNECTED", "LAST-ERROR", "AGE"],
        ["DUPLICATES", "LAST-MESSAGE"],
        source_row,
    ),
    "Service": (["NAME", "NODE", "ADDRESS", "PORT", "RUN", "READY", "AGE"], [], service_row),
}
