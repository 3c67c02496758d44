"""Spec validation: every kind of malformed spec is rejected with all culprits named."""

from __future__ import annotations

import enum
from pathlib import Path

import pytest

from unicache_fsm.fsm.compiled import CompiledExecutor
from unicache_fsm.fsm.errors import InvalidSpecError, UnicacheFsmError
from unicache_fsm.fsm.loader import bundled_machines, bundled_spec, load_spec, parse_spec
from unicache_fsm.fsm.reference import ReferenceExecutor

BAD = Path(__file__).parent / "data" / "bad_specs"


def _rejected(name: str) -> InvalidSpecError:
    with pytest.raises(InvalidSpecError) as info:
        load_spec(BAD / f"{name}.toml")
    err = info.value
    assert isinstance(err, UnicacheFsmError) and isinstance(err, ValueError)
    assert err.source.endswith(f"{name}.toml")
    return err


def _assert_all_named(err: InvalidSpecError, kind: str, names: set[str]) -> None:
    assert set(err.names(kind)) == names, err.problems
    for n in names:
        assert n in str(err)


def test_unknown_states_are_all_listed() -> None:
    err = _rejected("unknown_states")
    assert err.kinds() == {"unknown state"}
    _assert_all_named(err, "unknown state", {"loadng", "comitted", "prepared.nowhere"})


def test_unreachable_states_are_all_listed() -> None:
    err = _rejected("unreachable")
    _assert_all_named(err, "unreachable state", {"orphan", "island", "island.inner"})


def test_non_final_dead_ends_are_all_listed() -> None:
    err = _rejected("dead_ends")
    assert err.kinds() == {"non-final state with no outgoing transition"}
    _assert_all_named(err, "non-final state with no outgoing transition", {"stuck", "limbo"})


def test_transitions_out_of_final_states_are_all_listed() -> None:
    err = _rejected("out_of_final")
    assert err.kinds() == {"transition out of final state"}
    _assert_all_named(
        err, "transition out of final state", {"reopen from committed", "reopen from aborted"}
    )


def test_ambiguous_unguarded_transitions_are_all_listed() -> None:
    err = _rejected("ambiguous")
    assert err.kinds() == {"ambiguous transitions without guards"}
    names = err.names("ambiguous transitions without guards")
    assert len(names) == 2
    assert any(n.startswith("idle --go-->") for n in names)
    assert any(n.startswith("busy --stop-->") for n in names)


def test_guarded_alternatives_are_not_ambiguous() -> None:
    spec = bundled_spec("offload")  # submit/complete each have a guarded first candidate
    assert len([t for t in spec.transitions if t.trigger == "complete"]) == 2


def test_malformed_fields_are_all_listed() -> None:
    err = _rejected("malformed")
    names = err.names("malformed field")
    joined = "\n".join(names)
    for culprit in ("states.idle.finale", "states.done.final", "condtions", "after"):
        assert culprit in joined, joined
    assert len(names) == 4


def test_toml_syntax_error_is_typed() -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_spec("machine = 'x'\n[states.idle\n", "broken.toml")
    assert info.value.kinds() == {"toml syntax"}


def test_invalid_names_are_rejected_before_graph_checks() -> None:
    text = """
machine = "bad_names"
initial = "Idle"
[states.Idle]
[states.done]
final = true
[[transitions]]
trigger = "go-now"
source = "Idle"
dest = "done"
before = ["__import__('os').system('x')", "class"]
"""
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(text)
    err = info.value
    assert err.names("invalid state name") == ("Idle",)
    assert err.names("invalid trigger name") == ("go-now",)
    assert set(err.names("invalid callback name")) == {"__import__('os').system('x')", "class"}


def test_cross_region_transition_is_rejected() -> None:
    text = """
machine = "cross"
parallel = true
[states.a]
[states.a.states.a1]
[states.a.states.a2]
[states.b]
[states.b.states.b1]
[[transitions]]
trigger = "jump"
source = "a.a1"
dest = "b.b1"
[[transitions]]
trigger = "flip"
source = "a.a1"
dest = "a.a2"
[[transitions]]
trigger = "flop"
source = "a.a2"
dest = "a.a1"
"""
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(text)
    assert info.value.names("transition across parallel regions") == ("jump: a.a1 -> b.b1",)


class _LacksThree:
    __slots__ = ("state",)

    def log_event(self) -> None:
        pass


@pytest.mark.parametrize("executor", [CompiledExecutor, ReferenceExecutor])
def test_binding_lists_every_missing_guard_and_callback(executor: type) -> None:
    spec = load_spec(BAD / "missing_callbacks.toml")
    with pytest.raises(InvalidSpecError) as info:
        executor(spec, _LacksThree)
    err = info.value
    assert set(err.names("callback missing on _LacksThree")) == {"reserve_slots", "publish"}
    assert err.names("guard missing on _LacksThree") == ("landed_everywhere",)
    for n in ("reserve_slots", "publish", "landed_everywhere"):
        assert n in str(err)


