"""Transfer descriptors: what moves between a pool's slots and the external store.

These are the value types of the external-cache contract, named as SGLang names them
so its users recognise them. They sit with the pools (below the tree, the linker and
the stores, which all speak them); `unicache_fsm.linker` re-exports them.

- `ComponentType` — a tree component and the logical pool that holds its slots, one
  enum for both (each component owns exactly one pool): FULL (pool ``kv``), SWA,
  MAMBA. `PoolName` is the same enum under SGLang's pool vocabulary, so
  ``PoolName.KV is ComponentType.FULL``.
- `PoolHitPolicy` — how a store decides that a prefix is restorable for a pool:
  ALL_PAGES (every page up to the boundary exists) or TRAILING_PAGES (only the last
  N pages before the boundary must exist, N = the transfer's key count).
- `LinkerTransferPhase` — LOOKUP (which pages exist), LOAD (device slots the store
  writes into), OFFLOAD (device pages and their hashes handed to the store).
- `ExternalLinkerLoadPhase` — PREPARE, COMMIT, ABORT: the phases of one load.
- `PoolTransfer(name, device_indices, keys, hit_policy)` — int64 slot ids of whole
  pages (none for LOOKUP) and one page hash per page, in the same order.
- `PoolTransferResult(kv_hit_pages, extra_pool_hit_pages, restorable_prefix_pages)`.
"""

from __future__ import annotations

import enum
import re

import attrs
import torch

from unicache_fsm.pools.errors import LengthMismatchError, PoolError, TensorTypeError

__all__ = [
    "ComponentType",
    "ExternalLinkerLoadPhase",
    "InvalidPageKeyError",
    "LinkerTransferPhase",
    "PoolHitPolicy",
    "PoolName",
    "PoolTransfer",
    "PoolTransferResult",
    "check_page_key",
    "check_page_keys",
]

_KEY = re.compile(r"[0-9a-f]{64}")


class ComponentType(str, enum.Enum):
    """A tree component, named together with the logical pool that holds its slots.

    FULL is the backbone (every node has FULL data; its pool is the KV pool), SWA the
    sliding-window KV, MAMBA recurrent state. The value is the pool's name, as store
    keys spell it (``str()`` gives it); `KV` is an alias of `FULL` so that SGLang's
    pool vocabulary (`PoolName.KV`) names the same member.
    """

    FULL = "kv"
    SWA = "swa"
    MAMBA = "mamba"
    KV = "kv"  # alias: the FULL component's pool

    def __str__(self) -> str:
        return self.value


#: SGLang's name for the enum when it names pools (`PoolName.KV is ComponentType.FULL`).
PoolName = ComponentType


class PoolHitPolicy(str, enum.Enum):
    ALL_PAGES = "all_pages"
    TRAILING_PAGES = "trailing_pages"


class LinkerTransferPhase(str, enum.Enum):
    LOOKUP = "lookup"
    LOAD = "load"
    OFFLOAD = "offload"


class ExternalLinkerLoadPhase(str, enum.Enum):
    PREPARE = "prepare"
    COMMIT = "commit"
    ABORT = "abort"


class InvalidPageKeyError(PoolError, ValueError):
    """A page key is not a 64-digit lowercase hex SHA-256 digest."""

    def __init__(self, key: object) -> None:
        self.key = key
        super().__init__(
            f"page key {key!r} is not 64 lowercase hex digits (a page hash from "
            "unicache_fsm.hashing); refusing it so that no key can name a path or another tenant"
        )


#: Keys that passed `check_page_key` lately (plain `str` only): a key is checked at every
#: layer it crosses, and a set lookup costs a small part of the pattern match. Cleared
#: when full, so it stays bounded.
_CHECKED: set[str] = set()
_CHECKED_MAX = 1 << 16


def check_page_key(key: object) -> str:
    """Return `key` if it is a valid page hash, else raise `InvalidPageKeyError`."""
    if type(key) is str and key in _CHECKED:
        return key
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise InvalidPageKeyError(key)
    if type(key) is str:
        if len(_CHECKED) >= _CHECKED_MAX:
            _CHECKED.clear()
        _CHECKED.add(key)
    return key


