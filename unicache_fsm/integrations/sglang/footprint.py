"""What memory a linker keeps of its own, beside SGLang's pools.

`owned_tensors(root, *, beside, skip=())` walks everything reachable from `root`
through attributes (``__dict__`` and ``__slots__``) and containers (dict keys and
values, lists, tuples, sets, deques) and returns the tensors whose storage is none of
`beside`'s (SGLang's K/V buffers: a view of them is SGLang's memory, not the linker's).
It does not descend into SGLang's own objects (their module is ``sglang...``), into
classes and functions, nor into instances of `skip` (a store keeps the pages it stores:
that is the store's memory, bounded by its own options). `owned_bytes` sums their
storages (a storage counted once).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import torch

__all__ = ["owned_bytes", "owned_tensors"]


def owned_tensors(
    root: object, *, beside: Iterable[torch.Tensor], skip: tuple[type, ...] = ()
) -> list[torch.Tensor]:
    """The tensors `root` keeps outside `beside`'s storages (module docstring)."""
    theirs = {t.untyped_storage().data_ptr() for t in beside}
    seen: set[int] = set()
    found: list[torch.Tensor] = []
    todo: deque[object] = deque([root])
    while todo:
        obj = todo.popleft()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if obj.untyped_storage().data_ptr() not in theirs:
                found.append(obj)
            continue
        if isinstance(obj, type) or (callable(obj) and not hasattr(obj, "__self__")):
            continue
        if (skip and isinstance(obj, skip)) or type(obj).__module__.startswith("sglang"):
            continue
        if isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset, deque)):
            todo.extend(obj)
        else:
            todo.extend(getattr(obj, "__dict__", {}).values())
            for cls in type(obj).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    todo.append(getattr(obj, name, None))
    return found


def owned_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the tensors' storages, each storage once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())
