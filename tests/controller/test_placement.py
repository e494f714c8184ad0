"""placement.py: candidate filtering, the Unschedulable message, and the three strategies."""

from __future__ import annotations

import pytest

from reconciler.controller.placement import NodeView, Placement, place


def node(
    name: str, *, capacity: int = 4, allocated: int = 0, ready: bool = True, cordoned: bool = False, **labels: str
) -> NodeView:
    return NodeView(name, ready, cordoned, capacity, allocated, dict(labels))


def pick(nodes, *, slots=1, node_name=None, selector=None, strategy="spread", turn=0) -> Placement:
    return place(nodes, slots=slots, node_name=node_name, selector=selector or {}, strategy=strategy, turn=turn)


# --- filtering -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "kwargs", "expected"),
    [
        pytest.param([node("a", ready=False), node("b")], {}, "b", id="skips-not-ready"),
        pytest.param([node("a", cordoned=True), node("b")], {}, "b", id="skips-cordoned"),
        pytest.param([node("a", allocated=4), node("b", capacity=1)], {}, "b", id="skips-full"),
        pytest.param([node("a", capacity=8), node("b", capacity=2)], {"slots": 3}, "a", id="skips-too-small"),
        pytest.param(
            [node("a", capacity=2, allocated=1), node("b", capacity=8, allocated=6)],
            {"slots": 2},
            "b",
            id="needs-free-not-capacity",
        ),
        pytest.param(
            [node("a", capacity=8), node("b", capacity=1)],
            {"node_name": "b"},
            "b",
            id="nodeName-pins-even-against-strategy",
        ),
        pytest.param(
            [node("a", capacity=8), node("b", gpu="true")],
            {"selector": {"gpu": "true"}},
            "b",
            id="nodeSelector-matches-label",
        ),
        pytest.param(
            [node("a", gpu="false"), node("b", gpu="true", zone="x")],
            {"selector": {"gpu": "true", "zone": "x"}},
            "b",
            id="nodeSelector-needs-all-labels",
        ),
        pytest.param([node("only")], {}, "only", id="single-candidate"),
    ],
)
def test_place_filters_candidates(nodes, kwargs, expected):
    assert pick(nodes, **kwargs).node == expected


@pytest.mark.parametrize(
    ("nodes", "kwargs", "message"),
    [
        pytest.param([], {}, "0/0 nodes are available", id="no-nodes"),
        pytest.param([node("a", ready=False)], {}, "0/1 nodes are available: 1 not ready", id="not-ready"),
        pytest.param(
            [node("a", cordoned=True)], {}, "0/1 nodes are available: 1 unschedulable (cordoned)", id="cordoned"
        ),
        pytest.param([node("a", allocated=4)], {}, "0/1 nodes are available: 1 insufficient slots", id="full"),
        pytest.param(
            [node("a"), node("b")],
            {"node_name": "c"},
            "0/2 nodes are available: 2 didn't match nodeName",
            id="nodeName-missing",
        ),
        pytest.param(
            [node("a", gpu="false")],
            {"selector": {"gpu": "true"}},
            "0/1 nodes are available: 1 didn't match nodeSelector",
            id="selector-value-differs",
        ),
        pytest.param(
            [node("a")],
            {"selector": {"gpu": "true"}},
            "0/1 nodes are available: 1 didn't match nodeSelector",
            id="selector-label-absent",
        ),
        pytest.param(
            [node("a", allocated=4), node("b", ready=False), node("c", cordoned=True)],
            {},
            "0/3 nodes are available: 1 insufficient slots, 1 not ready, 1 unschedulable (cordoned)",
            id="three-reasons-counted",
        ),
        pytest.param(
            [node("a", allocated=3), node("b", capacity=1), node("c", ready=False)],
            {"slots": 2},
            "0/3 nodes are available: 2 insufficient slots, 1 not ready",
            id="reasons-aggregated",
        ),
        pytest.param(
            [node("a", gpu="true", ready=False), node("b"), node("c", gpu="true", cordoned=True)],
            {"selector": {"gpu": "true"}},
            "0/3 nodes are available: 1 didn't match nodeSelector, 1 not ready, 1 unschedulable (cordoned)",
            id="selector-and-health",
        ),
        pytest.param(
            [node("a", ready=False, cordoned=True, allocated=4)],
            {},
            "0/1 nodes are available: 1 not ready",
            id="one-reason-per-node",
        ),
    ],
)
def test_unschedulable_message_counts_reasons(nodes, kwargs, message):
    assert pick(nodes, **kwargs) == Placement(None, message)


