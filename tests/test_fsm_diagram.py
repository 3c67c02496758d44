"""Diagrams: the graph model, Mermaid and DOT output, images, and the generated docs.

Mermaid is checked by a small structural checker (`check_mermaid`) that knows every
construct the renderer emits; DOT is checked by Graphviz itself (the SVG it makes
must be well-formed XML naming every state). Tests that need Graphviz skip locally
when ``dot`` is missing, but fail in CI (``CI`` set), which installs it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import attrs
import pytest

from unicache_fsm.fsm import loader
from unicache_fsm.fsm.diagram import (
    HIGHLIGHT_COLOR,
    DiagramFormat,
    render_dot,
    render_image,
    render_markdown_doc,
    render_mermaid,
    render_transition_table,
)
from unicache_fsm.fsm.errors import UnknownStateError
from unicache_fsm.fsm.graph import build_graph, edge_label
from unicache_fsm.fsm.spec import MachineSpec, StateKind

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None and not os.environ.get("CI"),
    reason="Graphviz 'dot' is not installed (CI installs it: apt-get install graphviz)",
)

MACHINES = loader.bundled_machines()

# a transaction whose abort is declared once on the compound "prepared" (and on idle)
TXN_TOML = """
machine = "txn"
noun = "load"
initial = "idle"
[states.idle]
[states.prepared]
initial = "queued"
[states.prepared.states.queued]
[states.prepared.states.loading]
[states.committed]
final = true
[states.aborted]
final = true
[[transitions]]
trigger = "prepare"
source = "idle"
dest = "prepared"
[[transitions]]
trigger = "start"
source = "prepared.queued"
dest = "prepared.loading"
[[transitions]]
trigger = "commit"
source = "prepared.loading"
dest = "committed"
[[transitions]]
trigger = "abort"
source = ["idle", "prepared"]
dest = "aborted"
"""

NESTED_TOML = """
machine = "nested"
initial = "off"

[states.off]
description = "Nothing runs."
[states.on]
initial = "working"
[states.on.states.working]
initial = "warm"
[states.on.states.working.states.warm]
[states.on.states.working.states.hot]
[states.on.states.split]
parallel = true
[states.on.states.split.states.left]
[states.on.states.split.states.left.states.a]
[states.on.states.split.states.left.states.b]
[states.on.states.split.states.right]
[states.on.states.split.states.right.states.c]
[states.on.states.split.states.right.states.d]
[states.done]
final = true

[[transitions]]
trigger = "power"
source = "off"
dest = "on"

[[transitions]]
trigger = "heat"
source = "on.working.warm"
dest = "on.working.hot"
conditions = ["hot_enough"]
unless = ["frozen"]

[[transitions]]
trigger = "cool"
source = "on.working.hot"
dest = "on.working.warm"

[[transitions]]
trigger = "split"
source = "on.working"
dest = "on.split"

[[transitions]]
trigger = "flip"
source = "on.split.left.a"
dest = "on.split.left.b"

[[transitions]]
trigger = "flop"
source = "on.split.right.c"
dest = "on.split.right.d"

[[transitions]]
trigger = "join"
source = "on.split"
dest = "on.working"

[[transitions]]
trigger = "stop"
source = "*"
dest = "done"
prepare = ["log"]
description = "Stop | whatever runs."
"""

PARALLEL_TOML = """
machine = "lamp"
parallel = true

[states.power]
initial = "off"
[states.power.states.off]
[states.power.states.on]
[states.power.states.broken]
final = true
[states.light]
[states.light.states.dark]
[states.light.states.bright]

[[transitions]]
trigger = "switch_on"
source = "power.off"
dest = "power.on"

[[transitions]]
trigger = "switch_off"
source = "power.on"
dest = "power.off"

[[transitions]]
trigger = "break_down"
source = ["power.off", "power.on"]
dest = "power.broken"

[[transitions]]
trigger = "glow"
source = "light.dark"
dest = "light.bright"
requires = ["power.on"]

[[transitions]]
trigger = "fade"
source = "light.bright"
dest = "light.dark"
requires = ["power.off", "power.on"]
"""

# Ids that collide once dots become underscores, and Mermaid keywords as names.
CLASHING_TOML = """
machine = "clash"
initial = "a"
[states.a]
[states.a.states.b_c]
[states.a_b]
[states.a_b.states.c]
[states.end]
final = true
[states.state]

