"""Hypothesis strategies for fuzzing caches and stores: small, composable, shrinkable.

Every strategy draws from small alphabets on purpose, so that drawn values collide often:
keys share prefixes, chains share pages, and a store sees hits, splits and overlaps in
most examples instead of once in a thousand.

- `page_sizes(max_size=16)` — a page size P: a power of two in ``1 .. max_size``.
- `token_keys(page_size, ...)` — one token key of whole pages (optionally plus a
  partial page), tokens from a small vocabulary.
- `keys_with_shared_prefixes(page_size, ...)` — a list of token keys built from a few
  shared prefixes (cut at a page boundary, or anywhere) plus tails whose first token is
  unique to the key: prefix hits, splits and divergences are the common case.
- `pool_sizes(page_size, ...)` — a pool size in tokens: a whole number of pages.
- `fault_policies(kinds=..., ...)` — a fresh `FaultPolicy` over a drawn subset of
  `kinds`, each rule a probability (a multiple of 0.05) or a period, with a drawn seed;
  its ``repr`` (``FaultPolicy.parse('...')``) pastes back into a program.
- `page_key_chains(page_size, ...)` — a valid page-hash chain (64-hex keys from
  `unicache_fsm.hashing.page_hashes`) over drawn tokens, from an optional prior.

All of them shrink towards short keys of token 0, the smallest page size, and no faults.
"""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from unicache_fsm.hashing import check_prior, page_hashes
from unicache_fsm.store.faults import MISBEHAVIOUR, FaultKind, FaultPolicy, FaultRule

__all__ = [
    "fault_policies",
    "keys_with_shared_prefixes",
    "page_key_chains",
    "page_sizes",
    "pool_sizes",
    "token_keys",
]

TokenKey = tuple[int, ...]


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        msg = f"{name} must be an int >= {low}, got {value!r}"
        raise ValueError(msg)
    return value


def _check_range(low_name: str, low: int, high_name: str, high: int) -> None:
    if low > high:
        msg = f"{low_name} ({low}) must not exceed {high_name} ({high})"
        raise ValueError(msg)


def page_sizes(*, min_size: int = 1, max_size: int = 16) -> SearchStrategy[int]:
    """A page size: a power of two in ``min_size .. max_size`` (shrinks to the smallest)."""
    _check_int("min_size", min_size, 1)
    _check_int("max_size", max_size, 1)
    sizes = [1 << i for i in range(max_size.bit_length()) if min_size <= 1 << i <= max_size]
    if not sizes:
        msg = f"no power of two lies in {min_size} .. {max_size}"
        raise ValueError(msg)
    return st.sampled_from(sizes)


def token_keys(
    page_size: int,
    *,
    min_pages: int = 1,
    max_pages: int = 6,
    vocab: int = 4,
    partial: bool = False,
) -> SearchStrategy[TokenKey]:
    """A token key of ``min_pages .. max_pages`` whole pages, tokens in ``0 .. vocab-1``.

    With `partial`, up to ``page_size - 1`` more tokens follow (a trailing partial page,
    which a cache keeps on the device but never hashes or offloads).
    """
    _check_int("page_size", page_size, 1)
    _check_int("min_pages", min_pages, 0)
    _check_int("max_pages", max_pages, 0)
    _check_int("vocab", vocab, 1)
    _check_range("min_pages", min_pages, "max_pages", max_pages)
    tokens = st.integers(0, vocab - 1)
    whole = st.lists(
        st.lists(tokens, min_size=page_size, max_size=page_size),
        min_size=min_pages,
        max_size=max_pages,
    ).map(lambda pages: tuple(t for page in pages for t in page))
    if not partial or page_size == 1:
        return whole
    extra = st.lists(tokens, max_size=page_size - 1).map(tuple)
    return st.tuples(whole, extra).map(lambda pair: pair[0] + pair[1])


