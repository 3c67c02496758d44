"""Issue 35, features: internal transitions, ignore mode, model methods, pickling, spec
write-back; on the four executors (sync and async, compiled and reference)."""

from __future__ import annotations

import asyncio
import pickle
import threading
from typing import Any

import attrs
import pytest

from unicache_fsm.fsm.builder import MachineBuilder
from unicache_fsm.fsm.compiled import AsyncCompiledExecutor, CompiledExecutor
from unicache_fsm.fsm.errors import IllegalTransitionError, InvalidSpecError, UnknownTriggerError
from unicache_fsm.fsm.loader import bundled_machines, bundled_spec, parse_spec
from unicache_fsm.fsm.reference import AsyncReferenceExecutor, ReferenceExecutor
from unicache_fsm.fsm.trace import TransitionCounter
from unicache_fsm.fsm.writer import dump_spec

EXECUTORS = (CompiledExecutor, ReferenceExecutor, AsyncCompiledExecutor, AsyncReferenceExecutor)

PLAYER = """
machine = "player"
parallel = true
[states.media]
initial = "stopped"
[states.media.states.stopped]
[states.media.states.playing]
on_enter = ["enter_playing"]
on_exit = ["exit_playing"]
[states.volume]
[states.volume.states.quiet]
[states.volume.states.loud]

[[transitions]]
trigger = "play"
source = "media.stopped"
dest = "media.playing"
[[transitions]]
trigger = "stop"
source = "media.playing"
dest = "media.stopped"
[[transitions]]
trigger = "tick"
source = "media.playing"
dest = "media.playing"
internal = true
before = ["count_tick"]
[[transitions]]
trigger = "restart"
source = "media.playing"
dest = "media.playing"
[[transitions]]
trigger = "louder"
source = "volume.quiet"
dest = "volume.loud"
[[transitions]]
trigger = "softer"
source = "volume.loud"
dest = "volume.quiet"
"""


class Player:
    def __init__(self) -> None:
        self.state = ""
        self.log: list[str] = []

    def enter_playing(self) -> None:
        self.log.append("enter")

    def exit_playing(self) -> None:
        self.log.append("exit")

    def count_tick(self) -> None:
        self.log.append("tick")


def _run(ex: Any, value: Any) -> Any:
    return asyncio.run(value) if asyncio.iscoroutine(value) else value


@pytest.mark.parametrize("cls", EXECUTORS)
def test_an_internal_transition_exits_and_enters_nothing(cls: type) -> None:
    ex = cls(parse_spec(PLAYER), Player)
    counter = TransitionCounter()
    ex.add_observer(counter)
    p = Player()
    ex.initialize(p)
    for trigger in ("play", "louder", "tick", "tick"):
        _run(ex, ex.fire(p, trigger))
    assert p.state == "media.playing,volume.loud"
    assert p.log == ["enter", "tick", "tick"]
    _run(ex, ex.fire(p, "restart"))  # external: exits and re-enters
    assert p.log[-2:] == ["exit", "enter"] and p.state == "media.playing,volume.loud"
    key = ("player", "media.playing,volume.loud", "tick", "media.playing,volume.loud")
    assert counter.counts[key] == 2


def test_an_internal_transition_must_stay_in_its_source() -> None:
    bad = PLAYER.replace(
        'dest = "media.playing"\ninternal = true', 'dest = "media.stopped"\ninternal = true'
    )
    with pytest.raises(InvalidSpecError) as info:
        parse_spec(bad)
    assert info.value.names("internal transition that leaves its source") == (
        "tick: media.playing -> media.stopped",
    )


@pytest.mark.parametrize("cls", EXECUTORS)
def test_ignore_mode_skips_declared_triggers_only(cls: type) -> None:
    ex = cls(parse_spec(PLAYER), Player, ignore_invalid=True)
    p = Player()
    ex.initialize(p)
    assert _run(ex, ex.fire(p, "stop")) is None  # no transition from stopped: ignored
    assert p.state == "media.stopped,volume.quiet" and p.log == []
    with pytest.raises(UnknownTriggerError):
        _run(ex, ex.fire(p, "stpo"))  # a typo still raises
    strict = cls(parse_spec(PLAYER), Player)
    with pytest.raises(IllegalTransitionError):
        _run(strict, strict.fire(p, "stop"))


