"""`graph`: the job graph with each job's state, as mermaid (default) or Graphviz dot text."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from ..errors import InvalidInput
from .context import ctx_of, err, selector_of

if TYPE_CHECKING:
    from ..graph import Graph, GraphNode

FORMATS = ("mermaid", "dot")

# state -> (fill, stroke): one mapping for both formats. Green done, red failed, orange ended
# without running to the end, blue running, yellow on its way, grey paused or going away;
# white with a dashed border for what is not stored (NotApplied grey, Missing red).
_GREEN, _RED, _ORANGE = ("#c8e6c9", "#2e7d32"), ("#ffcdd2", "#c62828"), ("#ffe0b2", "#ef6c00")
_BLUE, _YELLOW, _GREY = ("#bbdefb", "#1565c0"), ("#fff9c4", "#f9a825"), ("#e0e0e0", "#616161")
COLORS: dict[str, tuple[str, str]] = {
    "Succeeded": _GREEN,
    "Failed": _RED,
    "TimedOut": _RED,
    "Lost": _RED,
    "Aborted": _ORANGE,
    "Cancelled": _ORANGE,
    "Starting": _BLUE,
    "Running": _BLUE,
    "Stopping": _BLUE,
    "Waiting": _YELLOW,
    "Queued": _YELLOW,
    "Backoff": _YELLOW,
    "Suspended": _GREY,
    "Completed": _GREY,
    "Terminating": _GREY,
    "NotApplied": ("#ffffff", "#9e9e9e"),
    "Missing": ("#ffffff", "#c62828"),
}
DASHED = ("NotApplied", "Missing")


def style_class(state: str) -> str:
    """The class a node of this state gets (its CSS class in dot's SVG, too)."""
    return "".join(c for c in state.lower() if c.isalnum()) or "unknown"


def colors(state: str) -> tuple[str, str]:
    return COLORS.get(state, _GREY)


def _edge_label(outcomes: tuple[str, ...]) -> str | None:
    """Only what differs from the default edge (the dependency Succeeded) is written."""
    return None if outcomes == ("Succeeded",) else ", ".join(outcomes)


def _mermaid_text(text: str) -> str:
    """Text inside a quoted mermaid label: quotes and markup as entity codes."""
    codes = {"#": "#35;", '"': "#quot;", "<": "#lt;", ">": "#gt;", "\n": " ", "\r": " "}
    return "".join(codes.get(c, c) for c in text)


def mermaid(graph: Graph) -> str:
    """`flowchart LR`; nodes get ids n0, n1... (a job name such as `end` or `o-1` would be read
    as a keyword or an edge), their name and state in the label."""
    ids = {node.name: f"n{i}" for i, node in enumerate(graph.nodes)}
    lines = ["flowchart LR"]
    lines += [f'    {ids[n.name]}["{_mermaid_text(n.name)}<br/>{_mermaid_text(n.state)}"]' for n in graph.nodes]
    for e in graph.edges:
        label = _edge_label(e.outcomes)
        arrow = "-->" if label is None else f'-->|"{_mermaid_text(label)}"|'
        lines.append(f"    {ids[e.dependency]} {arrow} {ids[e.dependent]}")
    for state, members in _by_class(graph.nodes).items():
        fill, stroke = colors(members[0].state)
        dash = ",stroke-dasharray:5 5" if members[0].state in DASHED else ""
        lines.append(f"    classDef {state} fill:{fill},stroke:{stroke},color:#000000{dash}")
        lines.append(f"    class {','.join(ids[n.name] for n in members)} {state}")
    return "\n".join(lines)


def _dot_escape(text: str) -> str:
    """Text inside a quoted dot string: backslashes and quotes escaped, line breaks as spaces."""
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ").replace("\r", " ")


def _dot_string(text: str) -> str:
    return f'"{_dot_escape(text)}"'


def dot(graph: Graph) -> str:
    """A Graphviz digraph for `dot -Tsvg`: every name quoted, each node filled by its state
    and carrying its class (SVG output keeps it)."""
    lines = [
        "digraph jobs {",
        "    rankdir=LR;",
        '    node [shape=box, style="rounded,filled", fontname="Helvetica"];',
        '    edge [fontname="Helvetica", fontsize=10];',
    ]
    for n in graph.nodes:
        fill, stroke = colors(n.state)
        style = ', style="rounded,filled,dashed"' if n.state in DASHED else ""
        label = f'"{_dot_escape(n.name)}\\n{_dot_escape(n.state)}"'  # a backslash-n is dot's line break
        lines.append(
            f"    {_dot_string(n.name)} [label={label}, class={_dot_string(style_class(n.state))},"
            f' fillcolor="{fill}", color="{stroke}"{style}];'
        )
    for e in graph.edges:
        asks = _edge_label(e.outcomes)
        attrs = "" if asks is None else f" [label={_dot_string(asks)}]"
        lines.append(f"    {_dot_string(e.dependency)} -> {_dot_string(e.dependent)}{attrs};")
    lines.append("}")
    return "\n".join(lines)


def _by_class(nodes: list[GraphNode]) -> dict[str, list[GraphNode]]:
    groups: dict[str, list[GraphNode]] = {}
    for n in nodes:
        groups.setdefault(style_class(n.state), []).append(n)
    return groups


def graph(
    ctx: typer.Context,
    filename: list[str] = typer.Option(
        [], "-f", "--filename", help="Draw the jobs of these manifests, as they would be applied."
    ),
    recursive: bool = typer.Option(False, "-R", "--recursive", help="Read folders recursively."),
    selector: str | None = typer.Option(None, "-l", "--selector", help="Only the jobs matching it."),
    output: str = typer.Option("mermaid", "-o", "--output", help="mermaid | dot"),
) -> None:
    """The job graph with each job's state, as mermaid (default) or dot.

    Every stored job; with -f the jobs of those manifests as they would be applied (NotApplied:
    not stored yet); with -l the matching jobs. Edges go from a dependency to its dependent,
    labelled with the outcomes they accept when not just Succeeded; a dependency that does not
    exist is drawn as Missing."""
    from .resources import load_manifests

    if output not in FORMATS:
        raise InvalidInput(f"--output {output!r}: must be mermaid or dot")
    if filename and selector:
        raise InvalidInput("graph: give -f PATH or -l SELECTOR, not both")
    client = ctx_of(ctx).client
    if filename:
        drawn = client.manifest_graph(load_manifests(filename, recursive, verb="graph", warn=False))
    else:
        selector_of(selector)
        drawn = client.stored_graph(selector)
    if not drawn.nodes:
        err("No resources found.")
    typer.echo(mermaid(drawn) if output == "mermaid" else dot(drawn))


def register(app: typer.Typer) -> None:
    app.command()(graph)
