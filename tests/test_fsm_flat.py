"""Flattening: configurations, defaults, requires and final configurations."""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.fsm.flat import FlatMachine, flatten
from unicache_fsm.fsm.loader import bundled_spec, load_spec, parse_spec
from unicache_fsm.fsm.spec import MachineSpec, StateKind, StateSpec, TransitionSpec
from unicache_fsm.fsm.validate import structural_problems

SPECS = Path(__file__).parent / "data" / "specs"


def test_load_transaction_configurations() -> None:
    flat = flatten(bundled_spec("load_transaction"))
    assert flat.initial == "idle"
    assert set(flat.configs) == {
        "idle",
        "prepared.queued",
        "prepared.loading",
        "prepared.landed",
        "committed",
        "aborted",
    }
    assert flat.final_configs == {"committed", "aborted"}
    # abort applies from every non-final configuration (declared per source)
    aborts = [c for (c, t) in flat.table if t == "abort"]
    assert sorted(aborts) == sorted(
        ["idle", "prepared.queued", "prepared.loading", "prepared.landed"]
    )
    assert flat.triggers_from("prepared.landed") == ("commit", "abort")


def test_parallel_regions_and_requires() -> None:
    flat = flatten(load_spec(SPECS / "parallel.toml"))
    assert flat.initial == "power.off,link.down"
    # connect requires power.on: never offered while off
    assert "connect" not in flat.triggers_from("power.off,link.down")
    assert "connect" in flat.triggers_from("power.on.idle,link.down")
    # smash requires link.down, so the final configuration has nothing left to do
    assert flat.final_configs == {"power.broken,link.down"}
    assert flat.is_active("power.on.busy,link.up", "power.on")
    assert not flat.is_active("power.on.busy,link.up", "power.off")
    work = flat.table[("power.on.idle,link.up", "work")]
    assert [ft.dest for ft in work] == ["power.on.busy,link.up", "power.on.idle,link.up"]


def test_node_residency_never_evicts_in_flight_nodes() -> None:
    flat = flatten(bundled_spec("node_residency"))
    for config in flat.configs:
        in_flight = flat.is_active(config, "external.offloading") or flat.is_active(
            config, "backup.backing_up"
        )
        allowed = flat.triggers_from(config)
        if in_flight:
            assert "evict" not in allowed and "delete" not in allowed, config
        if flat.is_active(config, "device.deleted"):
            assert config in flat.final_configs and allowed == ()
        if flat.is_active(config, "device.evicted"):
            assert flat.is_active(config, "backup.backed_up"), config


def test_any_source_in_a_parallel_machine_leaves_the_dest_region() -> None:
    spec = parse_spec(
        """
machine = "p"
parallel = true
[states.a]
[states.a.states.x]
[states.a.states.y]
[states.a.states.dead]
final = true
[states.b]
[states.b.states.u]
[states.b.states.v]
[[transitions]]
trigger = "go"
source = "a.x"
dest = "a.y"
[[transitions]]
trigger = "kill"
source = "*"
dest = "a.dead"
[[transitions]]
trigger = "flip"
source = "b.u"
dest = "b.v"
requires = ["a.x", "a.y"]
[[transitions]]
trigger = "flop"
source = "b.v"
dest = "b.u"
requires = ["a.x", "a.y"]
"""
    )
    flat = flatten(spec)
    assert flat.final_configs == {"a.dead,b.u", "a.dead,b.v"}
    (kill,) = flat.table[("a.y,b.v", "kill")]
    assert kill.dest == "a.dead,b.v"  # region b is untouched
    assert kill.exited_states == ("a.y",)


# -- region groups: the composition equals the product ---------------------------------

_TRIGGERS = ("go", "back", "ping", "reset")


@st.composite
def parallel_specs(draw: st.DrawFn) -> MachineSpec:
    """Random parallel machines: 2-4 regions of 2-3 states (one maybe compound), with
    shared triggers, `requires` on other regions, guards, finals and ``"*"``."""
    n_regions = draw(st.integers(2, 4))
    regions: list[StateSpec] = []
    leaves: dict[str, list[str]] = {}
    for r in range(n_regions):
        name = f"r{r}"
        kids: list[StateSpec] = []
        n_states = draw(st.integers(2, 3))
        for i in range(n_states):
            path = f"{name}.s{i}"
            if i == n_states - 1 and draw(st.booleans()):
                inner = (StateSpec("a", f"{path}.a"), StateSpec("b", f"{path}.b"))
                kids.append(StateSpec(f"s{i}", path, StateKind.COMPOUND, inner, "a"))
            else:
                final = i > 0 and draw(st.integers(0, 2)) == 0
                kids.append(StateSpec(f"s{i}", path, final=final))
        regions.append(StateSpec(name, name, StateKind.COMPOUND, tuple(kids), "s0"))
        leaves[name] = [s.path for k in kids for s in k.walk()]
    root = StateSpec("", "", StateKind.PARALLEL, tuple(regions))
    transitions = []
    for index in range(draw(st.integers(1, 12))):
        region = draw(st.sampled_from(sorted(leaves)))
        states = leaves[region]
        any_source = draw(st.integers(0, 9)) == 0
        sources = ("*",) if any_source else (draw(st.sampled_from(states)),)
        others = [s for r, ss in leaves.items() if r != region for s in ss]
        requires = tuple(draw(st.lists(st.sampled_from(others), max_size=1)))
        transitions.append(
            TransitionSpec(
                trigger=draw(st.sampled_from(_TRIGGERS)),
                sources=sources,
                dest=draw(st.sampled_from(states)),
                index=index,
                conditions=("g",) if draw(st.integers(0, 2)) == 0 else (),
                requires=requires,
            )
        )
    return MachineSpec("random", root, tuple(transitions))


