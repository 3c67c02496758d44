"""Model ids: an object's own `fsm_id`, else a serial never reused in the process."""

from __future__ import annotations

import threading

import attrs

from unicache_fsm.fsm import model_id
from unicache_fsm.fsm.trace import TraceRecorder


class Plain:
    pass


@attrs.define(slots=True, eq=True)
class Slotted:
    x: int = 0  # eq=True and equal to every other instance: ids must still differ


class NoWeakref:
    __slots__ = ("state",)


class Named:
    fsm_id = "door-7"


def test_short_lived_models_never_share_an_id() -> None:
    """Issue 18 item 3: `Type@id()` reused addresses, so 100 models showed up as 2."""
    ids = []
    for _ in range(100):
        model = Slotted()
        ids.append(model_id(model))
        del model  # freed at once: the next model may well get the same address
    assert len(set(ids)) == 100
    assert all(i.startswith("Slotted#") for i in ids)


def test_an_id_is_stable_while_the_model_lives() -> None:
    a, b = Plain(), Plain()
    assert model_id(a) == model_id(a) != model_id(b)
    assert model_id(Named()) == "door-7"


def test_a_model_without_weakref_support_falls_back_to_its_address() -> None:
    model = NoWeakref()
    assert model_id(model) == f"NoWeakref@{id(model):x}"


def test_ids_are_unique_across_threads() -> None:
    models = [Plain() for _ in range(400)]
    out: list[str] = []
    lock = threading.Lock()

    def name(chunk: list[Plain]) -> None:
        got = [model_id(m) for m in chunk]
        with lock:
            out.extend(got)

    threads = [threading.Thread(target=name, args=(models[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 400


def test_the_recorder_names_models_by_model_id() -> None:
    recorder = TraceRecorder()
    models = [Slotted() for _ in range(3)]

    class _Ex:
        name = "m"

    for m in models:
        recorder(_Ex(), m, "", "<init>", "a")  # type: ignore[arg-type]
    assert [r["model"] for r in recorder.records()] == [model_id(m) for m in models]
