"""`graph`: the job graph with each job's state, as mermaid and as dot (parsed by Graphviz's
`dot -Tsvg`), of the store, of -l and of -f manifests; missing and not-applied jobs; exit codes."""

from __future__ import annotations

import re
import shutil
import subprocess

from .conftest import docs, job_yaml, pool_yaml

# the lines `graph -o mermaid` writes, each a statement of mermaid's flowchart grammar
MERMAID_NODE = re.compile(r'^    (n\d+)\["([^"<>]+)<br/>([A-Za-z]+)"\]$')
MERMAID_EDGE = re.compile(r'^    (n\d+) -->(?:\|"([A-Za-z, ]+)"\|)? (n\d+)$')
MERMAID_CLASSDEF = re.compile(r"^    classDef ([a-z]+) fill:(#[0-9a-f]{6}),stroke:(#[0-9a-f]{6}),color:#000000(,.*)?$")
MERMAID_CLASS = re.compile(r"^    class (n\d+(?:,n\d+)*) ([a-z]+)$")
DOT_NODE = re.compile(r'^    "([^"]+)" \[label="([^"]+)\\n([A-Za-z]+)", class="([a-z]+)", fillcolor="(#[0-9a-f]{6})"')
DOT_EDGE = re.compile(r'^    "([^"]+)" -> "([^"]+)"(?: \[label="([^"]+)"\])?;$')


def parse_mermaid(text: str) -> dict:
    """name -> state, (dependency, dependent, label) edges, class -> fill, name -> class; fails
    on any line outside the grammar above."""
    lines = text.splitlines()
    assert lines[0] == "flowchart LR", text
    ids, states, edges, fills, classes = {}, {}, [], {}, {}
    for line in lines[1:]:
        if m := MERMAID_NODE.match(line):
            ids[m[1]] = m[2]
            states[m[2]] = m[3]
        elif m := MERMAID_EDGE.match(line):
            edges.append((ids[m[1]], ids[m[3]], m[2]))
        elif m := MERMAID_CLASSDEF.match(line):
            fills[m[1]] = m[2]
        elif m := MERMAID_CLASS.match(line):
            for node in m[1].split(","):
                classes[ids[node]] = m[2]
        else:
            raise AssertionError(f"not a line of the flowchart grammar: {line!r}\n{text}")
    return {"states": states, "edges": edges, "fills": fills, "classes": classes}


def parse_dot(text: str) -> dict:
    states, edges, fills = {}, [], {}
    for line in text.splitlines():
        if m := DOT_NODE.match(line):
            assert m[1] == m[2]
            states[m[1]] = m[3]
            fills[m[4]] = m[5]
        elif m := DOT_EDGE.match(line):
            edges.append((m[1], m[2], m[3]))
    return {"states": states, "edges": edges, "fills": fills}


def svg_of(text: str) -> str:
    """What Graphviz makes of it: a parse error is a failure here."""
    assert shutil.which("dot"), "Graphviz's dot is needed (.ci/run installs it)"
    proc = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return proc.stdout


def _pipeline() -> str:
    """prepare and lint first; test takes lint's failure too; deploy needs lint to succeed
    (Aborted); `end` (a mermaid keyword) after test; `later` waits for a file."""
    return docs(
        job_yaml("prepare", "command: ['true']", "{stage: build}"),
        job_yaml("lint", "command: ['false']", "{stage: build}"),
        job_yaml(
            "test",
            "command: ['true']\ndependsOn: [prepare, {job: lint, outcomes: [Succeeded, Failed]}]",
            "{stage: test}",
        ),
        job_yaml("deploy", "command: ['true']\ndependsOn: [lint]", "{stage: ship}"),
        job_yaml("end", "command: ['true']\ndependsOn: [test]", "{stage: ship}"),
    )


EXPECTED_STATES = {
    "prepare": "Succeeded",
    "lint": "Failed",
    "test": "Succeeded",
    "deploy": "Aborted",
    "end": "Succeeded",
}
EXPECTED_EDGES = [
    ("lint", "deploy", None),
    ("lint", "test", "Succeeded, Failed"),
    ("prepare", "test", None),
    ("test", "end", None),
]