[[transitions]]
trigger = "go"
source = "a"
dest = "a_b"
[[transitions]]
trigger = "loop"
source = "a_b"
dest = "state"
[[transitions]]
trigger = "finish"
source = "state"
dest = "end"
"""


def all_specs() -> list[MachineSpec]:
    extra = [loader.parse_spec(t) for t in (NESTED_TOML, PARALLEL_TOML, CLASHING_TOML)]
    return [loader.bundled_spec(m) for m in MACHINES] + extra


def spec_ids() -> list[str]:
    return [s.name for s in all_specs()]


# -- a structural checker for the Mermaid we emit ----------------------------------------

_ID = r"[A-Za-z][A-Za-z0-9_]*"
_LINE_KINDS = [
    ("header", re.compile(r"stateDiagram-v2")),
    ("label", re.compile(rf'state "([^"#;{{}}]*)" as ({_ID})')),
    ("open", re.compile(rf"state ({_ID}) \{{")),
    ("close", re.compile(r"\}")),
    ("divider", re.compile(r"--")),
    ("start", re.compile(rf"\[\*\] --> ({_ID})")),
    ("end", re.compile(rf"({_ID}) --> \[\*\]")),
    ("edge", re.compile(rf"({_ID}) --> ({_ID}) : ([^;#{{}}\"]+)")),
    ("classdef", re.compile(r"classDef highlight fill:#f96,stroke:#333,stroke-width:2px")),
    ("class", re.compile(rf"class ({_ID}) highlight")),
    ("bare", re.compile(rf"({_ID})")),
]


@attrs.define
class MermaidFacts:
    """What `check_mermaid` learned: where each id lives, its label, the arrows."""

    parent: dict[str, str] = attrs.Factory(dict)  # id -> enclosing composite ("" at top)
    labels: dict[str, str] = attrs.Factory(dict)
    composites: list[str] = attrs.Factory(list)
    starts: list[tuple[str, str]] = attrs.Factory(list)  # (block, id)
    ends: list[tuple[str, str]] = attrs.Factory(list)
    edges: list[tuple[str, str, str, str]] = attrs.Factory(list)  # (block, src, dst, label)
    highlighted: list[str] = attrs.Factory(list)


def check_mermaid(text: str) -> MermaidFacts:
    """Assert `text` is well-formed stateDiagram-v2 as we emit it; return its facts."""
    lines = text.splitlines()
    assert lines and lines[0] == "stateDiagram-v2", lines[:1]
    assert text.endswith("\n") and not text.endswith("\n\n")
    facts = MermaidFacts()
    stack: list[str] = [""]
    previous = "header"
    used: list[str] = []
    for number, raw in enumerate(lines[1:], start=2):
        line = raw.strip()
        depth = len(stack)
        assert raw == "    " * depth + line or line == "}", f"line {number}: indent {raw!r}"
        kind, match = next(
            ((k, m) for k, rx in _LINE_KINDS if (m := rx.fullmatch(line)) is not None),
            (None, None),
        )
        assert kind is not None and match is not None, f"line {number}: unknown {line!r}"
        assert kind != "header", f"line {number}: second header"
        block = stack[-1]

        def declare(state_id: str, line_no: int = number, where: str = block) -> None:
            known = facts.parent.setdefault(state_id, where)
            assert known == where, f"line {line_no}: {state_id} declared in {known} and {where}"

        if kind == "label":
            declare(match[2])
            facts.labels[match[2]] = match[1]
        elif kind == "bare":
            declare(match[1])
        elif kind == "open":
            declare(match[1])
            facts.composites.append(match[1])
            stack.append(match[1])
        elif kind == "close":
            assert len(stack) > 1, f"line {number}: unbalanced '}}'"
            assert previous not in ("open", "divider"), f"line {number}: empty block or region"
            stack.pop()
            assert raw == "    " * len(stack) + "}", f"line {number}: indent {raw!r}"
        elif kind == "divider":
            assert len(stack) > 1, f"line {number}: '--' outside a composite"
            assert previous not in ("open", "divider"), f"line {number}: empty region"
        elif kind == "start":
            facts.starts.append((block, match[1]))
            used.append(match[1])
        elif kind == "end":
            facts.ends.append((block, match[1]))
            used.append(match[1])
        elif kind == "edge":
            facts.edges.append((block, match[1], match[2], match[3]))
            used += [match[1], match[2]]
        elif kind == "class":
            facts.highlighted.append(match[1])
            used.append(match[1])
        previous = kind
    assert stack == [""], f"unclosed composites: {stack[1:]}"
    undeclared = sorted(set(used) - set(facts.parent))
    assert not undeclared, f"ids used but never declared: {undeclared}"
    if facts.highlighted:
        assert "classDef highlight" in text
    return facts


def mermaid_ids(spec: MachineSpec, facts: MermaidFacts) -> dict[str, str]:
    """The Mermaid id of every state path, recovered from the labels and nesting."""
    by_path: dict[str, str] = {}
    for state in spec.states():
        parent = state.path.rpartition(".")[0]
        parent_id = by_path.get(parent, "")
        if spec.root.kind is StateKind.PARALLEL and not parent:
            parent_id = next(
                i for i, p in facts.parent.items() if p == "" and i in facts.composites
            )
        (found,) = [
            i
            for i, p in facts.parent.items()
            if p == parent_id and facts.labels.get(i, i) == state.name
        ]
        by_path[state.path] = found
    return by_path


# -- graph model ---------------------------------------------------------------------------


def test_edge_label_shows_trigger_guards_and_requires() -> None:
    nested = loader.parse_spec(NESTED_TOML)
    assert edge_label(nested.transitions[1]) == "heat [hot_enough] [not frozen]"
    residency = loader.bundled_spec("node_residency")
    evict = next(t for t in residency.transitions if t.trigger == "evict")
    assert (
        edge_label(evict) == "evict (if backup.backed_up, external.unstored|stored, swa.tombstone)"
    )


def test_graph_keeps_the_declared_hierarchy() -> None:
    graph = build_graph(loader.parse_spec(NESTED_TOML))
    assert [n.path for n in graph.nodes()][:5] == [
        "off",
        "on",
        "on.working",
        "on.working.warm",
        "on.working.hot",
    ]
    assert graph.node("on").initial == "on.working"
    assert graph.node("on.working.warm").is_initial
    assert graph.node("on.split").kind is StateKind.PARALLEL
    assert graph.node("on.split.left").region
    assert graph.node("done").final
    with pytest.raises(UnknownStateError):
        graph.node("on.nowhere")
    with pytest.raises(UnknownStateError):
        graph.node("")


def test_any_source_is_drawn_from_every_top_level_non_final_state() -> None:
    graph = build_graph(loader.parse_spec(NESTED_TOML))
    stops = [(e.source, e.domain) for e in graph.edges if e.trigger == "stop"]
    assert stops == [("off", ""), ("on", "")]
    assert all(e.from_any for e in graph.edges if e.trigger == "stop")


def test_any_source_in_a_parallel_machine_stays_in_the_dest_region() -> None:
    # fsm.flat rejects "*" in a parallel machine for now, so build the spec by hand
    spec = loader.parse_spec(PARALLEL_TOML)
    transitions = tuple(
        attrs.evolve(t, sources=("*",)) if t.trigger == "break_down" else t
        for t in spec.transitions
    )
    graph = build_graph(attrs.evolve(spec, transitions=transitions))
    breaks = [(e.source, e.domain) for e in graph.edges if e.trigger == "break_down"]
    assert breaks == [("power.off", "power"), ("power.on", "power")]


def test_one_edge_per_declared_source() -> None:
    spec = loader.parse_spec(TXN_TOML)
    graph = build_graph(spec)
    aborts = [(e.source, e.dest) for e in graph.edges if e.trigger == "abort"]
    assert aborts == [("idle", "aborted"), ("prepared", "aborted")]
    assert len(graph.edges) == sum(len(t.sources) for t in spec.transitions)
    bundled = loader.bundled_spec("load_transaction")  # abort split by source
    aborts = [e.source for e in build_graph(bundled).edges if e.trigger == "abort"]
    assert aborts == ["idle", "prepared.queued", "prepared.loading", "prepared.landed"]


# -- Mermaid -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", all_specs(), ids=spec_ids())
def test_mermaid_is_structurally_valid_and_matches_the_spec(spec: MachineSpec) -> None:
    text = render_mermaid(spec)
    facts = check_mermaid(text)
    ids = mermaid_ids(spec, facts)
    assert len(set(ids.values())) == len(ids)
    graph = build_graph(spec)
    # every declared state sits in its parent's composite, once
    for node in graph.nodes():
        if node.kind is not StateKind.ATOMIC:
            assert ids[node.path] in facts.composites, node.path
    # initial and final markers
    for node in [graph.root, *graph.nodes()]:
        if node.initial is not None:
            block = ids.get(node.path, "")
            assert (block, ids[node.initial]) in facts.starts, node.path
    assert sorted(i for _, i in facts.ends) == sorted(ids[n.path] for n in graph.nodes() if n.final)
    # one arrow per edge, drawn inside the composite of its domain
    expected = [
        (ids[e.domain] if e.domain else "", ids[e.source], ids[e.dest], e.label)
        for e in graph.edges
    ]
    assert sorted(facts.edges) == sorted(expected)
    assert facts.highlighted == []


def test_mermaid_of_a_parallel_machine_wraps_its_regions() -> None:
    spec = loader.bundled_spec("node_residency")
    text = render_mermaid(spec)
    facts = check_mermaid(text)
    assert ("", "node_residency") in facts.starts
    assert facts.parent["device"] == "node_residency"
    assert text.count("\n        --\n") == 3  # four regions, three dividers
    assert facts.labels["device_resident"] == "resident"


def test_mermaid_of_a_nested_parallel_state() -> None:
    text = render_mermaid(loader.parse_spec(NESTED_TOML))
    facts = check_mermaid(text)
    assert facts.parent["on_split"] == "on"
    assert facts.parent["on_split_left"] == "on_split"
    assert facts.parent["on_split_left_a"] == "on_split_left"
    assert "            --\n" in text  # between the two regions of on.split
    assert ("on_working", "on_working_warm") in facts.starts
    assert ("on_split_left", "on_split_left_a") in facts.starts  # first child by default


def test_mermaid_ids_are_unique_and_avoid_keywords() -> None:
    facts = check_mermaid(render_mermaid(loader.parse_spec(CLASHING_TOML)))
    assert facts.labels["a_b_c_2"] == "c"
    assert facts.parent["a_b_c_2"] == "a_b"
    assert facts.labels["end_"] == "end"
    assert facts.labels["state_"] == "state"


def test_mermaid_is_deterministic() -> None:
    spec = loader.parse_spec(NESTED_TOML)
    assert render_mermaid(spec) == render_mermaid(loader.parse_spec(NESTED_TOML))


@pytest.mark.parametrize(
    ("machine", "state", "mermaid_id"),
    [
        ("load_transaction", "prepared.loading", "prepared_loading"),
        ("load_transaction", "prepared", "prepared"),
        ("node_residency", "external.stored", "external_stored"),
        ("offload", "failed", "failed"),
    ],
)
def test_mermaid_highlight_marks_exactly_that_state(
    machine: str, state: str, mermaid_id: str
) -> None:
    spec = loader.bundled_spec(machine)
    text = render_mermaid(spec, highlight=state)
    facts = check_mermaid(text)
    assert facts.highlighted == [mermaid_id]
    assert text.count("classDef ") == 1
    assert text.replace(
        "    classDef highlight fill:#f96,stroke:#333,stroke-width:2px\n"
        f"    class {mermaid_id} highlight\n",
        "",
    ) == render_mermaid(spec)


@pytest.mark.parametrize("render", [render_mermaid, render_dot])
@pytest.mark.parametrize("state", ["prepared.nowhere", "", "queued", "prepared."])
def test_highlight_of_an_unknown_state_raises(render: object, state: str) -> None:
    spec = loader.bundled_spec("load_transaction")
    with pytest.raises(UnknownStateError, match="load_transaction"):
        render(spec, highlight=state)  # type: ignore[operator]


# -- DOT and images --------------------------------------------------------------------------


def test_dot_draws_clusters_markers_and_clipped_edges() -> None:
    text = render_dot(loader.parse_spec(TXN_TOML))
    assert text.startswith('digraph "txn" {\n') and text.endswith("}\n")
    assert "compound=true;" in text
    assert 'subgraph "cluster_prepared" {' in text
    assert '"prepared/[*]" [shape=point' in text
    assert '"prepared/[*]" -> "prepared.queued";' in text
    assert '"committed" [label="committed", shape=doublecircle];' in text
    assert '"idle" -> "prepared/[*]" [label="prepare", lhead="cluster_prepared"];' in text
    assert '"prepared/[*]" -> "aborted" [label="abort", ltail="cluster_prepared"];' in text
    assert text.count("{") == text.count("}")


def test_dot_of_parallel_regions_uses_dashed_clusters() -> None:
    text = render_dot(loader.parse_spec(NESTED_TOML))
    assert 'subgraph "cluster_on.split" {' in text
    split = text.index('subgraph "cluster_on.split" {')
    assert 'style="rounded";' in text[split : split + 120]
    for region in ("on.split.left", "on.split.right"):
        start = text.index(f'subgraph "cluster_{region}" {{')
        assert 'style="dashed";' in text[start : start + 120]
    # an edge into a parallel state clips at its cluster, entering the first region
    assert '"on.working/[*]" -> "on.split.left/[*]" [label="split", ' in text
    assert 'ltail="cluster_on.working", lhead="cluster_on.split"]' in text


@pytest.mark.parametrize(
    ("machine", "state", "line"),
    [
        ("load_transaction", "prepared.loading", '"prepared.loading" [label="loading", style='),
        ("load_transaction", "aborted", '"aborted" [label="aborted", shape=doublecircle, style='),
        ("load_transaction", "prepared", 'subgraph "cluster_prepared" {'),
        ("node_residency", "backup", 'subgraph "cluster_backup" {'),
    ],
)
def test_dot_highlight_fills_exactly_that_state(machine: str, state: str, line: str) -> None:
    lines = render_dot(loader.bundled_spec(machine), highlight=state).splitlines()
    (filled,) = [i for i, text in enumerate(lines) if "fillcolor" in text]
    assert f'fillcolor="{HIGHLIGHT_COLOR}"' in lines[filled]
    # a node carries its fill on its own line; a cluster on the line after its header
    assert line in lines[filled] or line in lines[filled - 1]


def _svg_text(svg: bytes) -> set[str]:
    root = ET.fromstring(svg)
    return {el.text.strip() for el in root.iter() if el.text and el.text.strip()}


@needs_dot
@pytest.mark.parametrize("spec", all_specs(), ids=spec_ids())
def test_dot_parses_with_graphviz_and_names_every_state(spec: MachineSpec) -> None:
    proc = subprocess.run(
        ["dot", "-Tsvg"], input=render_dot(spec).encode(), capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"syntax error" not in proc.stderr
    texts = _svg_text(proc.stdout)
    for state in spec.states():
        assert state.name in texts, state.path
    for t in spec.transitions:
        assert edge_label(t) in texts, t.label()


@needs_dot
def test_render_image_makes_svg_and_png() -> None:
    spec = loader.bundled_spec("offload")
    svg = render_image(spec, DiagramFormat.SVG, highlight="pending")
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert HIGHLIGHT_COLOR.encode() in svg
    png = render_image(spec, DiagramFormat.PNG)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


def test_render_image_rejects_text_formats() -> None:
    with pytest.raises(ValueError, match="svg or png"):
        render_image(loader.bundled_spec("offload"), DiagramFormat.MERMAID)


# -- Markdown ------------------------------------------------------------------------------


def test_transition_table_has_one_row_per_declared_transition() -> None:
    spec = loader.parse_spec(NESTED_TOML)
    rows = render_transition_table(spec).splitlines()
    assert rows[0].startswith("| # | trigger | source | dest | guards | callbacks | requires |")
    assert len(rows) == 2 + len(spec.transitions)
    heat = rows[2 + 1]
    assert "`heat`" in heat and "`hot_enough`, not `frozen`" in heat
    stop = rows[-1]
    assert "`*` (any non-final state)" in stop and "prepare: `log`" in stop
    assert "Stop \\| whatever runs." in stop  # a pipe cannot split the cell
    cells = [r.count(" | ") for r in rows[2:]]
    assert cells == [cells[0]] * len(cells)
    residency = render_transition_table(loader.bundled_spec("node_residency"))
    assert "`external.unstored` or `external.stored`; `backup.none` or `backup.backed_up`" in (
        residency
    )


@pytest.mark.parametrize("machine", MACHINES)
def test_markdown_doc_holds_diagram_states_and_table(machine: str) -> None:
    spec = loader.bundled_spec(machine)
    doc = render_markdown_doc(spec)
    assert doc.startswith("# ")
    assert "generated by `unicache-fsm docs`" in doc and "do not edit" in doc
    block = doc.split("```mermaid\n", 1)[1].split("```\n", 1)[0]
    assert block == render_mermaid(spec)
    for state in spec.states():
        assert f"- `{state.path}`" in doc
    assert render_transition_table(spec) in doc
    assert " ".join(spec.description.split()) in doc
    assert str(loader.specs_dir()) not in doc  # no machine-specific paths


@pytest.mark.parametrize("machine", MACHINES)
def test_committed_docs_match_the_generator(machine: str) -> None:
    path = loader.specs_dir() / f"{machine}.md"
    assert path.is_file(), f"specs/{machine}.md is missing: run `unicache-fsm docs`"
    assert path.read_text(encoding="utf-8") == render_markdown_doc(loader.bundled_spec(machine)), (
        f"specs/{machine}.md is stale: run `unicache-fsm docs` and commit the result"
    )


def test_no_generated_doc_outlives_its_spec() -> None:
    docs = {p.stem for p in loader.specs_dir().glob("*.md")}
    assert docs <= set(MACHINES), f"remove specs/{sorted(docs - set(MACHINES))}.md"
