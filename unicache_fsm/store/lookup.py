"""LOOKUP rules: which prefix lengths of a tail a store can restore, from page presence.

Every store answers `lookup` with these rules; a store only says which pages it holds.

- `split_lookup_transfers(transfers)` -> ``(kv, others)``: the KV (FULL) transfer and
  the other pools' transfers, validated (`StoreTransferError` / `InvalidPageKeyError`
  naming the culprit otherwise): one transfer per pool; exactly one KV transfer, with
  ALL_PAGES; an ALL_PAGES transfer of another pool lists no keys or the KV keys; a
  TRAILING_PAGES transfer lists no keys or the last N KV keys.
- `lookup_result(transfers, present)` -> `PoolTransferResult`; `present(pool, keys)`
  answers, per key, whether the store holds that pool's page. With the KV keys
  ``k[0..n)`` (tail-relative):
  1. ``kv_pages`` = the leading run of present KV pages; candidates = ``{1..kv_pages}``.
  2. Every other pool looks its pages up *by the KV key at the same tail position*:
     ALL_PAGES gives ``{1..b}`` (b = its first missing page); TRAILING_PAGES with
     ``N = max(1, len(transfer.keys))`` accepts boundary L iff every page in
     ``[max(0, L - N), L)`` is present (boundaries below N are clipped at the tail start).
  3. `restorable_prefix_pages` = the sorted intersection (sparse sets are normal: an SWA
     window stored only at offloaded node ends makes 5 restorable while 3 and 4 are not);
     `kv_hit_pages` = its maximum (0 when empty); `extra_pool_hit_pages[pool]` = the
     largest boundary that pool alone accepts within the KV run.
- `restorable_prefix_pages(transfers, present)` -> the sorted list of step 3;
  `lookup_boundaries(kv, others, present)` the same for transfers already split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import compress

from unicache_fsm.pools.transfer import (
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
    check_page_keys,
)
from unicache_fsm.store.errors import StoreTransferError

__all__ = [
    "PresenceFn",
    "lookup_boundaries",
    "lookup_result",
    "restorable_prefix_pages",
    "split_lookup_transfers",
]

PresenceFn = Callable[[PoolName, Sequence[str]], Sequence[bool]]
"""``present(pool, keys)`` -> one flag per key: does the store hold that pool's page?"""


def split_lookup_transfers(
    transfers: Sequence[PoolTransfer],
) -> tuple[PoolTransfer, list[PoolTransfer]]:
    """The KV transfer and the others, after checking that they form one LOOKUP."""
    kv: PoolTransfer | None = None
    others: list[PoolTransfer] = []
    seen: set[PoolName] = set()
    items: Sequence[object] = transfers
    for t in items:
        if not isinstance(t, PoolTransfer):
            msg = f"lookup transfers must be PoolTransfer objects, got {type(t).__name__}"
            raise StoreTransferError(msg, pool=None)
        if t.name in seen:
            msg = f"lookup names pool {t.name} twice; pass one transfer per pool"
            raise StoreTransferError(msg, pool=t.name)
        seen.add(t.name)
        check_page_keys(t.keys)
        if t.name is PoolName.KV:
            kv = t
        else:
            others.append(t)
    if kv is None:
        msg = (
            "lookup has no KV transfer; the KV (FULL) transfer lists every tail key and "
            "anchors the other pools' pages, so pass PoolTransfer(PoolName.KV, keys=tail_keys)"
        )
        raise StoreTransferError(msg, pool=PoolName.KV)
    if kv.hit_policy is not PoolHitPolicy.ALL_PAGES:
        msg = f"the KV transfer must use ALL_PAGES, got {kv.hit_policy.value}"
        raise StoreTransferError(msg, pool=PoolName.KV)
    n = len(kv.keys)
    for t in others:
        if not t.keys:
            continue
        if t.hit_policy is PoolHitPolicy.ALL_PAGES:
            if t.keys != kv.keys:
                msg = (
                    f"the {t.name} transfer (ALL_PAGES) lists keys that are not the KV "
                    "transfer's keys; pass the same tail keys, or none"
                )
                raise StoreTransferError(msg, pool=t.name)
        elif len(t.keys) > n or t.keys != kv.keys[n - len(t.keys) :]:
            msg = (
                f"the {t.name} transfer (TRAILING_PAGES) lists {len(t.keys)} keys that are "
                f"not the last {len(t.keys)} of the {n} KV keys; pass kv_keys[-N:]"
            )
            raise StoreTransferError(msg, pool=t.name)
    return kv, others


def _leading_run(flags: Sequence[bool]) -> int:
    for i, flag in enumerate(flags):
        if not flag:
            return i
    return len(flags)


def lookup_result(transfers: Sequence[PoolTransfer], present: PresenceFn) -> PoolTransferResult:
    """Restorable boundaries of a tail; see the module docstring for the rules."""
    kv, others = split_lookup_transfers(transfers)
    boundaries, extra = _result(kv, others, present)
    return PoolTransferResult(
        kv_hit_pages=boundaries[-1] if boundaries else 0,
        extra_pool_hit_pages=extra,
        restorable_prefix_pages=boundaries,
    )


def lookup_boundaries(
    kv: PoolTransfer, others: Sequence[PoolTransfer], present: PresenceFn
) -> tuple[int, ...]:
    """`restorable_prefix_pages` for transfers already split (and so validated)."""
    return _result(kv, others, present)[0]


def _result(
    kv: PoolTransfer, others: Sequence[PoolTransfer], present: PresenceFn
) -> tuple[tuple[int, ...], dict[str, int]]:
    """The restorable boundaries (ascending) and each other pool's own largest one."""
    kv_pages = _leading_run(present(PoolName.KV, kv.keys))
    bounds = range(1, kv_pages + 1)  # boundary L at position L - 1
    extra: dict[str, int] = {}
    if not others:  # (the KV run alone: every boundary in it)
        return tuple(bounds), extra
    valid = [True] * kv_pages  # valid[L - 1]: boundary L is restorable so far
    anchors = kv.keys[:kv_pages]
    for t in others:
        flags = list(present(t.name, anchors)) if kv_pages else []
        if t.hit_policy is PoolHitPolicy.ALL_PAGES:
            b = _leading_run(flags)
            own = [i < b for i in range(kv_pages)]
        else:
            window = max(1, len(t.keys))
            own = []
            run = 0  # present pages ending at position i
            for i, flag in enumerate(flags):
                run = run + 1 if flag else 0
                own.append(run >= min(i + 1, window))
        extra[str(t.name)] = max(compress(bounds, own), default=0)
        valid = [a and b for a, b in zip(valid, own, strict=True)]
    return tuple(compress(bounds, valid)), extra


def restorable_prefix_pages(transfers: Sequence[PoolTransfer], present: PresenceFn) -> list[int]:
    """Every restorable prefix length in pages, ascending."""
    return list(lookup_result(transfers, present).restorable_prefix_pages)
