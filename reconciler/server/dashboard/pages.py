"""The dashboard's views as HTML fragments, rendered here from what the read verbs answer
(reads.py, graph.py) and worded by waiting.py, as the CLI words them. Every value from the
store is escaped; the fragment's root carries the resourceVersion it was read at, which the
browser's watch stream starts from."""

from __future__ import annotations

import time
from collections.abc import Iterable
from html import escape
from typing import Any
from urllib.parse import quote, urlencode

from ... import graph as graphs
from ... import reads
from ...api.meta import to_epoch
from ...api.status import Outcome, Phase, phase_of
from ...errors import ReconcilerError
from ...selectors import parse as parse_selector
from ...store import Store, StoredObject
from ...waiting import line_name, ordinal, why_waiting
from .layout import svg

GRAPH_LIMIT = 300  # more jobs than this are drawn as groups (depth, state)
PAGE_SIZE = 100  # rows of the jobs table per page
QUEUE_SHOWN = 100  # jobs listed per queue on the pools page
STATES = [str(p) for p in Phase if p != Phase.COMPLETED] + [str(o) for o in Outcome]


def h(value: Any) -> str:
    return escape("" if value is None else str(value))


def fragment(view: str, rv: int, body: str, **data: str) -> str:
    attrs = "".join(f' data-{k}="{h(v)}"' for k, v in data.items())
    return f'<div class="fragment" data-view="{view}" data-rv="{rv}"{attrs}>{body}</div>'