_STR = frozenset({str})


#: any run of lowercase hex digits (the keys of a batch, joined, are checked as one)
_HEX_RUN = re.compile(r"[0-9a-f]*")
_LEN64 = frozenset({64})


def check_page_keys(keys: object) -> tuple[str, ...]:
    """`keys` (an iterable of page keys, not one string) as a tuple, each checked by
    `check_page_key`; a tuple of plain strings that all passed lately is answered by
    two C-level passes (their types, then one set inclusion) instead of a call per key,
    and a batch of plain strings not seen yet by three (their lengths, then one match
    of them all joined: 64 hex digits each) before they join the checked set."""
    if type(keys) is tuple and set(map(type, keys)) <= _STR and _CHECKED.issuperset(keys):
        return keys
    if isinstance(keys, str) or not hasattr(keys, "__iter__"):
        raise InvalidPageKeyError(keys)
    out = keys if type(keys) is tuple else tuple(keys)  # (an iterator is read once)
    if (
        out
        and set(map(type, out)) <= _STR
        and set(map(len, out)) == _LEN64
        and _HEX_RUN.fullmatch("".join(out))
    ):
        if len(out) <= _CHECKED_MAX:  # (the memo stays bounded)
            if len(_CHECKED) + len(out) > _CHECKED_MAX:
                _CHECKED.clear()
            _CHECKED.update(out)
        return out
    return tuple(map(check_page_key, out))  # (names the first bad key)


@attrs.frozen(init=False)
class PoolTransfer:
    """One pool's part of a transfer: slots (whole pages) and one key per page.

    `device_indices` is None for LOOKUP; otherwise a 1-D int64 tensor whose length is
    ``len(keys) * page_size`` (checked by whoever knows the page size: the store).
    `keys` become a tuple, each checked by `check_page_key` (`InvalidPageKeyError`
    naming the first bad one); indices that are not a 1-D int64 tensor are a
    `TensorTypeError`.
    """

    name: PoolName
    device_indices: torch.Tensor | None = attrs.field(default=None, eq=False)
    keys: tuple[str, ...] = ()
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES

    def __init__(
        self,
        name: PoolName,
        device_indices: torch.Tensor | None = None,
        keys: object = (),
        hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES,
    ) -> None:
        # (written out rather than generated: the tree builds one per pool per request,
        # and the checks' usual case inline saves a converter and a post-init call each)
        if not (type(keys) is tuple and set(map(type, keys)) <= _STR and _CHECKED.issuperset(keys)):
            keys = check_page_keys(keys)
        idx: object = device_indices
        if idx is not None and (
            not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64 or idx.dim() != 1
        ):
            got = getattr(idx, "dtype", type(idx).__name__)
            msg = f"{name} transfer device_indices must be a 1-D int64 tensor, got {got}"
            raise TensorTypeError(msg, what="device_indices", got=got, expected=torch.int64)
        init = object.__setattr__  # (the class is frozen)
        init(self, "name", name)
        init(self, "device_indices", device_indices)
        init(self, "keys", keys)
        init(self, "hit_policy", hit_policy)

    @property
    def num_pages(self) -> int:
        return len(self.keys)

    def check_page_size(self, page_size: int) -> None:
        """Raise `LengthMismatchError` unless indices cover exactly one page per key."""
        if self.device_indices is None:
            return
        n = int(self.device_indices.numel())
        want = len(self.keys) * page_size
        if n != want:
            msg = (
                f"{self.name} transfer has {n} slots for {len(self.keys)} keys at page size "
                f"{page_size}; expected {want} (one whole page per key)"
            )
            raise LengthMismatchError(
                msg, left="device_indices", right="keys * page_size", left_len=n, right_len=want
            )


@attrs.frozen
class PoolTransferResult:
    """What a LOOKUP found: the usable prefix and every restorable boundary (pages)."""

    kv_hit_pages: int = 0
    extra_pool_hit_pages: dict[str, int] = attrs.field(factory=dict)
    restorable_prefix_pages: tuple[int, ...] = ()
