"""The job graph as SVG, laid out on the server: layers by depth (a job one column right of
its deepest dependency), each column ordered by where its jobs' dependencies sit, so edges
mostly run straight. Beyond `limit` jobs the picture would be unreadable and slow to
draw, so jobs are grouped by (depth, state) with their counts, and the edges between groups."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from html import escape
from urllib.parse import quote

from ...graph import Graph

BOX_W, BOX_H = 170, 30  # a job's box
COL_GAP, ROW_GAP = 60, 12
MARGIN = 10
NAME_CHARS = 22  # longer names are cut (the full name is in the box's tooltip)


@dataclass(frozen=True)
class Box:
    key: str  # a job's name, or "depth/state" of a group
    label: str
    state: str
    href: str
    count: int  # 1 for a job
    column: int
    row: int


def layers(graph: Graph) -> dict[str, int]:
    """Each job's depth: 0 without dependencies, else one more than its deepest dependency.
    graph.nodes come dependencies first, so one pass is enough."""
    needs: defaultdict[str, list[str]] = defaultdict(list)
    for edge in graph.edges:
        needs[edge.dependent].append(edge.dependency)
    depth: dict[str, int] = {}
    for node in graph.nodes:
        depth[node.name] = 1 + max((depth.get(d, 0) for d in needs[node.name]), default=-1)
    return depth


def _ordered_columns(keys: list[str], column: dict[str, int], needs: dict[str, list[str]]) -> dict[str, int]:
    """Row of each key in its column: by the mean row of its dependencies (one sweep, left to
    right), ties kept in the given order."""
    row: dict[str, int] = {}
    by_column: defaultdict[int, list[str]] = defaultdict(list)
    for key in keys:
        by_column[column[key]].append(key)
    for c in sorted(by_column):
        members = by_column[c]

        def weight(key: str, index: int) -> tuple[float, int]:
            rows = [row[d] for d in needs.get(key, []) if d in row]
            return (sum(rows) / len(rows) if rows else float(index), index)

        ranked = sorted(enumerate(members), key=lambda pair: weight(pair[1], pair[0]))
        for r, (_, key) in enumerate(ranked):
            row[key] = r
    return row


def boxes(graph: Graph, limit: int) -> tuple[list[Box], list[tuple[str, str, int]], bool]:
    """The boxes to draw, the edges between them (from, to, how many job edges), and whether
    the jobs were grouped."""
    depth = layers(graph)
    if len(graph.nodes) <= limit:
        needs: defaultdict[str, list[str]] = defaultdict(list)
        for e in graph.edges:
            needs[e.dependent].append(e.dependency)
        keys = [n.name for n in graph.nodes]
        rows = _ordered_columns(keys, depth, needs)
        drawn = [
            Box(n.name, n.name, n.state, f"/ui/jobs/{quote(n.name)}", 1, depth[n.name], rows[n.name])
            for n in graph.nodes
        ]
        return drawn, [(e.dependency, e.dependent, 1) for e in graph.edges], False
    group = {n.name: f"{depth[n.name]}/{n.state}" for n in graph.nodes}
    counts: dict[str, tuple[int, str, int]] = {}  # key -> (depth, state, jobs)
    for n in graph.nodes:
        d, _, c = counts.get(group[n.name], (depth[n.name], n.state, 0))
        counts[group[n.name]] = (d, n.state, c + 1)
    edge_counts: defaultdict[tuple[str, str], int] = defaultdict(int)
    for e in graph.edges:
        edge_counts[(group[e.dependency], group[e.dependent])] += 1
    group_needs: defaultdict[str, list[str]] = defaultdict(list)
    for a, b in edge_counts:
        group_needs[b].append(a)
    keys = sorted(counts, key=lambda k: (counts[k][0], counts[k][1]))
    rows = _ordered_columns(keys, {k: counts[k][0] for k in keys}, group_needs)
    drawn = [Box(k, f"{s} × {c}", s, f"/ui/jobs?phase={quote(s)}", c, d, rows[k]) for k, (d, s, c) in counts.items()]
    return drawn, [(a, b, n) for (a, b), n in edge_counts.items()], True


def svg(graph: Graph, limit: int) -> tuple[str, bool]:
    """The graph's SVG, and whether jobs were grouped."""
    drawn, edges, grouped = boxes(graph, limit)
    at = {b.key: (MARGIN + b.column * (BOX_W + COL_GAP), MARGIN + b.row * (BOX_H + ROW_GAP)) for b in drawn}
    width = max((x for x, _ in at.values()), default=0) + BOX_W + MARGIN
    height = max((y for _, y in at.values()), default=0) + BOX_H + MARGIN
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="job graph">'
    ]
    for a, b, n in edges:
        (left, top), (x2, bottom) = at[a], at[b]
        x1, y1, y2 = left + BOX_W, top + BOX_H // 2, bottom + BOX_H // 2  # right side to left side
        mid = (x1 + x2) // 2
        title = f"<title>{n} dependencies</title>" if grouped else ""
        parts.append(
            f'<path class="edge" data-from="{escape(a)}" data-to="{escape(b)}" '
            f'd="M{x1},{y1} C{mid},{y1} {mid},{y2} {x2},{y2}">{title}</path>'
        )
    for box in drawn:
        x, y = at[box.key]
        label = box.label if len(box.label) <= NAME_CHARS else box.label[: NAME_CHARS - 1] + "…"
        attr = "data-group" if grouped else "data-job"
        parts.append(
            f'<a href="{escape(box.href)}"><g class="job st-{escape(box.state)}" {attr}="{escape(box.key)}">'
            f"<title>{escape(box.label)}: {escape(box.state)}</title>"
            f'<rect x="{x}" y="{y}" width="{BOX_W}" height="{BOX_H}" rx="5"/>'
            f'<text x="{x + 8}" y="{y + BOX_H // 2 + 4}">{escape(label)}</text></g></a>'
        )
    parts.append("</svg>")
    return "".join(parts), grouped