def test_binding_requires_the_state_slot() -> None:
    class NoSlot:
        __slots__ = ("other",)

        def store_accepted(self) -> bool:
            return True

        def succeeded(self) -> bool:
            return True

        def publish_nodes(self) -> None:
            pass

        def roll_back_nodes(self) -> None:
            pass

    with pytest.raises(InvalidSpecError) as info:
        CompiledExecutor("offload", NoSlot)
    assert info.value.names("state attribute missing on NoSlot") == ("state",)


def test_bundled_specs_are_valid() -> None:
    assert set(bundled_machines()) >= {"load_transaction", "node_residency", "offload"}
    for name in bundled_machines():
        assert bundled_spec(name).name == name


def test_unknown_bundled_machine_is_typed() -> None:
    with pytest.raises(InvalidSpecError, match="no bundled machine 'nope'"):
        bundled_spec("nope")


# -- item 7: an initial below a child, requires inside the transition's own region ---------


@pytest.mark.parametrize(
    ("machine_initial", "b_initial", "culprit"),
    [("b.c", "c", "machine (initial 'b.c')"), ("a", "c.d", "b (initial 'c.d')")],
)
def test_initial_naming_a_grandchild_is_refused(
    machine_initial: str, b_initial: str, culprit: str
) -> None:
    text = f"""
machine = "deep"
initial = "{machine_initial}"
[states.a]
[states.b]
initial = "{b_initial}"
on_enter = ["enter_b"]
[states.b.states.c]
initial = "d"
on_enter = ["enter_c"]
[states.b.states.c.states.d]
[states.b.states.c.states.e]
[[transitions]]
trigger = "go"
source = "a"
dest = "b"
[[transitions]]
trigger = "back"
source = "b"
dest = "a"
"""
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(text)
    assert info.value.names("initial that is not a child") == (culprit,)


def test_requires_in_the_transitions_own_region_is_refused() -> None:
    text = """
machine = "own"
parallel = true
[states.a]
[states.a.states.x]
[states.a.states.y]
[states.b]
[states.b.states.u]
[states.b.states.v]
[[transitions]]
trigger = "go"
source = "a.x"
dest = "a.y"
requires = ["a.y", "b.v"]
[[transitions]]
trigger = "back"
source = "a.y"
dest = "a.x"
requires = ["a.y"]
[[transitions]]
trigger = "flip"
source = "b.u"
dest = "b.v"
requires = ["a.x"]
[[transitions]]
trigger = "flop"
source = "b.v"
dest = "b.u"
"""
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(text)
    err = info.value
    assert err.names("requires naming the transition's own region") == (
        "back: a.y -> a.x (requires a.y)",
        "go: a.x -> a.y (requires a.y)",
    )
    assert "own region" in str(err)


# -- item 8: a machine's name is a file name and can never leave the output directory ------


@pytest.mark.parametrize(
    "name", ["../escaped", "/tmp/abs", "a/b", "..", "dots.in.name", "", "C:\\x", "-x"]
)
def test_machine_names_that_address_a_path_are_refused(name: str) -> None:
    text = f"""
machine = {name!r}
initial = "a"
[states.a]
[states.b]
final = true
[[transitions]]
trigger = "go"
source = "a"
dest = "b"
"""
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(text, "x.toml")
    assert info.value.kinds() & {"invalid machine name", "malformed field"}


class _Plain:
    __slots__ = ("state",)


class _HalfHandler:
    def store_accepted(self, model: object, accepted: bool = True) -> bool:
        return accepted


@pytest.mark.parametrize("executor", [CompiledExecutor, ReferenceExecutor])
def test_handler_binding_looks_for_callbacks_on_the_handler(executor: type) -> None:
    spec = bundled_spec("offload")
    with pytest.raises(InvalidSpecError) as info:
        executor(spec, _Plain, handler=_HalfHandler())
    missing = info.value.names("callback missing on _HalfHandler")
    assert "store_accepted" not in missing and missing
    assert info.value.names("guard missing on _HalfHandler") == ("succeeded",)


class _Drifted(enum.Enum):
    QUEUED = "queued"
    PENDING = "pending"
    GONE = "gone"


@pytest.mark.parametrize("executor", [CompiledExecutor, ReferenceExecutor])
def test_a_states_enum_must_name_exactly_the_configurations(executor: type) -> None:
    class Handler:
        def __getattr__(self, name: str) -> object:
            return lambda *a, **k: True

    with pytest.raises(InvalidSpecError) as info:
        executor("offload", _Plain, states=_Drifted, handler=Handler())
    assert info.value.names("_Drifted members not in the spec") == ("gone",)
    assert info.value.names("spec configurations missing from _Drifted") == ("failed", "published")
