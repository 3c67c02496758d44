"""How traces and error messages name a model: `model_id`.

- `model_id(model)` — the model's ``fsm_id`` attribute when it has one (a load's
  request id, a job's key), as a string; otherwise ``Type#n``, where ``n`` is a serial
  number given the first time the model is named and never given to another object in
  this process. A weak reference tells when the model is collected, so an object that
  later reuses its address gets a new number instead of inheriting the old name (what
  ``Type@address`` did: 100 short-lived models showed up as 2 in one trace).

A model that can be neither weakly referenced nor given an ``fsm_id`` (a class with
``__slots__`` but no ``__weakref__`` slot) is named ``Type@address``, which a later
object may reuse; the trace checker reports such a reuse as the re-initialization of a
live model. Give such classes an ``fsm_id`` or a ``__weakref__`` slot.

Thread-safe: the serial counter and the registry are only touched under a lock.
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref

__all__ = ["model_id"]

_serials = itertools.count(1)
_lock = threading.RLock()  # re-entrant: a weakref callback may run while it is held
# id(model) -> (weak reference to the model, its name); an entry leaves when the model dies
_names: dict[int, tuple[weakref.ref[object], str]] = {}


def _forget(key: int, ref: weakref.ref[object]) -> None:
    with _lock:
        entry = _names.get(key)
        if entry is not None and entry[0] is ref:
            del _names[key]


def model_id(model: object) -> str:
    """The name of `model` in traces and messages; see the module docstring."""
    ident = getattr(model, "fsm_id", None)
    if ident is not None:
        return str(ident)
    key = id(model)
    entry = _names.get(key)
    if entry is not None and entry[0]() is model:
        return entry[1]
    with _lock:
        entry = _names.get(key)
        if entry is not None and entry[0]() is model:
            return entry[1]
        try:
            ref = weakref.ref(model, functools.partial(_forget, key))
        except TypeError:  # not weakly referenceable: the address is all there is
            return f"{type(model).__name__}@{key:x}"
        name = f"{type(model).__name__}#{next(_serials)}"
        _names[key] = (ref, name)
        return name
