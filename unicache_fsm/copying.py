"""Deep copies of a running system's state, fast (`deep`).

A search snapshots a whole system (tree, pools, linker, store, machines) once per
successor it reaches, so ``copy.deepcopy`` dominates its time. `deep(x, memo)` has
``copy.deepcopy``'s semantics, with fast paths for what a system is made of:

- atoms (torch dtypes and devices among them) and enums are themselves; tuples and
  frozensets are copied item by item (one of atoms only is itself); a bound method is
  bound again to its owner's copy; bytearrays, lists, dicts, sets, ordered dicts,
  counters and deques (their bound kept) are rebuilt, the memo entered first so that
  cycles close;
- a project class (module ``unicache_fsm.*``) with no copy or pickle hooks of its own
  (attrs' slotted state hooks allowed) gets a bare instance and its ``__dict__`` or slots
  copied (an unset slot stays unset), as ``copy`` would through ``__reduce_ex__``;
- a strided tensor without grad has its storage cloned once per copy, and every tensor
  on it (views included) rebuilt on the clone at its offset, size and stride, as
  ``Tensor.__deepcopy__`` does, under the same memo key, so tensors copied by either
  path share their copied storage;
- anything else goes to ``copy.deepcopy`` with the same memo.

Classes that need a copy hook of their own (fresh locks, rebound steps) call `deep` on
their fields, so their contents take the fast paths too.
"""

from __future__ import annotations

import collections
import copy
import enum
import types
from typing import Any

import attrs
import torch

__all__ = ["deep"]

_ATOMIC = frozenset({int, float, bool, str, bytes, type(None), type, torch.dtype, torch.device})
_PLAIN: dict[type, tuple[str, ...] | None] = {}  # class -> its fields; None: not plain
_DICT = ("__dict__",)  # the fields of a plain class whose instances keep a __dict__
_REDUCE = ("__reduce_ex__", "__reduce__", "__new__")  # object's: copy makes a bare instance
_GETSTATE = ("__getstate__",)


def _plain_fields(cls: type) -> tuple[str, ...] | None:
    """How `copy` would copy an instance of a project class that has no copy or pickle
    hooks of its own (or only attrs' slot-state ones): its ``__dict__`` (`_DICT`), or its
    slots one by one (an unset slot stays unset); None for any other class (left to
    ``copy.deepcopy``)."""
    if cls not in _PLAIN:
        fields = None
        slots = {n for c in cls.__mro__ for n in c.__dict__.get("__slots__", ())}
        plain = (
            cls.__module__.startswith("unicache_fsm.")
            and getattr(cls, "__deepcopy__", None) is None
            and all(getattr(cls, h) is getattr(object, h) for h in _REDUCE)
        )
        own_state = getattr(cls, "__setstate__", None) is not None or any(
            getattr(cls, h) is not getattr(object, h) for h in _GETSTATE
        )
        if plain and not own_state and not slots and cls.__dictoffset__:
            fields = _DICT
        elif plain and not own_state and slots and not cls.__dictoffset__:
            fields = tuple(sorted(slots - {"__weakref__"}))
        elif plain and attrs.has(cls) and "__slots__" in cls.__dict__:
            # attrs' slotted classes get/set their fields as their state
            names = tuple(f.name for f in attrs.fields(cls))
            if set(names) == slots - {"__weakref__"}:
                fields = names
        _PLAIN[cls] = fields
    return _PLAIN[cls]


_UNSET = object()


def deep(x: Any, memo: dict[Any, Any]) -> Any:
    """``copy.deepcopy(x, memo)`` with the fast paths of the module docstring; pass the
    same `memo` to every call of one copy (shared objects stay shared)."""
    cls = type(x)
    if cls in _ATOMIC or isinstance(x, enum.Enum):
        return x
    found = memo.get(id(x), _UNSET)
    if found is not _UNSET:
        return found
    out: Any
    if cls is tuple:
        items = [deep(v, memo) for v in x]
        if all(a is b for a, b in zip(items, x, strict=True)):
            return x
        out = tuple(items)
    elif cls is list:
        out = memo[id(x)] = []
        out.extend(deep(v, memo) for v in x)
        return out
    elif cls is dict:
        out = memo[id(x)] = {}
        for k, v in x.items():
            out[deep(k, memo)] = deep(v, memo)
        return out
    elif cls is set:
        out = {deep(v, memo) for v in x}
    elif cls is frozenset:
        items = [deep(v, memo) for v in x]
        if all(a is b for a, b in zip(items, x, strict=True)):
            return x
        out = frozenset(items)
    elif cls is collections.OrderedDict or cls is collections.Counter:
        out = memo[id(x)] = cls()
        for k, v in x.items():
            out[deep(k, memo)] = deep(v, memo)
        return out
    elif cls is collections.deque:
        out = memo[id(x)] = collections.deque(maxlen=x.maxlen)
        out.extend(deep(v, memo) for v in x)
        return out
    elif cls is bytearray:
        out = bytearray(x)
    elif cls is types.MethodType:  # copy rebuilds a bound method on its copied owner
        out = types.MethodType(x.__func__, deep(x.__self__, memo))
    elif cls is torch.Tensor and not x.requires_grad and x.layout is torch.strided:
        out = _tensor(x, memo)
    else:
        fields = _plain_fields(cls)
        if fields is None:
            return copy.deepcopy(x, memo)
        out = memo[id(x)] = object.__new__(cls)
        if fields is _DICT:
            out.__dict__.update(deep(x.__dict__, memo))
            return out
        for name in fields:
            value = getattr(x, name, _UNSET)
            if value is not _UNSET:
                object.__setattr__(out, name, deep(value, memo))
        return out
    memo[id(x)] = out
    return out


def _tensor(t: torch.Tensor, memo: dict[Any, Any]) -> torch.Tensor:
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        return t.clone()
    # the storage copies are kept where ``Tensor.__deepcopy__`` keeps them, under the same
    # key, so that a tensor copied by either path shares its copied storage with the rest
    copies = memo.setdefault("torch", {})
    copied = copies.get(storage._cdata)
    if copied is None:
        copied = copies[storage._cdata] = storage.clone()  # type: ignore[no-untyped-call]
    out = torch.empty(0, dtype=t.dtype, device=t.device)
    return out.set_(copied, t.storage_offset(), t.size(), t.stride())