def table(headers: list[str], rows: Iterable[list[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller)."""
    head = "".join(f"<th>{h(x)}</th>" for x in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def state_of(obj: StoredObject) -> str:
    return graphs.state_of(obj)


def badge(state: str) -> str:
    return f'<span class="state st-{h(state)}">{h(state)}</span>'


def job_link(name: str) -> str:
    return f'<a href="/ui/jobs/{quote(name)}">{h(name)}</a>'


def ago(stamp: str | float | None) -> str:
    """45s, 3m, 5h, 2d ago: how long since a stamp (RFC 3339 or epoch seconds)."""
    if stamp is None or stamp == "":
        return ""
    seconds = max(0, int(time.time() - (to_epoch(stamp) if isinstance(stamp, str) else stamp)))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def duration(run: dict[str, Any]) -> str:
    if not run.get("startedAt"):
        return ""
    end = to_epoch(run["finishedAt"]) if run.get("finishedAt") else time.time()
    seconds = max(0.0, end - to_epoch(run["startedAt"]))
    return f"{seconds:.1f}s" if seconds < 120 else f"{int(seconds // 60)}m{int(seconds % 60)}s"


def problem(exc: ReconcilerError) -> str:
    return f'<p class="problem">{h(exc)}</p>'


# -- the graph ------------------------------------------------------------------------------


def graph_view(store: Store, selector_text: str) -> str:
    rv = store.change_seq()
    form = _filter_form("/", selector_text, None)
    try:
        graph = graphs.stored_graph(store, parse_selector(selector_text) if selector_text else None)
    except ReconcilerError as exc:
        return fragment("graph", rv, form + problem(exc))
    if not graph.nodes:
        return fragment("graph", rv, form + '<p class="empty">No jobs.</p>', grouped="0")
    picture, grouped = svg(graph, GRAPH_LIMIT)
    counts: dict[str, int] = {}
    for node in graph.nodes:
        counts[node.state] = counts.get(node.state, 0) + 1
    legend = " ".join(f"{badge(s)} {n}" for s, n in sorted(counts.items()))
    note = (
        f'<p class="note">{len(graph.nodes)} jobs: more than {GRAPH_LIMIT}, so they are grouped by depth and '
        "state (a box per group, its count beside the state); narrow the selection with a label selector "
        "to see each job.</p>"
        if grouped
        else ""
    )
    body = f'{form}<p class="legend">{legend}</p>{note}<div class="graph-box">{picture}</div>'
    return fragment("graph", rv, body, grouped="1" if grouped else "0")


def _filter_form(action: str, selector_text: str, phase: str | None) -> str:
    phase_field = ""
    if phase is not None:
        options = "".join(
            f'<option value="{h(s)}"{" selected" if s == phase else ""}>{h(s)}</option>' for s in ["", *STATES]
        )
        phase_field = f'<label>state <select name="phase">{options}</select></label>'
    return (
        f'<form class="filters" method="get" action="{action}">'
        f'<label>label selector <input name="labelSelector" value="{h(selector_text)}" '
        f'placeholder="team=data,tier!=dev"></label>{phase_field}<button type="submit">Filter</button></form>'
    )


# -- the jobs table ---------------------------------------------------------------------------


def jobs_view(store: Store, selector_text: str, phase: str, page: int) -> str:
    form = _filter_form("/ui/jobs", selector_text, phase)
    try:
        selector = parse_selector(selector_text) if selector_text else None
        rv, listing = reads.listing_at(store, "jobs", [], selector)
    except ReconcilerError as exc:
        return fragment("jobs", store.change_seq(), form + problem(exc))
    jobs = [o for o in listing.objects if not phase or phase in (state_of(o), (o.status or {}).get("phase"))]
    pages = max(1, -(-len(jobs) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    shown = jobs[(page - 1) * PAGE_SIZE : page * PAGE_SIZE]
    rows = [
        [
            job_link(o.name),
            badge(state_of(o)),
            h(o.spec.get("pool") or ""),
            h((o.status or {}).get("nodeName") or ""),
            h(len((o.status or {}).get("runs") or [])),
            h(ago(o.created_at)),
            h(why_waiting(o.spec, o.status) or (o.status or {}).get("message") or ""),
        ]
        for o in shown
    ]
    headers = ["name", "state", "pool", "node", "runs", "age", "why / message"]
    summary = f'<p class="count">{len(jobs)} jobs{f", page {page} of {pages}" if pages > 1 else ""}</p>'
    pager = _pager(selector_text, phase, page, pages)
    return fragment("jobs", rv, form + summary + table(headers, rows, "jobs") + pager)


def _pager(selector_text: str, phase: str, page: int, pages: int) -> str:
    if pages <= 1:
        return ""

    def link(n: int, text: str) -> str:
        query = urlencode({k: v for k, v in (("labelSelector", selector_text), ("phase", phase)) if v} | {"page": n})
        return f'<a class="page" href="/ui/jobs?{h(query)}">{h(text)}</a>'

    links = [link(page - 1, "‹ previous")] if page > 1 else []
    links += [link(page + 1, "next ›")] if page < pages else []
    return f'<nav class="pager">{" ".join(links)}</nav>'


# -- one job ------------------------------------------------------------------------------------


def job_view(store: Store, name: str, admin: bool) -> str:
    rv = store.change_seq()
    try:
        obj, events = reads.describe(store, "job", name)
    except ReconcilerError as exc:
        return fragment("job", rv, problem(exc), job=name)
    spec, status = obj.spec, obj.status or {}
    state = state_of(obj)
    why = why_waiting(spec, status)
    summary = [
        ("command", " ".join(spec.get("command") or []) or spec.get("shell") or ""),
        ("type", spec.get("type", "run")),
        ("pool", spec.get("pool") or "(global only)"),
        ("slots", spec.get("slots", 1)),
        ("priority", spec.get("priority", 0)),
        ("retry limit", (spec.get("retry") or {}).get("limit", 0)),
        ("timeout", spec.get("timeout") or "none"),
        ("run timeout", spec.get("runTimeout") or "none"),
        ("labels", ", ".join(f"{k}={v}" for k, v in obj.labels.items())),
    ]
    now = [
        ("reason", status.get("reason")),
        ("message", status.get("message")),
        ("why waiting", why),
        ("revision", status.get("revision")),
        ("node", status.get("nodeName")),
        ("eligible", status.get("eligibleAt")),
        ("started", status.get("startTime")),
        ("completed", status.get("completionTime")),
    ]
    runs = [
        [
            h(r["number"]),
            h(r.get("revision")),
            h(r.get("node") or ""),
            h(r.get("startedAt") or ""),
            h(duration(r)),
            h("" if r.get("exitCode") is None else r["exitCode"])
            + (f" (signal {h(r['signal'])})" if r.get("signal") else ""),
            badge(r.get("outcome") or "Running"),
            h(r.get("reason") or ""),
        ]
        for r in reversed(status.get("runs") or [])
    ]
    receipts = {r["job"]: r for r in status.get("dependencies") or []}
    deps = [
        [
            job_link(d["job"]),
            h(", ".join(d.get("outcomes") or ["Succeeded"])),
            h(_receipt(receipts.get(d["job"]))),
        ]
        for d in spec.get("dependsOn") or []
    ]
    waits = [
        [h(w.get("type")), "yes" if w.get("satisfied") else "no", h(w.get("lastCheckedAt") or ""), h(w.get("message"))]
        for w in status.get("waits") or []
    ]
    conditions = [
        [h(c["type"]), h(c["status"]), h(c.get("reason") or ""), h(c.get("message") or "")]
        for c in status.get("conditions") or []
    ]
    event_rows = [[h(ago(e.time)), h(e.type), h(e.reason), h(e.message)] for e in reversed(events)]
    body = [
        f"<h2>{h(obj.name)} {badge(state)}</h2>",
        _actions(obj.name, phase_of(status), admin),
        '<div class="columns">',
        f"<section><h3>Spec</h3>{_pairs(summary)}</section>",
        f"<section><h3>Status</h3>{_pairs(now)}</section>",
        "</div>",
        _section(
            "Runs",
            table(["run", "rev", "node", "started", "duration", "exit", "outcome", "reason"], runs, "runs"),
            runs,
        ),
        # the logs panel: the browser keeps it (and its follow) across refreshes of this fragment
        '<section id="logs" class="logs"></section>' if status.get("runs") else "",
        _section("Dependencies", table(["job", "needs", "receipt"], deps), deps),
        _section("Waits", table(["type", "satisfied", "last checked", "message"], waits), waits),
        _section("Conditions", table(["type", "status", "reason", "message"], conditions), conditions),
        _section("Events", table(["age", "type", "reason", "message"], event_rows, "events"), event_rows),
    ]
    return fragment("job", rv, "".join(body), job=obj.name, runs=str(len(status.get("runs") or [])))


def _actions(name: str, phase: Phase, admin: bool) -> str:
    """What an admin may do to the job now; a viewer sees no buttons."""
    if not admin:
        return ""
    active = phase != Phase.COMPLETED
    wanted = [
        ("cancel", active),
        ("suspend", active and phase != Phase.SUSPENDED),
        ("resume", phase == Phase.SUSPENDED),
        ("rerun", not active),
    ]
    buttons = "".join(
        f'<button type="button" class="action" data-action="{a}" data-job="{h(name)}">{a}</button>'
        for a, shown in wanted
        if shown
    )
    return f'<p class="actions">{buttons}</p>'


def _pairs(pairs: list[tuple[str, Any]]) -> str:
    rows = "".join(f"<tr><th>{h(k)}</th><td>{h(v)}</td></tr>" for k, v in pairs if v is not None and v != "")
    return f'<table class="pairs">{rows}</table>'


def _section(title: str, body: str, rows: list[Any]) -> str:
    return f"<section><h3>{h(title)}</h3>{body if rows else '<p class=empty>none</p>'}</section>"


def _receipt(receipt: dict[str, Any] | None) -> str:
    if receipt is None:
        return "pending"
    verdict = "satisfied" if receipt.get("satisfied") else "unsatisfiable"
    return f"{verdict}: {receipt.get('outcome')} at revision {receipt.get('revision')}"


# -- pools and their queues; nodes ---------------------------------------------------------------


def pools_view(store: Store) -> str:
    rv = store.change_seq()
    pools = reads.objects(store, "pools", [], None).objects
    queues = reads.pool_queues(store, QUEUE_SHOWN)
    rows = [
        [
            h(p.name),
            h(p.spec.get("slots", "unlimited")),
            h((p.status or {}).get("used", 0)),
            h((p.status or {}).get("queued", 0)),
            h(p.spec.get("maxBypass", 3)),
        ]
        for p in pools
    ]
    parts = [table(["pool", "slots", "used", "queued", "max bypass"], rows, "pools")]
    for pool in sorted(queues, key=lambda p: (p is not None, p or "")):
        length, jobs = queues[pool]
        queue_rows = [
            [
                h(ordinal(n)),
                job_link(o.name),
                h(o.spec.get("priority", 0)),
                h(o.spec.get("slots", 1)),
                h((o.status or {}).get("eligibleAt") or ""),
                h(why_waiting(o.spec, o.status) or ""),
            ]
            for n, o in enumerate(jobs, 1)
        ]
        more = f'<p class="note">and {length - len(jobs)} more</p>' if length > len(jobs) else ""
        parts.append(
            f'<section class="queue" data-pool="{h(pool or "")}"><h3>Queue of {h(line_name(pool))}: {length} '
            f"waiting, in admission order</h3>"
            + table(["position", "job", "priority", "slots", "eligible", "why it waits"], queue_rows, "queue")
            + more
            + "</section>"
        )
    if not queues:
        parts.append('<p class="empty">No job is queued.</p>')
    return fragment("pools", rv, "".join(parts))


def nodes_view(store: Store) -> str:
    rv = store.change_seq()
    rows = []
    for n in reads.objects(store, "nodes", [], None).objects:
        status = n.status or {}
        ready = next((c for c in status.get("conditions", []) if c.get("type") == "Ready"), None)
        readiness = "Ready" if ready and ready.get("status") == "True" else ("NotReady" if ready else "Unknown")
        capacity = (n.spec.get("capacity") or {}).get("slots") or status.get("cpuCount") or ""
        rows.append(
            [
                h(n.name),
                badge(readiness),
                "cordoned" if n.spec.get("unschedulable") else "yes",
                h(capacity),
                h((status.get("allocated") or {}).get("slots", 0)),
                h(status.get("address") or ""),
                h(ago(status.get("heartbeatAt")) if status.get("heartbeatAt") else ""),
                h(", ".join(f"{k}={v}" for k, v in n.labels.items())),
            ]
        )
    headers = ["node", "readiness", "schedulable", "slots", "allocated", "address", "heartbeat", "labels"]
    body = table(headers, rows, "nodes") if rows else '<p class="empty">No nodes.</p>'
    return fragment("nodes", rv, body)
