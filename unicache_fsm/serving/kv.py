"""The one KV synthesis: the bytes a stand-in "model" computes for tokens at positions.

Nothing here runs a model. A serving system only needs KV bytes that are
deterministic, cheap and different wherever they should differ, so that a load which
landed garbage, landed in the wrong slots or came from the wrong pages is caught by
comparing what a pool holds with what recomputing would give, byte for byte.

- `kv_bytes(tokens, start, *, swa=False, num_layers=NUM_LAYERS, width=WIDTH)` — rows
  ``[len(tokens), num_layers, width]`` (float16) for `tokens` at absolute positions
  ``start, start + 1, ...``: small integers from token and position, different for
  every layer and lane (the first 1,000 lanes), all in ``0 .. 1998``, exact in
  float16. The SWA pool holds the negated values ``-(v + 1)``, so FULL and SWA bytes
  are never mistaken for each other. A row depends only on its token and position,
  so the expected bytes of a tree node follow from its own key and start. Read-only:
  the result may be shared (small results are cached).
- `reference_kv_bytes(...)` — the same rows computed by the definition in torch ops,
  never cached (`kv_bytes` gathers them from a 1,000-row value table built from it).
- `same_kv(a, b)` — whether two KV tensors hold the same bytes (same shape and dtype):
  the byte-for-byte comparison every check of loaded or resident KV uses (a float16
  `torch.equal` costs several times as much on CPU; on CPU the bytes are compared
  eight at a time by NumPy, whose loop is vectorised).
- `pool_holds(pool, slots, rows)` — whether a KV pool holds `rows` in `slots` (each a
  sequence of tensors, concatenated): ``same_kv(pool.read_pages(cat(slots)),
  cat(rows))``, the slots checked as `read_pages` checks them, with no torch call on a
  CPU pool (what every audit and every load verification asks, many small nodes at a
  time). `rows` may be their bytes already joined (`row_bytes` of each, concatenated),
  which a caller that keeps the bytes of rows it asks about again and again hands over.
- `row_bytes(rows)` — a tensor's bytes in C order.
- `POISON` — a value no row holds: what a test writes into reserved slots, so a load
  that commits without landing shows.
- `NUM_LAYERS`, `WIDTH` — the default shape (the fuzzing kit's small pools).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch

from unicache_fsm.pools.kv import KVPool
from unicache_fsm.pools.slots import numpy_view, whole_page_ids

__all__ = [
    "NUM_LAYERS",
    "POISON",
    "WIDTH",
    "kv_bytes",
    "pool_holds",
    "reference_kv_bytes",
    "row_bytes",
    "same_kv",
]

NUM_LAYERS = 2
WIDTH = 4
POISON = 1999.0  # never a `kv_bytes` value (those lie in -1999 .. 1998)

#: results up to this many elements are cached (the audits ask for the same nodes)
_CACHED_ELEMENTS = 1 << 14


def kv_bytes(
    tokens: Sequence[int],
    start: int,
    *,
    swa: bool = False,
    num_layers: int = NUM_LAYERS,
    width: int = WIDTH,
) -> torch.Tensor:
    """The KV rows for `tokens` at positions ``start, start + 1, ...`` (see the module)."""
    key = tuple(tokens)
    if len(key) * num_layers * width <= _CACHED_ELEMENTS:
        return _cached(key, start, swa, num_layers, width)
    return _compute(key, start, swa, num_layers, width)


@functools.lru_cache(maxsize=4096)
def _cached(
    tokens: tuple[int, ...], start: int, swa: bool, num_layers: int, width: int
) -> torch.Tensor:
    return _compute(tokens, start, swa, num_layers, width)


def _compute(
    tokens: tuple[int, ...], start: int, swa: bool, num_layers: int, width: int
) -> torch.Tensor:
    """One row per token: row ``v`` of the value table, ``v = (7 t + 13 pos) mod 1000``
    (NumPy arithmetic and one gather; `reference_kv_bytes` is the definition in torch ops)."""
    n = len(tokens)
    pos13 = np.arange(start * 13, (start + n) * 13, 13, dtype=np.int64)
    base = (np.fromiter(tokens, dtype=np.int64, count=n) * 7 + pos13) % 1000
    rows = _value_table(swa, num_layers, width).take(base, axis=0)
    return torch.from_numpy(rows).view(n, num_layers, width)


@functools.lru_cache(maxsize=16)
def _value_table(swa: bool, num_layers: int, width: int) -> np.ndarray:
    """Row v (0 .. 999): the float16 KV row of every token whose base value is v."""
    table = reference_kv_bytes(
        range(1000), 0, swa=swa, num_layers=num_layers, width=width, base_is_token=True
    )
    return table.reshape(1000, num_layers * width).numpy()


def reference_kv_bytes(
    tokens: Sequence[int],
    start: int,
    *,
    swa: bool = False,
    num_layers: int = NUM_LAYERS,
    width: int = WIDTH,
    base_is_token: bool = False,
) -> torch.Tensor:
    """`kv_bytes` by its definition, in torch ops, never cached (what the fast path is
    tested against; with `base_is_token`, row i has base value ``tokens[i]`` itself,
    which builds the value table)."""
    tokens = tuple(tokens)
    n = len(tokens)
    t = torch.tensor(tokens, dtype=torch.int64)
    pos = torch.arange(start, start + n, dtype=torch.int64)
    value = t if base_is_token else (t * 7 + pos * 13) % 1000
    base = value.to(torch.float16)  # exact: below 2048
    lanes = torch.arange(num_layers * width, dtype=torch.int64) % 1000
    grid = lanes.to(torch.float16).view(1, num_layers, width)
    if swa:  # -(v + 1), still exact
        return -(base.view(n, 1, 1) + 1) - grid
    return base.view(n, 1, 1) + grid


def same_kv(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` hold the same bytes: same shape, same dtype, byte for byte."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if (
        a.dtype in _NUMPY_DTYPES
        and a.device.type == "cpu"
        and b.device.type == "cpu"
        and not (a.requires_grad or b.requires_grad)
    ):
        # NumPy views of both (no torch call past `numpy()`), compared as raw bytes
        return _same_bytes(numpy_view(a), numpy_view(b))
    # (a negative bit resolved first: torch will not reinterpret such a tensor's bytes)
    x = a.resolve_neg().contiguous().view(-1).view(torch.uint8)
    y = b.resolve_neg().contiguous().view(-1).view(torch.uint8)
    if x.numel() % 8 == 0 and x.storage_offset() % 8 == 0 and y.storage_offset() % 8 == 0:
        x, y = x.view(torch.int64), y.view(torch.int64)  # eight bytes at a time
    if x.device.type == "cpu" and y.device.type == "cpu":
        # NumPy's vectorised comparison over the same memory: 2-3x torch.equal's loop
        return bool(np.array_equal(x.numpy(), y.numpy()))
    return torch.equal(x, y)


#: dtypes whose CPU tensors NumPy views directly
_NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64, torch.int64, torch.uint8})


def _raw(x: np.ndarray) -> np.ndarray:
    """The bytes of `x` in C order, as int64 words where they divide evenly (else bytes)."""
    flat = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
    return flat.view(np.int64) if flat.size % 8 == 0 else flat


def pool_holds(
    pool: KVPool, slots: Sequence[torch.Tensor], rows: Sequence[torch.Tensor] | bytes
) -> bool:
    """Whether `pool` holds `rows` in `slots`, byte for byte: exactly
    ``same_kv(pool.read_pages(torch.cat(slots)), torch.cat(rows))`` (the slots, once
    concatenated, must be whole pages of the pool's usable range, else `read_pages`'
    typed error). `rows` may also be given as `bytes`: the C-order bytes of rows of the
    pool's dtype and row shape (``[n, num_layers, width]``) concatenated, as a caller
    that keeps them hands them over (`row_bytes`); the answer is the same.

    On a CPU pool whose dtype NumPy can view, with CPU int64 slots, the pages are
    checked and compared in NumPy over the pool's own page bytes (`KVPool.page_bytes`):
    one gather of the pages and one comparison. A few slots (up to `_SMALL_IDS`, 1-D
    tensors) are decoded and checked as Python ints and the rows joined as bytes (no
    concatenation of either side: an audit's trees are small, and each tensor or
    NumPy call costs more than the work); more are concatenated once per side and
    checked vectorised over the whole. Anything else, or slots those checks refuse,
    takes the `read_pages` path, which answers or raises.
    """
    if not slots or not (rows or isinstance(rows, bytes)):  # (b"": zero rows, an answer)
        msg = "pool_holds: give at least one slot tensor and one row tensor"
        raise ValueError(msg)
    small = _small_pages(pool, slots)
    if isinstance(rows, bytes):
        if small is not None:
            held = pool.page_bytes()[small]
            return bool(held.nbytes == len(rows) and held.tobytes() == rows)
        ids = torch.cat(list(slots)) if len(slots) > 1 else slots[0]
        return row_bytes(pool.read_pages(ids)) == rows
    if small is not None and _plain_rows(pool, rows):
        held = pool.page_bytes()[small]
        if held.nbytes != sum(int(r.numel()) for r in rows) * _ITEM_BYTES[pool.dtype]:
            return False  # (another row count: the concatenation's shape differs)
        if held.nbytes <= _SMALL_BYTES:
            joined = b"".join(numpy_view(r).tobytes() for r in rows)
            return bool(held.tobytes() == joined)
        return _same_bytes(held, numpy_view(torch.cat(list(rows))))
    ids = torch.cat(list(slots)) if len(slots) > 1 else slots[0]
    want = torch.cat(list(rows)) if len(rows) > 1 else rows[0]
    pages = _cpu_pages(pool, ids)
    if pages is None or not want.is_cpu or want.dtype != pool.dtype or want.requires_grad:
        return same_kv(pool.read_pages(ids), want)
    if want.dim() != 3 or want.shape[1:] != (pool.num_layers, pool.width):
        return False
    wanted = numpy_view(want)  # (a copy when `want` has a negative bit)
    held = pool.page_bytes()[pages]
    if held.nbytes != wanted.nbytes:
        return False
    return _same_bytes(held, wanted)


def row_bytes(rows: torch.Tensor) -> bytes:
    """The bytes of `rows` (any dtype, any device) in C order: what `pool_holds` compares
    when handed bytes."""
    flat = rows.resolve_neg().resolve_conj().contiguous().view(-1).view(torch.uint8)
    return flat.cpu().numpy().tobytes()


#: bytes per element of the dtypes NumPy views
_ITEM_BYTES = {d: torch.empty(0, dtype=d).element_size() for d in _NUMPY_DTYPES}

#: up to this many slots `pool_holds` decodes and checks them as Python ints
_SMALL_IDS = 256


def _small_pages(pool: KVPool, slots: Sequence[torch.Tensor]) -> list[int] | None:
    """For `pool_holds`' small path: the page ids of the slots of all of `slots` (1-D
    CPU int64 tensors, at most `_SMALL_IDS` slots together), checked as `_cpu_pages`
    checks them (whole pages, ids 1 .. num_pages); None where that path does not apply
    or a check fails (the general path then answers or raises)."""
    if pool.device.type != "cpu" or pool.dtype not in _NUMPY_DTYPES:
        return None
    total = 0
    for t in slots:
        if (
            type(t) is not torch.Tensor
            or t.dtype != torch.int64
            or t.dim() != 1
            or not t.is_cpu
            or t.layout != torch.strided
        ):
            return None
        total += t.numel()
    if total > _SMALL_IDS:
        return None
    flat: list[int] = []
    for t in slots:
        flat += t.tolist()  # (values: a negative bit is resolved)
    p = pool.page_size
    if len(flat) % p:
        return None
    if p == 1:
        pages = flat
    else:
        pages = [v // p for v in flat[::p]]
        if flat != [x for k in pages for x in range(k * p, k * p + p)]:
            return None
    if pages and (min(pages) < 1 or max(pages) > pool.layout.num_pages):
        return None
    return pages


def _plain_rows(pool: KVPool, rows: Sequence[torch.Tensor]) -> bool:
    """Whether every row tensor is a CPU tensor of the pool's dtype and row shape
    (``[n, num_layers, width]``) without grad: their concatenation is then their bytes
    joined, and `pool_holds` compares those."""
    shape = (pool.num_layers, pool.width)
    return all(
        type(r) is torch.Tensor
        and r.dtype == pool.dtype
        and r.dim() == 3
        and r.shape[1:] == shape
        and r.is_cpu
        and not r.requires_grad
        and r.layout == torch.strided
        for r in rows
    )


#: up to this many bytes a comparison copies both sides out (`tobytes`, a memcmp):
#: a fraction of `np.array_equal`'s fixed cost; past it, that vectorised loop
_SMALL_BYTES = 1 << 14


def _same_bytes(x: np.ndarray, y: np.ndarray) -> bool:
    """Whether two arrays of the same byte count hold the same bytes in C order."""
    if x.nbytes <= _SMALL_BYTES:
        return x.tobytes() == y.tobytes()
    return bool(np.array_equal(_raw(x), _raw(y)))


def _cpu_pages(pool: KVPool, ids: torch.Tensor) -> np.ndarray | None:
    """The page ids of slots `ids` for `pool_holds`' NumPy path, checked as
    `KVPool.read_pages` checks them; None where that path does not apply or the checks
    fail (`read_pages` then answers or raises its error)."""
    if pool.device.type != "cpu" or pool.dtype not in _NUMPY_DTYPES:
        return None
    if not ids.is_cpu or ids.dtype != torch.int64 or ids.dim() != 1:
        return None
    p = pool.page_size
    flat = numpy_view(ids)  # (a copy when `ids` has a negative bit)
    if flat.size % p:
        return None
    pages = whole_page_ids(flat, p)
    if pages is None or (
        pages.size and (int(pages.min()) < 1 or int(pages.max()) > pool.layout.num_pages)
    ):
        return None
    return pages
