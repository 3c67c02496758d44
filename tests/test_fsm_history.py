"""History transitions (issue 35): hand-computed expectations on the four executors.

`tests/data/specs/history.toml` is a player: ``on`` (idle, or playing: normal or fast)
entered by default, through shallow history (``resume``) or deep history
(``resume_deep``, and ``restart`` from inside ``on.playing``); and a parallel ``desk``
of two regions (edit: draft/review, audio: mute/loud) entered by default, through
shallow history (``back``) or deep history (``back_deep``). Each expectation below was
worked out by hand from UML/SCXML semantics, not read off an executor.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from unicache_fsm.fsm.builder import MachineBuilder
from unicache_fsm.fsm.compiled import AsyncCompiledExecutor, CompiledExecutor
from unicache_fsm.fsm.diagram import render_mermaid, render_transition_table
from unicache_fsm.fsm.errors import GuardRejectedError, InvalidSpecError
from unicache_fsm.fsm.executor import ExecutorBase
from unicache_fsm.fsm.loader import load_spec, parse_spec
from unicache_fsm.fsm.reference import AsyncReferenceExecutor, ReferenceExecutor
from unicache_fsm.fsm.writer import dump_spec

SPEC = load_spec(Path(__file__).parent / "data" / "specs" / "history.toml")
EXECUTORS = (CompiledExecutor, ReferenceExecutor, AsyncCompiledExecutor, AsyncReferenceExecutor)


class Player:
    """Logs every state entered (the spec's on_enter callbacks) and answers `allowed`."""

    def __init__(self) -> None:
        self.entered: list[str] = []
        self.allow = True

    def log_on(self) -> None:
        self.entered.append("on")

    def log_playing(self) -> None:
        self.entered.append("on.playing")

    def log_normal(self) -> None:
        self.entered.append("on.playing.normal")

    def log_fast(self) -> None:
        self.entered.append("on.playing.fast")

    def allowed(self) -> bool:
        return self.allow


def _drive(cls: type[ExecutorBase], triggers: list[str]) -> Player:
    """A fresh player through `triggers`; its `entered` log then holds the last one's."""
    ex = cls(SPEC, Player)
    player = Player()
    ex.initialize(player)
    for trigger in triggers:
        player.entered.clear()
        result = ex.fire(player, trigger)  # type: ignore[attr-defined]
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    return player


TO_FAST = ["power_on", "play", "speed"]
CASES = {
    # history before the first visit: the default entry
    "shallow, never exited": (["resume"], "on.idle", ["on"]),
    "deep, never exited": (["resume_deep"], "on.idle", ["on"]),
    # leave `on` from on.playing.fast, come back
    "deep restores the leaf": (
        [*TO_FAST, "power_off", "resume_deep"],
        "on.playing.fast",
        ["on", "on.playing", "on.playing.fast"],
    ),
    "shallow restores the child, then its initial": (
        [*TO_FAST, "power_off", "resume"],
        "on.playing.normal",
        ["on", "on.playing", "on.playing.normal"],
    ),
    # a default entry after a visit ignores the history
    "default entry after a visit": ([*TO_FAST, "power_off", "power_on"], "on.idle", ["on"]),
    # the history is what the latest exit left: fast, then normal after a shallow resume
    "latest exit wins": (
        [*TO_FAST, "power_off", "resume", "power_off", "resume_deep"],
        "on.playing.normal",
        ["on", "on.playing", "on.playing.normal"],
    ),
    # a history transition from inside its dest: the exit records first, then restores
    "re-entry from inside": (
        [*TO_FAST, "restart"],
        "on.playing.fast",
        ["on", "on.playing", "on.playing.fast"],
    ),
    # a parallel state: deep restores each region's leaf, shallow every region's default
    "parallel, never exited": (["back_deep"], "desk.edit.draft,desk.audio.mute", []),
    "parallel deep": (
        ["work", "submit", "unmute", "leave", "back_deep"],
        "desk.edit.review,desk.audio.loud",
        [],
    ),
    "parallel shallow": (
        ["work", "submit", "unmute", "leave", "back"],
        "desk.edit.draft,desk.audio.mute",
        [],
    ),
    "parallel deep, one region moved": (
        ["work", "unmute", "leave", "back_deep"],
        "desk.edit.draft,desk.audio.loud",
        [],
    ),
}


@pytest.mark.parametrize("cls", EXECUTORS, ids=lambda c: c.kind)
@pytest.mark.parametrize("case", list(CASES))
def test_history_restores_what_uml_says(case: str, cls: type[ExecutorBase]) -> None:
    triggers, state, entered = CASES[case]
    player = _drive(cls, triggers)
    assert player.state == state  # type: ignore[attr-defined]
    assert player.entered == entered


@pytest.mark.parametrize("cls", EXECUTORS[:2], ids=lambda c: c.kind)
def test_history_is_kept_per_model_and_copied_by_initialize_like(cls: type[Any]) -> None:
    ex = cls(SPEC, Player)
    a, b = Player(), Player()
    ex.initialize(a)
    ex.initialize(b)
    for trigger in [*TO_FAST, "power_off"]:
        ex.fire(a, trigger)
    ex.fire(b, "power_on")
    ex.fire(b, "power_off")
    assert a.state_history == {"on": ("on.playing.fast",)}  # type: ignore[attr-defined]
    assert b.state_history == {"on": ("on.idle",)}  # type: ignore[attr-defined]
    c = Player()
    ex.initialize(c, like=a)
    ex.fire(c, "resume_deep")
    assert c.state == "on.playing.fast"  # type: ignore[attr-defined]
    ex.fire(b, "resume_deep")
    assert b.state == "on.idle"  # type: ignore[attr-defined]


@pytest.mark.parametrize("cls", EXECUTORS[:2], ids=lambda c: c.kind)
def test_a_vetoed_history_transition_changes_nothing(cls: type[Any]) -> None:
    ex = cls(SPEC, Player)
    player = Player()
    ex.initialize(player)
    for trigger in TO_FAST:
        ex.fire(player, trigger)
    player.allow = False
    with pytest.raises(GuardRejectedError):
        ex.fire(player, "restart")
    assert player.state == "on.playing.fast"
    assert player.state_history == {}


def test_history_round_trips_through_toml_and_the_builder() -> None:
    assert parse_spec(dump_spec(SPEC), SPEC.source) == SPEC
    b = MachineBuilder("lamp", initial="off")
    b.state("off").state("on", initial="dim").state("on.dim").state("on.bright")
    b.transition("up", source="on.dim", dest="on.bright")
    b.transition("flip", source="on", dest="off")
    b.transition("flip_back", source="off", dest="on", history="deep")
    spec = b.build()
    assert spec.transitions[-1].history == "deep"
    assert 'history = "deep"' in dump_spec(spec)


def test_diagrams_mark_history_arrows() -> None:
    mermaid = render_mermaid(SPEC)
    assert "resume (H)" in mermaid
    assert "resume_deep (H*)" in mermaid
    assert "`on` (deep history)" in render_transition_table(SPEC)


BAD = """
machine = "lamp"
initial = "off"
[states.off]
[states.on]
[[transitions]]
trigger = "flip"
source = "off"
dest = "on"
history = {history}
"""


@pytest.mark.parametrize(
    ("history", "kind"),
    [
        ('"sideways"', "invalid history"),
        ('"deep"', "history transition into a state without children"),
        ("3", None),
    ],
)
def test_bad_history_is_refused_naming_the_transition(history: str, kind: str | None) -> None:
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(BAD.format(history=history))
    if kind is not None:
        assert info.value.names(kind) and "flip" in info.value.names(kind)[0]
    else:
        assert "transitions[0].history" in str(info.value)


def test_internal_history_transition_is_refused() -> None:
    spec_text = (
        'machine = "m"\ninitial = "a"\n[states.a]\ninitial = "x"\n[states.a.states.x]\n'
        '[[transitions]]\ntrigger = "t"\nsource = "a"\ndest = "a"\nhistory = "deep"\n'
        "internal = true\n"
    )
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(spec_text)
    assert info.value.kinds() == {"internal history transition"}
