"""Diagrams and docs of a machine spec: Mermaid, DOT, SVG/PNG, Markdown.

Every renderer draws the *declared* hierarchy (`fsm.graph.build_graph`), not the
flat configurations, and its output is deterministic: the same spec gives the same
bytes (Graphviz images aside, which depend on the installed Graphviz).

- `render_mermaid(spec, highlight=None)` — Mermaid ``stateDiagram-v2`` text. Nested
  states are ``state X { ... }`` composites, parallel regions are separated by
  ``--``; a parallel machine wraps its regions in one composite named after the
  machine. State ids are dotted paths with ``.`` turned into ``_`` (made unique),
  labelled ``state "queued" as prepared_queued``. ``[*] --> initial`` and
  ``final --> [*]`` mark initial and final states.
- `render_dot(spec, highlight=None)` — Graphviz DOT text: compound and parallel
  states are clusters (regions dashed), a point marks each initial state, finals
  are double circles; an edge to or from a composite state is drawn to its cluster's
  border (``compound=true``, ``lhead``/``ltail``).
- `render_image(spec, fmt, highlight=None)` — SVG or PNG bytes from the DOT text
  through the ``dot`` program; `GraphvizNotFoundError` when it is not installed,
  `GraphvizFailedError` when it rejects the input.
- `render_transition_table(spec)` — a Markdown table, one row per declared transition.
- `render_markdown_doc(spec)` — the content of ``specs/<machine>.md`` (regenerated
  by ``unicache-fsm docs``; a test fails when the committed files drift).

`highlight` names a state by dotted path; it is filled in the diagram (Mermaid:
``classDef highlight`` + ``class <id> highlight``); a path the spec does not declare
raises `UnknownStateError`. Edge labels come from `fsm.graph.edge_label`.

`coverage` (counts per declared arrow, `fsm.coverage.Coverage.declared`) adds how often
each arrow was taken to its label — ``(12x)`` or ``(never taken)`` — and in DOT/SVG
colours it: never-taken arrows red and dashed, taken ones blue, wider with log count.
"""

from __future__ import annotations

import enum
import math
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping

import attrs

from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.fsm.graph import GraphEdge, GraphNode, MachineGraph, build_graph
from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, StateKind, TransitionSpec

__all__ = [
    "HIGHLIGHT_COLOR",
    "DiagramFormat",
    "GraphvizFailedError",
    "GraphvizNotFoundError",
    "render_dot",
    "render_image",
    "render_markdown_doc",
    "render_mermaid",
    "render_transition_table",
]

#: The fill of a highlighted state, in both Mermaid and DOT.
HIGHLIGHT_COLOR = "#ff9966"
#: With coverage: arrows never taken (dashed), and arrows taken (width grows with log count).
NEVER_COLOR = "#cc0000"
TAKEN_COLOR = "#1f5fbf"

_INDENT = "    "
_GRAPHVIZ_TIMEOUT_S = 60.0


class DiagramFormat(str, enum.Enum):
    """What `unicache-fsm diagram` can produce."""

    MERMAID = "mermaid"
    DOT = "dot"
    SVG = "svg"
    PNG = "png"

    @property
    def is_image(self) -> bool:
        """Whether the format is binary output made by Graphviz."""
        return self in (DiagramFormat.SVG, DiagramFormat.PNG)


class GraphvizNotFoundError(UnicacheFsmError, RuntimeError):
    """The Graphviz ``dot`` program, needed for SVG and PNG, is not on PATH."""

    def __init__(self, fmt: str) -> None:
        self.format = fmt
        super().__init__(
            f"rendering {fmt} needs the Graphviz 'dot' program, which is not on PATH; install "
            "Graphviz (apt-get install graphviz / brew install graphviz / "
            "conda install graphviz) or use --format mermaid or dot"
        )


class GraphvizFailedError(UnicacheFsmError, RuntimeError):
    """The ``dot`` program failed on the DOT text we gave it (a bug on our side)."""

    def __init__(self, machine: str, fmt: str, detail: str) -> None:
        self.machine = machine
        self.format = fmt
        self.detail = detail
        super().__init__(
            f"Graphviz failed to render machine {machine!r} as {fmt}: {detail}; "
            "please report it with the output of --format dot"
        )


# -- Mermaid ---------------------------------------------------------------------------

# Words the stateDiagram-v2 lexer treats specially; an id equal to one gets a suffix.
_MERMAID_RESERVED = frozenset(
    {
        "as",
        "class",
        "classDef",
        "click",
        "default",
        "direction",
        "end",
        "hide",
        "left",
        "note",
        "of",
        "right",
        "scale",
        "state",
        "style",
    }
)
_NOT_ID = re.compile(r"[^A-Za-z0-9_]")


