"""The neutral graph of a machine: what every diagram draws, before any syntax.

A diagram shows the *declared* hierarchy of a spec, not the flat product of its
configurations (`fsm.flat`): a parallel machine with three regions of three states
draws nine boxes, not twenty-seven configurations. Renderers (`fsm.diagram`) turn
this model into Mermaid, DOT or a Markdown table and never look at the spec's
hierarchy rules themselves. Primitives:

- `build_graph(spec)` — a `MachineGraph`: a tree of `GraphNode` (the root stands for
  the machine) and the `GraphEdge`s, in declaration order.
- `MachineGraph.node(path)` — one node by dotted path; `UnknownStateError` otherwise.
- `edge_label(transition)` — ``trigger [cond] [not unl] (if region.a|b, other.c)``:
  the trigger, then every guard (``unless`` guards as ``not name``), then the
  `requires` states grouped by region (one of each group must be active), then
  ``(H)`` or ``(H*)`` for a transition entering its dest through shallow or deep history.

Edges: one per declared source of each `TransitionSpec`. A ``"*"`` source
(`spec.ANY_STATE`) becomes one edge from every state it can leave, marked
`from_any`: in a machine with a compound root, every top-level non-final state (a
compound one stands for its descendants); in a parallel machine, every non-final
child of the region that holds the dest. Each edge records its `domain`, the
nearest common proper ancestor of source and dest, which is the block a nested
renderer must draw it in.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from unicache_fsm.fsm.errors import UnknownStateError
from unicache_fsm.fsm.spec import ANY_STATE, MachineSpec, StateKind, StateSpec, TransitionSpec

__all__ = ["GraphEdge", "GraphNode", "MachineGraph", "build_graph", "edge_label"]


@attrs.frozen
class GraphNode:
    """One declared state (or, with the empty path, the machine itself).

    `initial` is the dotted path of the child entered by default (compound nodes
    only); `is_initial` says whether this node is that child of its parent;
    `region` whether it is a region of a parallel state (entered with its siblings).
    """

    path: str
    name: str
    kind: StateKind
    children: tuple[GraphNode, ...] = ()
    initial: str | None = None
    is_initial: bool = False
    final: bool = False
    description: str = ""
    on_enter: tuple[str, ...] = ()
    on_exit: tuple[str, ...] = ()
    region: bool = False

    def walk(self) -> Iterator[GraphNode]:
        """This node and all its descendants, in document order."""
        yield self
        for child in self.children:
            yield from child.walk()


@attrs.frozen
class GraphEdge:
    """One arrow: a declared transition leaving one of its sources.

    `transition` is the declaration (its `index` identifies it in the spec); `label`
    is `edge_label(transition)`.
    """

    source: str
    dest: str
    domain: str
    label: str
    transition: TransitionSpec
    from_any: bool = False
    count: int | None = None  # times taken, when drawn with coverage

    @property
    def key(self) -> tuple[int, str]:
        """The coverage key of this arrow (`fsm.coverage.EdgeKey`)."""
        return (self.transition.index, "*" if self.from_any else self.source)

    @property
    def trigger(self) -> str:
        return self.transition.trigger


@attrs.frozen
class MachineGraph:
    """A machine as nested nodes and edges; see the module docstring."""

    machine: str
    description: str
    root: GraphNode
    edges: tuple[GraphEdge, ...]
    _by_path: dict[str, GraphNode] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_path", {n.path: n for n in self.root.walk()})

    @property
    def parallel(self) -> bool:
        """Whether the machine's top-level states are parallel regions."""
        return self.root.kind is StateKind.PARALLEL

    def nodes(self) -> Iterator[GraphNode]:
        """Every declared state (not the root), in document order."""
        for child in self.root.children:
            yield from child.walk()

    def node(self, path: str) -> GraphNode:
        """The node at a dotted path; `UnknownStateError` when the spec has none."""
        found = self._by_path.get(path) if path else None
        if found is None:
            known = [n.path for n in self.nodes()]
            raise UnknownStateError(self.machine, path, known)
        return found


def _parent(path: str) -> str:
    return path.rpartition(".")[0]


def _proper_ancestors(path: str) -> list[str]:
    out = []
    while path:
        path = _parent(path)
        out.append(path)
    return out


def _domain(source: str, dest: str) -> str:
    dest_ancestors = set(_proper_ancestors(dest))
    return next(a for a in _proper_ancestors(source) if a in dest_ancestors)


def _node(state: StateSpec, *, is_initial: bool, region: bool) -> GraphNode:
    initial = None
    if state.kind is StateKind.COMPOUND and state.initial is not None:
        initial = f"{state.path}.{state.initial}" if state.path else state.initial
    children = tuple(
        _node(
            c,
            is_initial=state.kind is StateKind.COMPOUND and c.name == state.initial,
            region=state.kind is StateKind.PARALLEL,
        )
        for c in state.children
    )
    return GraphNode(
        path=state.path,
        name=state.name,
        kind=state.kind,
        children=children,
        initial=initial,
        is_initial=is_initial,
        final=state.final,
        description=" ".join(state.description.split()),
        on_enter=state.on_enter,
        on_exit=state.on_exit,
        region=region,
    )


def edge_label(t: TransitionSpec) -> str:
    """The compact label of a transition; see the module docstring."""
    parts = [t.trigger]
    parts.extend(f"[{c}]" for c in t.conditions)
    parts.extend(f"[not {u}]" for u in t.unless)
    if t.requires:
        groups: dict[str, list[str]] = {}
        for r in t.requires:
            region, _, rest = r.partition(".")
            groups.setdefault(region, []).append(rest or region)
        shown = ", ".join(f"{region}.{'|'.join(names)}" for region, names in groups.items())
        parts.append(f"(if {shown})")
    if t.history:  # UML's history pseudo-states: H shallow, H* deep
        parts.append("(H*)" if t.history == "deep" else "(H)")
    return " ".join(parts)


def _any_sources(spec: MachineSpec, dest: str) -> list[str]:
    if spec.root.kind is StateKind.PARALLEL:
        region = spec.root.child(dest.split(".")[0])
        holders = region.children if region is not None else ()
    else:
        holders = spec.root.children
    return [s.path for s in holders if not s.final]


def build_graph(spec: MachineSpec) -> MachineGraph:
    """The graph of a (validated) spec; see the module docstring."""
    root = _node(spec.root, is_initial=False, region=False)
    root = attrs.evolve(root, name=spec.name)
    edges: list[GraphEdge] = []
    for t in spec.transitions:
        label = edge_label(t)
        from_any = ANY_STATE in t.sources
        sources = _any_sources(spec, t.dest) if from_any else list(dict.fromkeys(t.sources))
        for source in sources:
            edges.append(
                GraphEdge(
                    source=source,
                    dest=t.dest,
                    domain=_domain(source, t.dest),
                    label=label,
                    transition=t,
                    from_any=from_any,
                )
            )
    return MachineGraph(
        machine=spec.name,
        description=" ".join(spec.description.split()),
        root=root,
        edges=tuple(edges),
    )