# --- strategies ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param([node("a", capacity=4, allocated=3), node("b", capacity=4, allocated=1)], "b", id="more-free"),
        pytest.param(
            [node("big", capacity=16, allocated=8), node("small", capacity=4, allocated=1)],
            "small",
            id="free-share-not-free-count",
        ),
        pytest.param(
            [node("a", capacity=4, allocated=2), node("b", capacity=8, allocated=4)],
            "b",
            id="equal-share-then-more-free",
        ),
        pytest.param([node("b-node"), node("a-node"), node("c-node")], "a-node", id="full-tie-by-name"),
    ],
)
def test_spread_picks_most_free_share(nodes, expected):
    assert pick(nodes, strategy="spread").node == expected


def test_spread_is_the_default():
    nodes = [node("a", allocated=3), node("b", allocated=0)]
    assert place(nodes, slots=1, node_name=None, selector={}).node == "b"


@pytest.mark.parametrize(
    ("nodes", "expected"),
    [
        pytest.param([node("a", capacity=4, allocated=3), node("b", capacity=4, allocated=1)], "a", id="least-free"),
        pytest.param(
            [node("big", capacity=16, allocated=14), node("small", capacity=4, allocated=1)],
            "big",
            id="least-free-count-not-share",
        ),
        pytest.param([node("b"), node("a"), node("c")], "a", id="tie-by-name"),
        pytest.param(
            [node("a", capacity=4, allocated=4), node("b", capacity=4, allocated=2)],
            "b",
            id="full-node-is-no-candidate",
        ),
    ],
)
def test_binpack_picks_least_free(nodes, expected):
    assert pick(nodes, strategy="binpack").node == expected


@pytest.mark.parametrize(
    ("turn", "expected"),
    [
        pytest.param(0, "a", id="turn-0"),
        pytest.param(1, "b", id="turn-1"),
        pytest.param(2, "c", id="turn-2"),
        pytest.param(3, "a", id="turn-3-wraps"),
        pytest.param(100, "b", id="turn-100"),
    ],
)
def test_round_robin_takes_turn_modulo_candidates_in_name_order(turn, expected):
    nodes = [node("c"), node("a", allocated=3), node("b", capacity=100)]  # load and input order ignored
    assert pick(nodes, strategy="round-robin", turn=turn).node == expected


def test_round_robin_counts_only_candidates():
    nodes = [node("a"), node("b", ready=False), node("c"), node("d", cordoned=True)]
    assert [pick(nodes, strategy="round-robin", turn=t).node for t in range(4)] == ["a", "c", "a", "c"]


@pytest.mark.parametrize("strategy", ["spread", "binpack", "round-robin"])
def test_placement_message_names_node_and_strategy(strategy):
    assert pick([node("w1")], strategy=strategy) == Placement("w1", f"placed on w1 ({strategy})")


@pytest.mark.parametrize("strategy", ["spread", "binpack", "round-robin"])
def test_strategy_never_picks_a_non_candidate(strategy):
    nodes = [
        node("a", ready=False, capacity=100),
        node("b", cordoned=True, capacity=100),
        node("c", allocated=4),
        node("d", capacity=2, allocated=1),
    ]
    assert [pick(nodes, strategy=strategy, turn=t).node for t in range(3)] == ["d", "d", "d"]


# --- cpu and memory, where a node declares them ------------------------------------------------
GiB = 1 << 30


def sized(name: str, *, cpu: float | None = None, memory: int | None = None, cpu_used=0.0, memory_used=0) -> NodeView:
    return NodeView(name, True, False, 8, 0, {}, frozenset(), cpu, memory, cpu_used, memory_used)


@pytest.mark.parametrize(
    ("node", "cpu", "memory", "expected"),
    [
        pytest.param(sized("a", cpu=2, cpu_used=1), 1, 0, "a", id="second-cpu-fits"),
        pytest.param(sized("a", cpu=2, cpu_used=2), 1, 0, None, id="third-cpu-does-not"),
        pytest.param(sized("a", cpu=1, cpu_used=0.7), 0.3, 0, "a", id="exact-thousandths-fit"),
        pytest.param(sized("a", memory=GiB, memory_used=GiB // 2), 0, GiB // 2, "a", id="memory-fits"),
        pytest.param(sized("a", memory=GiB, memory_used=GiB // 2), 0, GiB // 2 + 1, None, id="memory-short"),
        pytest.param(sized("a"), 500, 100 * GiB, "a", id="undeclared-not-counted"),
    ],
)
def test_declared_cpu_and_memory_are_counted(node, cpu, memory, expected):
    assert place([node], slots=1, node_name=None, selector={}, cpu=cpu, memory=memory).node == expected


def test_the_unschedulable_message_names_the_short_resource():
    nodes = [sized("a", cpu=2, cpu_used=2), sized("b", memory=GiB, memory_used=GiB)]
    placed = place(nodes, slots=1, node_name=None, selector={}, cpu=1, memory=GiB)
    assert placed.message == "0/2 nodes are available: 1 insufficient cpu, 1 insufficient memory"