def _mermaid_text(text: str) -> str:
    """Text safe inside a Mermaid label: entity codes for the characters it parses."""
    out = " ".join(text.split())
    for ch, code in (("#", "#35;"), (";", "#59;"), ('"', "#quot;"), ("{", "#123;"), ("}", "#125;")):
        out = out.replace(ch, code)
    return out


def _mermaid_ids(graph: MachineGraph) -> dict[str, str]:
    """A unique Mermaid id per node path ("" is the parallel wrapper of the machine)."""
    ids: dict[str, str] = {}
    taken: set[str] = set()

    def claim(path: str, base: str) -> None:
        base = _NOT_ID.sub("_", base) or "machine"
        if not base[0].isalpha():
            base = f"s_{base}"
        if base in _MERMAID_RESERVED:
            base = f"{base}_"
        candidate, n = base, 2
        while candidate in taken:
            candidate, n = f"{base}_{n}", n + 1
        taken.add(candidate)
        ids[path] = candidate

    for node in graph.nodes():
        claim(node.path, node.path.replace(".", "_"))
    claim("", graph.machine)
    return ids


class _MermaidWriter:
    def __init__(self, graph: MachineGraph) -> None:
        self.graph = graph
        self.ids = _mermaid_ids(graph)
        self.edges: dict[str, list[GraphEdge]] = {}
        for e in graph.edges:
            self.edges.setdefault(e.domain, []).append(e)
        self.lines: list[str] = []

    def emit(self, depth: int, text: str) -> None:
        self.lines.append(f"{_INDENT * depth}{text}")

    def label(self, depth: int, node: GraphNode, *, bare: bool) -> None:
        """Declare a node: ``state "name" as id`` when they differ, else a bare id."""
        node_id = self.ids[node.path]
        if node_id != node.name:
            self.emit(depth, f'state "{_mermaid_text(node.name)}" as {node_id}')
        elif bare:
            self.emit(depth, node_id)

    def composite(self, depth: int, node: GraphNode) -> None:
        self.emit(depth, f"state {self.ids[node.path]} {{")
        self.body(depth + 1, node)
        self.emit(depth, "}")

    def body(self, depth: int, node: GraphNode) -> None:
        """The contents of a composite (or of the diagram, for the root)."""
        if node.kind is StateKind.PARALLEL:
            assert node.path not in self.edges, "validation rejects cross-region transitions"
            for i, region in enumerate(node.children):
                if i:
                    self.emit(depth, "--")
                self.label(depth, region, bare=False)
                self.composite(depth, region)
            return
        for child in node.children:
            self.label(depth, child, bare=child.kind is StateKind.ATOMIC)
        if node.initial is not None:
            self.emit(depth, f"[*] --> {self.ids[node.initial]}")
        for child in node.children:
            if child.kind is not StateKind.ATOMIC:
                self.composite(depth, child)
        for child in node.children:
            if child.final:
                self.emit(depth, f"{self.ids[child.path]} --> [*]")
        for e in self.edges.get(node.path, ()):
            src, dst = self.ids[e.source], self.ids[e.dest]
            self.emit(depth, f"{src} --> {dst} : {_mermaid_text(_counted_label(e))}")

    def render(self, highlight: str | None) -> str:
        self.emit(0, "stateDiagram-v2")
        root = self.graph.root
        if root.kind is StateKind.PARALLEL:
            self.label(1, root, bare=False)
            self.emit(1, f"[*] --> {self.ids['']}")
            self.composite(1, root)
        else:
            self.body(1, root)
        if highlight is not None:
            node = self.graph.node(highlight)
            self.emit(1, "classDef highlight fill:#f96,stroke:#333,stroke-width:2px")
            self.emit(1, f"class {self.ids[node.path]} highlight")
        return "\n".join(self.lines) + "\n"


Coverage = Mapping[tuple[int, str], int]


def _graph(spec: MachineSpec, highlight: str | None, coverage: Coverage | None) -> MachineGraph:
    graph = build_graph(spec)
    if highlight is not None:
        graph.node(highlight)  # fail before rendering anything
    if coverage is not None:
        edges = tuple(attrs.evolve(e, count=coverage.get(e.key, 0)) for e in graph.edges)
        graph = attrs.evolve(graph, edges=edges)
    return graph


def _counted_label(edge: GraphEdge) -> str:
    if edge.count is None:
        return edge.label
    return f"{edge.label} ({edge.count}x)" if edge.count else f"{edge.label} (never taken)"


def render_mermaid(
    spec: MachineSpec, highlight: str | None = None, coverage: Coverage | None = None
) -> str:
    """Mermaid ``stateDiagram-v2`` text of a spec; see the module docstring."""
    return _MermaidWriter(_graph(spec, highlight, coverage)).render(highlight)


# -- DOT -------------------------------------------------------------------------------


