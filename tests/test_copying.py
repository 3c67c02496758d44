"""`unicache_fsm.copying.deep`: copy.deepcopy's semantics on what a system is made of,
checked against copy.deepcopy itself on the same objects."""

from __future__ import annotations

import collections
import copy
from typing import Any

import attrs
import torch

from unicache_fsm.copying import deep
from unicache_fsm.store.memory import MemoryStore


@attrs.define
class Holder:  # not a project class (its module is not unicache_fsm.*): copy.deepcopy copies it
    items: list[Any]


def test_containers_are_rebuilt_with_their_kind_order_and_bound() -> None:
    ring: collections.deque[int] = collections.deque([1, 2, 3], maxlen=3)
    ordered = collections.OrderedDict([("b", [1]), ("a", [2])])
    counts = collections.Counter({"x": 2, "y": 1})
    state = {"ring": ring, "ordered": ordered, "counts": counts, "t": (1, "a", None)}
    out = deep(state, {})
    assert out == copy.deepcopy(state)
    assert type(out["ring"]) is collections.deque and out["ring"].maxlen == 3
    assert list(out["ordered"]) == ["b", "a"] and type(out["ordered"]) is collections.OrderedDict
    assert type(out["counts"]) is collections.Counter and out["counts"]["z"] == 0
    assert out["t"] is state["t"]  # a tuple of atoms is itself, as deepcopy makes it
    out["ring"].append(4)
    out["ordered"]["b"].append(9)
    assert list(ring) == [1, 2, 3] and ordered["b"] == [1]


def test_shared_objects_stay_shared_and_cycles_close() -> None:
    inner = [1, 2]
    loop: list[Any] = [inner, inner]
    loop.append(loop)
    ring: collections.deque[Any] = collections.deque([inner])
    ring.append(ring)
    out = deep({"loop": loop, "ring": ring}, {})
    assert out["loop"][0] is out["loop"][1] is out["ring"][0]
    assert out["loop"][2] is out["loop"] and out["ring"][1] is out["ring"]
    assert out["loop"][0] is not inner


def test_tensor_views_stay_views_of_one_copied_storage() -> None:
    base = torch.arange(8)
    view = base[2:6]
    out = deep({"base": base, "view": view, "holder": Holder([view])}, {})
    assert out["view"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()
    assert out["view"].untyped_storage().data_ptr() != base.untyped_storage().data_ptr()
    out["base"][3] = 99
    assert out["view"].tolist() == [2, 99, 4, 5] and view.tolist() == [2, 3, 4, 5]
    assert out["holder"].items[0].tolist() == [2, 99, 4, 5]  # via copy.deepcopy, same memo


def test_a_store_copied_through_its_hook_shares_nothing_with_the_original() -> None:
    store = MemoryStore(capacity_pages=4)
    twin = deep(store, {})
    assert twin is not store
    for name, value in vars(store).items():
        if isinstance(value, (list, dict, set, collections.deque)):
            assert getattr(twin, name) is not value, name
            assert getattr(twin, name) == value, name


class _Owner:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def note(self, x: int) -> None:
        self.seen.append(x)


def test_frozensets_methods_and_flags_follow_their_contents() -> None:
    owner = _Owner()
    leaf = [1]
    state = {
        "owner": owner,
        "callback": owner.note,
        "atoms": frozenset({1, 2}),
        "held": frozenset({owner}),
        "flags": bytearray(b"\x00\x01"),
        "device": torch.device("cpu"),
        "leaf": (leaf,),
    }
    out = deep(state, {})
    out["callback"](5)  # bound to the copied owner
    assert out["owner"].seen == [5] and owner.seen == []
    assert out["atoms"] is state["atoms"]
    assert out["held"] == frozenset({out["owner"]})  # its member is the copy, not shared
    out["flags"][0] = 7
    assert state["flags"] == bytearray(b"\x00\x01")
    assert out["device"] == torch.device("cpu")
    assert out["leaf"] is not state["leaf"] and out["leaf"][0] == [1]