@st.composite
def _shared_prefix_keys(
    draw: st.DrawFn,
    page_size: int,
    num_prefixes: int,
    max_prefix_pages: int,
    max_tail_pages: int,
    min_keys: int,
    max_keys: int,
    vocab: int,
    aligned: bool,
) -> list[TokenKey]:
    prefixes = draw(
        st.lists(
            token_keys(page_size, min_pages=1, max_pages=max_prefix_pages, vocab=vocab),
            min_size=1,
            max_size=num_prefixes,
        )
    )
    count = draw(st.integers(min_keys, max_keys))
    keys: list[TokenKey] = []
    for i in range(count):
        prefix = draw(st.sampled_from(prefixes))
        if aligned:
            cut = draw(st.integers(0, len(prefix) // page_size)) * page_size
        else:
            cut = draw(st.integers(0, len(prefix)))
        tail_pages = draw(st.integers(0 if cut else 1, max_tail_pages))
        tail: TokenKey = ()
        if tail_pages:
            # The tail's first token is this key's own (outside the prefix vocabulary),
            # so two keys diverge exactly where their tails begin.
            rest = draw(
                token_keys(page_size, min_pages=tail_pages, max_pages=tail_pages, vocab=vocab)
            )
            tail = (vocab + i, *rest[1:])
        keys.append(prefix[:cut] + tail)
    return keys


def keys_with_shared_prefixes(
    page_size: int,
    *,
    num_prefixes: int = 3,
    max_prefix_pages: int = 4,
    max_tail_pages: int = 3,
    min_keys: int = 1,
    max_keys: int = 8,
    vocab: int = 4,
    aligned: bool = True,
) -> SearchStrategy[list[TokenKey]]:
    """``min_keys .. max_keys`` token keys sharing up to `num_prefixes` prefixes.

    Each key is a prefix cut at a page boundary (anywhere in it when `aligned` is
    False), then a tail of ``0 .. max_tail_pages`` pages whose first token is unique to
    the key. A key with no tail repeats (part of) a prefix: a full hit. No key is empty.
    """
    for name, value, low in (
        ("page_size", page_size, 1),
        ("num_prefixes", num_prefixes, 1),
        ("max_prefix_pages", max_prefix_pages, 1),
        ("max_tail_pages", max_tail_pages, 1),
        ("min_keys", min_keys, 0),
        ("max_keys", max_keys, 0),
        ("vocab", vocab, 1),
    ):
        _check_int(name, value, low)
    _check_range("min_keys", min_keys, "max_keys", max_keys)
    return _shared_prefix_keys(
        page_size,
        num_prefixes,
        max_prefix_pages,
        max_tail_pages,
        min_keys,
        max_keys,
        vocab,
        aligned,
    )


def pool_sizes(page_size: int, *, min_pages: int = 4, max_pages: int = 64) -> SearchStrategy[int]:
    """A pool size in tokens: ``min_pages .. max_pages`` whole pages of `page_size`."""
    _check_int("page_size", page_size, 1)
    _check_int("min_pages", min_pages, 1)
    _check_int("max_pages", max_pages, 1)
    _check_range("min_pages", min_pages, "max_pages", max_pages)
    return st.integers(min_pages, max_pages).map(lambda pages: pages * page_size)


@st.composite
def _fault_policies(
    draw: st.DrawFn,
    kinds: tuple[FaultKind, ...],
    max_probability: float,
    max_every: int,
    max_delay_steps: int,
) -> FaultPolicy:
    chosen = draw(st.lists(st.sampled_from(kinds), unique=True, max_size=len(kinds)))
    twentieths = max(1, round(max_probability * 20))
    rules: dict[FaultKind, FaultRule] = {}
    for kind in chosen:
        if max_every and draw(st.booleans()):
            rules[kind] = FaultRule(every=draw(st.integers(1, max_every)))
        else:
            rules[kind] = FaultRule(probability=draw(st.integers(1, twentieths)) / 20)
    seed = draw(st.integers(0, 2**16))
    delay_steps = draw(st.integers(1, max_delay_steps))
    return FaultPolicy(rules, seed=seed, delay_steps=delay_steps)


_CONFORMING = tuple(kind for kind in FaultKind if kind not in MISBEHAVIOUR)


def fault_policies(
    kinds: Iterable[FaultKind] = _CONFORMING,
    *,
    max_probability: float = 0.3,
    max_every: int = 5,
    max_delay_steps: int = 3,
) -> SearchStrategy[FaultPolicy]:
    """A fresh `FaultPolicy` over a drawn subset of `kinds` (the empty policy included;
    by default every kind a conforming store may show, not `MISBEHAVIOUR`).

    Each chosen kind fires with a probability in ``0.05 .. max_probability`` (steps of
    0.05) or, when `max_every` > 0, possibly on every K-th eligible call (K in
    ``1 .. max_every``); the seed and `delay_steps` are drawn too. A policy is mutable
    (it counts what it injected), so every draw builds a new one.
    """
    given: tuple[object, ...] = tuple(kinds)
    chosen = tuple(k for k in dict.fromkeys(given) if isinstance(k, FaultKind))
    if len(chosen) != len(set(given)):
        bad = next(k for k in given if not isinstance(k, FaultKind))
        msg = f"kinds must be FaultKind members, got {bad!r}"
        raise ValueError(msg)
    if not chosen:
        msg = "kinds is empty; pass at least one FaultKind (or use st.just(FaultPolicy()))"
        raise ValueError(msg)
    p: object = max_probability
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.05 <= p <= 1.0:
        msg = f"max_probability must be a number in [0.05, 1], got {max_probability!r}"
        raise ValueError(msg)
    _check_int("max_every", max_every, 0)
    _check_int("max_delay_steps", max_delay_steps, 1)
    return _fault_policies(chosen, float(max_probability), max_every, max_delay_steps)


def page_key_chains(
    page_size: int,
    *,
    min_pages: int = 1,
    max_pages: int = 6,
    vocab: int = 4,
    prior: str | None = None,
) -> SearchStrategy[tuple[str, ...]]:
    """The page-hash chain of a drawn `token_keys` key: one 64-hex key per page.

    `prior` (a namespace seed or the key of the page before) starts the chain; two
    draws with the same tokens give the same keys, as a content-addressed store expects.
    """
    check_prior(prior)
    return token_keys(page_size, min_pages=min_pages, max_pages=max_pages, vocab=vocab).map(
        lambda tokens: tuple(page_hashes(tokens, page_size, prior))
    )