def _dot_quote(text: str) -> str:
    escaped = " ".join(text.split()).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def _initial_marker(path: str) -> str:
    """The DOT id of a composite's initial point (paths never contain ``/``)."""
    return f"{path}/[*]"


class _DotWriter:
    def __init__(self, graph: MachineGraph, highlight: str | None) -> None:
        self.graph = graph
        self.highlight = highlight
        self.lines: list[str] = []

    def emit(self, depth: int, text: str) -> None:
        self.lines.append(f"{_INDENT * depth}{text}")

    def anchor(self, path: str) -> tuple[str, str | None]:
        """The node an edge to/from `path` attaches to, and the cluster it clips at."""
        node = self.graph.node(path)
        if node.kind is StateKind.ATOMIC:
            return path, None
        inner = node
        while inner.kind is StateKind.PARALLEL:  # a parallel state: its first region
            inner = inner.children[0]
        return _initial_marker(inner.path), f"cluster_{path}"

    def node_line(self, depth: int, node: GraphNode) -> None:
        attrs = [f"label={_dot_quote(node.name)}"]
        if node.final:
            attrs.append("shape=doublecircle")
        if node.path == self.highlight:
            style = "filled" if node.final else "rounded,filled"
            attrs += [f'style="{style}"', f'fillcolor="{HIGHLIGHT_COLOR}"']
        self.emit(depth, f"{_dot_quote(node.path)} [{', '.join(attrs)}];")

    def cluster(self, depth: int, node: GraphNode) -> None:
        self.emit(depth, f"subgraph {_dot_quote('cluster_' + node.path)} {{")
        style = "dashed" if node.region else "rounded"
        if node.path == self.highlight:
            style += ",filled"
            self.emit(depth + 1, f'fillcolor="{HIGHLIGHT_COLOR}";')
        self.emit(depth + 1, f"label={_dot_quote(node.name)};")
        self.emit(depth + 1, f'style="{style}";')
        self.body(depth + 1, node)
        self.emit(depth, "}")

    def body(self, depth: int, node: GraphNode) -> None:
        if node.initial is not None:
            marker = _initial_marker(node.path)
            self.emit(depth, f'{_dot_quote(marker)} [shape=point, width=0.15, label=""];')
        for child in node.children:
            if child.kind is StateKind.ATOMIC:
                self.node_line(depth, child)
            else:
                self.cluster(depth, child)
        if node.initial is not None:
            head, lhead = self.anchor(node.initial)
            arrow = f"{_dot_quote(_initial_marker(node.path))} -> {_dot_quote(head)}"
            if lhead is not None:
                arrow += f" [lhead={_dot_quote(lhead)}]"
            self.emit(depth, f"{arrow};")

    def edge(self, depth: int, edge: GraphEdge) -> None:
        tail, ltail = self.anchor(edge.source)
        head, lhead = self.anchor(edge.dest)
        attrs = [f"label={_dot_quote(_counted_label(edge))}"]
        # Graphviz ignores (with a warning) a clip at a cluster holding both ends.
        if ltail is not None and ltail != lhead:
            attrs.append(f"ltail={_dot_quote(ltail)}")
        if lhead is not None and lhead != ltail:
            attrs.append(f"lhead={_dot_quote(lhead)}")
        if edge.count == 0:
            attrs += [f'color="{NEVER_COLOR}"', f'fontcolor="{NEVER_COLOR}"', "style=dashed"]
        elif edge.count is not None:
            width = 1.0 + math.log10(edge.count)
            attrs += [f'color="{TAKEN_COLOR}"', f"penwidth={width:.1f}"]
        self.emit(depth, f"{_dot_quote(tail)} -> {_dot_quote(head)} [{', '.join(attrs)}];")

    def render(self) -> str:
        graph = self.graph
        self.emit(0, f"digraph {_dot_quote(graph.machine)} {{")
        self.emit(1, "compound=true;")
        self.emit(1, 'fontname="Helvetica";')
        self.emit(1, f"label={_dot_quote(graph.machine)};")
        self.emit(1, "labelloc=t;")
        self.emit(1, 'node [shape=box, style=rounded, fontname="Helvetica"];')
        self.emit(1, 'edge [fontname="Helvetica", fontsize=10];')
        self.body(1, graph.root)
        for e in graph.edges:
            self.edge(1, e)
        self.emit(0, "}")
        return "\n".join(self.lines) + "\n"


def render_dot(
    spec: MachineSpec, highlight: str | None = None, coverage: Coverage | None = None
) -> str:
    """Graphviz DOT text of a spec; see the module docstring."""
    return _DotWriter(_graph(spec, highlight, coverage), highlight).render()