@pytest.mark.parametrize("cls", EXECUTORS)
def test_model_methods_are_opt_in_and_never_overwrite(cls: type) -> None:
    class Model(Player):
        pass

    cls(parse_spec(PLAYER), Model)
    assert not hasattr(Model, "play")
    ex = cls(parse_spec(PLAYER), Model, model_methods=True)
    p = Model()
    ex.initialize(p)
    assert p.is_media_stopped() and not p.is_media_playing()  # type: ignore[attr-defined]
    assert _run(ex, p.may_play()) is True  # type: ignore[attr-defined]
    _run(ex, p.play())  # type: ignore[attr-defined]
    assert p.is_media_playing() and p.log == ["enter"]  # type: ignore[attr-defined]
    with pytest.raises(InvalidSpecError) as info:
        cls(parse_spec(PLAYER), Model, model_methods=True)  # a second install clashes
    assert "play" in info.value.names("model method already defined on Model")

    class Clash(Player):
        def stop(self) -> None:  # pragma: no cover - never called
            pass

    with pytest.raises(InvalidSpecError) as info:
        cls(parse_spec(PLAYER), Clash, model_methods=True)
    assert info.value.names("model method already defined on Clash") == ("stop",)
    assert not hasattr(Clash, "play")  # nothing installed


class Jukebox:
    """A picklable handler (module level)."""

    def __init__(self) -> None:
        self.calls = 0

    def enter_playing(self, model: Any) -> None:
        self.calls += 1

    def exit_playing(self, model: Any) -> None:
        self.calls += 1

    def count_tick(self, model: Any) -> None:
        self.calls += 1


class Record:
    __slots__ = ("state",)


@pytest.mark.parametrize("cls", EXECUTORS)
def test_an_executor_pickles_with_its_handler_and_observers(cls: type) -> None:
    ex = cls(parse_spec(PLAYER), Record, handler=Jukebox(), ignore_invalid=True)
    ex.add_observer(TransitionCounter())
    r = Record()
    ex.initialize(r)
    _run(ex, ex.fire(r, "play"))
    twin = pickle.loads(pickle.dumps(ex))
    assert type(twin) is cls and twin.ignore_invalid and twin.handler.calls == 1
    _run(twin, twin.fire(r, "tick"))
    _run(twin, twin.fire(r, "play"))  # ignored, as the original would
    assert twin.handler.calls == 2 and ex.handler.calls == 1
    assert twin.observers[0].total() == 2  # the counter came along, and counts on


@pytest.mark.parametrize("name", [*bundled_machines(), "player"])
def test_a_spec_written_back_reads_back_equal(name: str) -> None:
    spec = parse_spec(PLAYER) if name == "player" else bundled_spec(name)
    text = dump_spec(spec)
    again = parse_spec(text, spec.source)
    assert again == spec
    assert dump_spec(again) == text


def test_any_text_survives_the_write_back() -> None:
    odd = 'tab\t "quote" back\\slash \x00\x1f\x7f é 🚪 \n'
    spec = parse_spec(PLAYER)
    spec = attrs.evolve(spec, description=odd, noun="player")
    assert parse_spec(dump_spec(spec), spec.source) == spec


DOOR = """
machine = "door"
initial = "closed"
[states.closed]
on_exit = ["seen"]
[states.open]
on_enter = ["seen"]
[[transitions]]
trigger = "open"
source = "closed"
dest = "open"
prepare = ["seen"]
conditions = ["allowed"]
before = ["seen"]
after = ["seen"]
[[transitions]]
trigger = "close"
source = "open"
dest = "closed"
"""


class Door:
    def __init__(self) -> None:
        self.state = ""
        self.events: list[tuple[str, str, str, Any]] = []

    def seen(self, who: str = "", *, event: Any) -> None:
        self.events.append((event.trigger, event.source, event.dest, who))

    def allowed(self, who: str = "", *, event: Any) -> bool:
        self.events.append(("guard", event.source, event.dest, who))
        return True


@pytest.mark.parametrize("cls", EXECUTORS)
def test_event_data_reaches_every_guard_and_callback(cls: type) -> None:
    ex = cls(parse_spec(DOOR), Door, event_data=True)
    door = Door()
    ex.initialize(door)
    assert _run(ex, ex.may_fire(door, "open", "ann")) is True
    _run(ex, ex.fire(door, "open", "bob"))
    step = ("open", "closed", "open")
    assert door.events == [
        (*step, "ann"),  # may_fire: prepare
        ("guard", "closed", "open", "ann"),
        (*step, "bob"),  # prepare
        ("guard", "closed", "open", "bob"),
        *[(*step, "bob")] * 4,  # before, on_exit, on_enter, after
    ]
    bare = cls(parse_spec(DOOR), Door)  # without event_data, no `event` is passed
    bare.initialize(door)
    with pytest.raises(TypeError, match="event"):
        _run(bare, bare.fire(door, "open"))