def test_graph_of_a_dag_in_both_formats(env):
    manifest = env.write("pipeline.yaml", _pipeline())
    assert env.up(manifest).code == 1  # lint failed, deploy was aborted

    mermaid = env.ok("graph")
    assert mermaid.stderr == ""
    drawn = parse_mermaid(mermaid.stdout)
    assert drawn["states"] == EXPECTED_STATES
    assert sorted(drawn["edges"], key=str) == sorted(EXPECTED_EDGES, key=str)
    # dependencies before dependents: the text reads like the pipeline
    order = list(drawn["states"])
    assert all(order.index(a) < order.index(b) for a, b, _ in drawn["edges"])
    # a class per state, colouring its nodes; the same mapping in both formats
    assert drawn["classes"] == {name: state.lower() for name, state in EXPECTED_STATES.items()}
    assert len({drawn["fills"]["succeeded"], drawn["fills"]["failed"], drawn["fills"]["aborted"]}) == 3

    dot = env.ok("graph", "-o", "dot").stdout
    assert dot.startswith("digraph jobs {") and dot.rstrip().endswith("}")
    as_dot = parse_dot(dot)
    assert as_dot["states"] == EXPECTED_STATES
    assert sorted(as_dot["edges"], key=str) == sorted(EXPECTED_EDGES, key=str)
    assert as_dot["fills"] == drawn["fills"]
    svg = svg_of(dot)
    assert svg.count('class="node succeeded"') == 3 and 'class="node aborted"' in svg
    assert ">Succeeded, Failed<" in svg  # the edge's label, drawn

    refused = env.cli("graph", "-o", "svg")
    assert refused.code == 2 and refused.stdout == "" and "mermaid or dot" in refused.stderr


def test_graph_by_selector_and_of_a_deleted_dependency(env):
    manifest = env.write("pipeline.yaml", _pipeline())
    assert env.up(manifest).code == 1

    # -l: the matching jobs and the edges between them, none to jobs left out
    build_and_test = parse_mermaid(env.ok("graph", "-l", "stage in (build,test)").stdout)
    assert build_and_test["states"] == {"prepare": "Succeeded", "lint": "Failed", "test": "Succeeded"}
    assert sorted(build_and_test["edges"], key=str) == [
        ("lint", "test", "Succeeded, Failed"),
        ("prepare", "test", None),
    ]
    ship = parse_dot(env.ok("graph", "-l", "stage=ship", "-o", "dot").stdout)
    assert ship == {"states": {"deploy": "Aborted", "end": "Succeeded"}, "edges": [], "fills": ship["fills"]}

    # a dependency that no longer exists is a Missing node, in both formats
    env.ok("delete", "job", "prepare")
    drawn = parse_mermaid(env.ok("graph", "-l", "stage=test").stdout)
    assert drawn["states"] == {"prepare": "Missing", "test": "Succeeded"}
    assert drawn["edges"] == [("prepare", "test", None)]
    assert "stroke-dasharray" in env.ok("graph").stdout
    dot = env.ok("graph", "-o", "dot").stdout
    assert parse_dot(dot)["states"]["prepare"] == "Missing"
    assert 'class="node missing"' in svg_of(dot)

    nothing = env.cli("graph", "-l", "stage=none")
    assert nothing.code == 0 and nothing.stderr.strip() == "No resources found."
    assert nothing.stdout.strip() == "flowchart LR"
    svg_of(env.ok("graph", "-l", "stage=none", "-o", "dot").stdout)  # an empty graph is still a graph


def test_graph_of_manifests(env):
    assert env.up(env.write("base.yaml", job_yaml("base", "command: ['true']"))).code == 0
    planned = env.write(
        "planned.yaml",
        docs(
            job_yaml("base", "command: ['true']"),
            job_yaml("next", "command: ['true']\ndependsOn: [base, {job: gone, outcomes: [Finished]}]"),
            pool_yaml("spare", 1),
        ),
    )
    # the jobs as they would be applied: stored ones with their state, new ones NotApplied, a
    # dependency neither stored nor given Missing
    drawn = parse_mermaid(env.ok("graph", "-f", str(planned)).stdout)
    assert drawn["states"] == {"base": "Succeeded", "gone": "Missing", "next": "NotApplied"}
    assert sorted(drawn["edges"], key=str) == [("base", "next", None), ("gone", "next", "Finished")]
    dot = env.ok("graph", "-f", str(planned), "-o", "dot").stdout
    assert parse_dot(dot)["states"] == drawn["states"]
    svg_of(dot)
    # a dependency outside the manifests but stored is drawn with its state
    only_next = env.write("next.yaml", job_yaml("next", "command: ['true']\ndependsOn: [base]"))
    assert parse_mermaid(env.ok("graph", "-f", str(only_next)).stdout)["states"] == {
        "base": "Succeeded",
        "next": "NotApplied",
    }
    assert env.peek("next") is None  # graph stores nothing

    pools_only = env.write("pools.yaml", pool_yaml("spare", 1))
    no_jobs = env.cli("graph", "-f", str(pools_only))
    assert no_jobs.code == 3 and no_jobs.stdout == "" and "no jobs" in no_jobs.stderr
    assert env.cli("graph", "-f", str(env.root / "absent.yaml")).code == 2
    assert env.cli("graph", "-f", str(planned), "-l", "a=b").code == 2
    broken = env.write("broken.yaml", job_yaml("bad", "command: ['true']\nbogus: 1"))
    invalid = env.cli("graph", "-f", str(broken))
    assert invalid.code == 2 and "bogus" in invalid.stderr