def render_image(
    spec: MachineSpec,
    fmt: DiagramFormat,
    highlight: str | None = None,
    coverage: Coverage | None = None,
) -> bytes:
    """SVG or PNG bytes, made by piping `render_dot` through Graphviz ``dot``."""
    if not fmt.is_image:
        msg = f"render_image makes svg or png, not {fmt.value}; use render_{fmt.value}"
        raise ValueError(msg)
    dot_text = render_dot(spec, highlight, coverage)
    exe = shutil.which("dot")
    if exe is None:
        raise GraphvizNotFoundError(fmt.value)
    try:
        proc = subprocess.run(
            [exe, f"-T{fmt.value}"],
            input=dot_text.encode("utf-8"),
            capture_output=True,
            check=False,
            timeout=_GRAPHVIZ_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise GraphvizFailedError(
            spec.name, fmt.value, f"no answer within {_GRAPHVIZ_TIMEOUT_S:g} s"
        ) from None
    if proc.returncode != 0 or not proc.stdout:
        detail = proc.stderr.decode("utf-8", "replace").strip() or f"exit {proc.returncode}"
        raise GraphvizFailedError(spec.name, fmt.value, " ".join(detail.split()))
    return proc.stdout


# -- Markdown --------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text safe inside one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|") or "—"


def _codes(names: Iterable[str], sep: str = ", ") -> str:
    return sep.join(f"`{n}`" for n in names)


def _requires_cell(t: TransitionSpec) -> str:
    groups: dict[str, list[str]] = {}
    for r in t.requires:
        groups.setdefault(r.split(".")[0], []).append(r)
    return "; ".join(_codes(g, " or ") for g in groups.values())


def _callbacks_cell(t: TransitionSpec) -> str:
    groups = (("prepare", t.prepare), ("before", t.before), ("after", t.after))
    return "; ".join(f"{what}: {_codes(names)}" for what, names in groups if names)


def render_transition_table(spec: MachineSpec) -> str:
    """A Markdown table with one row per declared transition, in declaration order."""
    rows = [
        "| # | trigger | source | dest | guards | callbacks | requires | description |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in spec.transitions:
        source = "`*` (any non-final state)" if ANY_STATE in t.sources else _codes(t.sources)
        guards = [f"`{c}`" for c in t.conditions] + [f"not `{u}`" for u in t.unless]
        cells = [
            str(t.index),
            f"`{t.trigger}`",
            source,
            f"`{t.dest}`" + (f" ({t.history} history)" if t.history else ""),
            ", ".join(guards),
            _callbacks_cell(t),
            _requires_cell(t),
            t.description,
        ]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _state_lines(node: GraphNode, depth: int) -> list[str]:
    tags: list[str] = []
    if node.region:
        tags.append("region")
    if node.kind is StateKind.COMPOUND and not node.region:
        tags.append("compound")
    if node.kind is StateKind.PARALLEL:
        tags.append("parallel")
    if node.is_initial:
        tags.append("initial")
    if node.final:
        tags.append("final")
    if node.on_enter:
        tags.append(f"on enter: {_codes(node.on_enter)}")
    if node.on_exit:
        tags.append(f"on exit: {_codes(node.on_exit)}")
    line = f"{'  ' * depth}- `{node.path}`"
    if tags:
        line += f" ({'; '.join(tags)})"
    if node.description:
        line += f" — {node.description}"
    out = [line]
    for child in node.children:
        out.extend(_state_lines(child, depth + 1))
    return out


def render_markdown_doc(spec: MachineSpec) -> str:
    """The generated documentation page of one machine (``specs/<machine>.md``)."""
    graph = build_graph(spec)
    kind = "Parallel machine" if graph.parallel else "Machine"
    lines = [
        f"# {kind} `{spec.name}`",
        "",
        f"> This file is generated by `unicache-fsm docs` from `{spec.name}.toml`; "
        "do not edit it by hand.",
        "",
    ]
    if graph.description:
        lines += [graph.description, ""]
    if spec.noun:
        lines += [f"One model of this machine is called a *{spec.noun}* in messages.", ""]
    lines += [
        "## Diagram",
        "",
        "```mermaid",
        render_mermaid(spec).rstrip("\n"),
        "```",
        "",
        "Edge labels read `trigger [guard] [not guard] (if region.state|state)`: every "
        "`[guard]` must hold and every `not` guard fail; `(if ...)` names, per region, the "
        "states of which one must be active for the transition to exist.",
        "",
        "## States",
        "",
    ]
    for child in graph.root.children:
        lines.extend(_state_lines(child, 0))
    lines += [
        "",
        "## Transitions",
        "",
        "Candidates for one trigger are tried in declaration order (`#`); the first whose "
        "guards pass is taken. Callbacks run `prepare`, guards, `before`, the state "
        "change, `after`.",
        "",
        render_transition_table(spec).rstrip("\n"),
    ]
    return "\n".join(lines) + "\n"