SWITCH = """
machine = "switch"
initial = "off"
[states.off]
[states.on]
[[transitions]]
trigger = "flip"
source = "off"
dest = "on"
before = ["wait_for_rival"]
[[transitions]]
trigger = "flop"
source = "on"
dest = "off"
before = ["note_thread"]
"""


class Switch:
    def __init__(self) -> None:
        self.state = ""
        self.inside = threading.Event()
        self.rival_called = threading.Event()
        self.threads: list[str] = []

    def wait_for_rival(self) -> None:
        self.inside.set()
        self.rival_called.wait(timeout=0.3)  # the rival fires meanwhile (or would)

    def note_thread(self) -> None:
        self.threads.append(threading.current_thread().name)


@pytest.mark.parametrize("cls", (CompiledExecutor, ReferenceExecutor))
def test_a_per_model_lock_keeps_another_threads_transition_in_that_thread(cls: type) -> None:
    ex = cls(parse_spec(SWITCH), Switch, lock=True)
    switch = Switch()
    ex.initialize(switch)
    first = threading.Thread(target=ex.fire, args=(switch, "flip"), name="first")
    first.start()

    def rival() -> None:
        switch.rival_called.set()
        ex.fire(switch, "flop")  # waits for "flip" to finish, then runs here

    second = threading.Thread(target=rival, name="rival")
    assert switch.inside.wait(timeout=10)  # "flip" is running in the first thread
    second.start()
    first.join()
    second.join()
    assert switch.threads == ["rival"] and switch.state == "off"
    twin = pickle.loads(pickle.dumps(ex))
    assert twin.lock


def test_a_lock_on_an_async_executor_is_refused() -> None:
    with pytest.raises(InvalidSpecError) as info:
        AsyncCompiledExecutor(parse_spec(SWITCH), Switch, lock=True)
    assert info.value.kinds() == {"lock on an async executor"}


def test_the_builder_makes_the_spec_its_toml_twin_makes() -> None:
    b = MachineBuilder("door", initial="closed")
    b.state("closed").state("open")
    b.transition("open", source="closed", dest="open", conditions="unlocked")
    b.transition("close", source=["open"], dest="closed")
    spec = b.build()
    text = (
        'machine = "door"\ninitial = "closed"\n[states.closed]\n[states.open]\n'
        '[[transitions]]\ntrigger = "open"\nsource = "closed"\ndest = "open"\n'
        'conditions = ["unlocked"]\n[[transitions]]\ntrigger = "close"\n'
        'source = "open"\ndest = "closed"\n'
    )
    assert spec == parse_spec(text, "<builder>")


def test_the_builder_validates_and_names_every_problem() -> None:
    b = MachineBuilder("door", initial="closed")
    b.state("closed").state("open").state("open").state("ajar.inner")
    with pytest.raises(InvalidSpecError) as info:
        b.build()
    assert info.value.names("state declared twice") == ("open",)
    assert info.value.names("state whose parent is not declared") == ("ajar.inner",)
    b = MachineBuilder("door", initial="closed").state("closed").state("open")
    b.transition("open", source="closed", dest="nowhere")
    with pytest.raises(InvalidSpecError) as info:
        b.build()
    assert "nowhere" in info.value.names("unknown state")


LIGHT = """
machine = "light"
initial = "red"
[states.red]
[states.green]
[[transitions]]
trigger = "tick"
source = "red"
dest = "green"
conditions = ["expired"]
[[transitions]]
trigger = "tick"
source = "red"
dest = "red"
internal = true
after = ["count"]
[[transitions]]
trigger = "tick"
source = "green"
dest = "red"
"""


class Light:
    def __init__(self) -> None:
        self.state = ""
        self.now = 0
        self.waited = 0

    def expired(self) -> bool:
        return self.now >= 3

    def count(self) -> None:
        self.waited += 1


@pytest.mark.parametrize("cls", EXECUTORS)
def test_the_cookbook_timer_ticks_without_raising(cls: type) -> None:
    ex = cls(parse_spec(LIGHT), Light)
    light = Light()
    ex.initialize(light)
    for now in range(5):
        light.now = now
        _run(ex, ex.fire(light, "tick"))
    assert (light.state, light.waited) == ("red", 3)  # 0,1,2 wait; 3 green; 4 red
