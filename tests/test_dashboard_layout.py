"""The dashboard's graph layout (server/dashboard/layout.py): depth columns, rows ordered by
the dependencies' rows, grouping beyond the limit, and escaped text."""

from __future__ import annotations

from reconciler.graph import Graph, GraphEdge, GraphNode
from reconciler.server.dashboard.layout import boxes, layers, svg


def _graph(states: dict[str, str], edges: list[tuple[str, str]]) -> Graph:
    return Graph(
        [GraphNode(n, s) for n, s in states.items()],
        [GraphEdge(a, b, ("Succeeded",)) for a, b in edges],
    )


DIAMOND = _graph(
    {"prepare": "Succeeded", "a": "Running", "b": "Queued", "report": "Waiting"},
    [("prepare", "a"), ("prepare", "b"), ("a", "report"), ("b", "report")],
)


def test_a_job_sits_one_column_right_of_its_deepest_dependency():
    chain_and_shortcut = _graph(
        {"x": "Succeeded", "y": "Succeeded", "z": "Running"}, [("x", "y"), ("y", "z"), ("x", "z")]
    )
    assert layers(chain_and_shortcut) == {"x": 0, "y": 1, "z": 2}
    assert layers(DIAMOND) == {"prepare": 0, "a": 1, "b": 1, "report": 2}


def test_rows_follow_the_dependencies_rows():
    # two chains side by side: each job lands on the row of its own dependency
    two = _graph(
        {"a1": "Waiting", "b1": "Waiting", "b2": "Waiting", "a2": "Waiting"},
        [("a1", "a2"), ("b1", "b2")],
    )
    drawn, _, grouped = boxes(two, limit=100)
    rows = {b.key: (b.column, b.row) for b in drawn}
    assert not grouped
    assert rows == {"a1": (0, 0), "b1": (0, 1), "b2": (1, 1), "a2": (1, 0)}


def test_each_job_is_a_box_coloured_by_state_linking_to_its_page():
    picture, grouped = svg(DIAMOND, limit=100)
    assert not grouped
    assert picture.count("<path") == 4
    assert 'class="job st-Running" data-job="a"' in picture
    assert 'href="/ui/jobs/report"' in picture


def test_beyond_the_limit_jobs_are_grouped_by_depth_and_state():
    states = {f"j{i}": ("Succeeded" if i % 2 else "Waiting") for i in range(10)}
    edges = [(f"j{i}", f"j{i + 5}") for i in range(5)]
    drawn, links, grouped = boxes(_graph(states, edges), limit=4)
    assert grouped
    assert sorted((b.column, b.state, b.count) for b in drawn) == [
        (0, "Succeeded", 2),
        (0, "Waiting", 3),
        (1, "Succeeded", 3),
        (1, "Waiting", 2),
    ]
    assert sum(n for _, _, n in links) == 5  # every job edge counted once
    assert all(b.href.startswith("/ui/jobs?phase=") for b in drawn)


def test_text_is_escaped():
    odd = _graph({"a": "<b>x</b>"}, [])
    picture, _ = svg(odd, limit=10)
    assert "<b>" not in picture and "&lt;b&gt;" in picture
