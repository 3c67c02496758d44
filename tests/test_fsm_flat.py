"""Flattening: configurations, defaults, requires and final configurations."""

from __future__ import annotations

from pathlib import Path

from unicache_fsm.fsm.flat import flatten
from unicache_fsm.fsm.loader import bundled_spec, load_spec, parse_spec

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
    # abort is declared once on the compound "prepared" and applies to each substate
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