def _product(flat: FlatMachine) -> set[str]:
    """Every reachable configuration, one at a time (the oracle)."""
    seen = {flat.initial}
    queue = [flat.initial]
    while queue:
        config = queue.pop()
        for group in flat.moves(config).values():
            for ft in group:
                if ft.dest not in seen:
                    seen.add(ft.dest)
                    queue.append(ft.dest)
    return seen


def _would_apply(spec: MachineSpec, t: TransitionSpec, active: frozenset[str]) -> bool:
    """Whether an explicit-source transition applies in `active`, finality aside."""
    src = next((s for s in t.sources if s in active), None)
    if src is None or src.split(".")[0] != t.dest.split(".")[0]:
        return False
    groups: dict[str, list[str]] = {}
    for r in t.requires:
        groups.setdefault(r.split(".")[0], []).append(r)
    return all(any(r in active for r in g) for g in groups.values())


@settings(max_examples=300, deadline=None)
@given(parallel_specs())
def test_region_groups_compose_to_the_product(spec: MachineSpec) -> None:
    flat = flatten(spec)
    product = _product(flat)
    combos = set()
    for parts in itertools.product(*(g.configs for g in flat.groups)):
        leaves = [
            leaf
            for g, config in zip(flat.groups, parts, strict=True)
            for leaf in config.split(",")
            if g.regions == ("",) or leaf.split(".")[0] in g.regions
        ]
        combos.add(",".join(sorted(leaves, key=[s.path for s in spec.states()].index)))
    assert combos == product
    assert set(flat.configs) == product
    assert all(flat.is_config(c) for c in product)
    assert flat.reachable_states() == frozenset().union(*(flat.active_states(c) for c in product))
    dead = {c for c in product if not flat.is_final(c) and not flat.moves(c)}
    assert bool(flat.dead_ends()) == bool(dead)
    assert set(flat.dead_ends()) <= dead
    late = {
        (t.trigger, c)
        for c in product
        if flat.is_final(c)
        for t in spec.transitions
        if "*" not in t.sources and _would_apply(spec, t, flat.active_states(c))
    }
    reported = {tuple(x.split(" from ")) for x in flat.out_of_final}
    assert bool(reported) == bool(late)
    assert reported <= late
    ambiguous = any(
        any(not ft.spec.guarded for ft in group[:-1])
        for c in product
        for group in flat.moves(c).values()
    )
    kinds = {p.kind for p in structural_problems(spec, flat)}
    assert ("ambiguous transitions without guards" in kinds) == ambiguous


def test_independent_regions_are_explored_one_group_each() -> None:
    text = ['machine = "many"', "parallel = true"]
    for i in range(14):
        text += [f"[states.r{i}]", f"[states.r{i}.states.off]", f"[states.r{i}.states.on]"]
        for trigger, src, dst in ((f"on_{i}", "off", "on"), (f"off_{i}", "on", "off")):
            text += ["[[transitions]]", f'trigger = "{trigger}"']
            text += [f'source = "r{i}.{src}"', f'dest = "r{i}.{dst}"']
    flat = flatten(parse_spec("\n".join(text)))
    assert len(flat.groups) == 14
    assert sum(len(g.configs) for g in flat.groups) == 28  # not 2**14
    config = ",".join(f"r{i}.{'on' if i % 3 else 'off'}" for i in range(14))
    assert flat.is_config(config)
    assert flat.triggers_from(config)[:2] == ("on_0", "off_1")
    (ft,) = flat.group(config, "on_0")
    assert ft.dest == config.replace("r0.off", "r0.on", 1)
    assert not flat.is_config(config.replace("r0.off", "r0.gone"))
    assert not flat.is_config(",".join(reversed(config.split(","))))
    assert not flat.is_config(["r0.off"])
    assert flat.first_configs(3)[0] == flat.initial and len(flat.first_configs(3)) == 3
    assert not flat.enumerated and "configs" not in vars(flat)  # the product was never walked
