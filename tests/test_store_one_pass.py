"""The page device's optional one-pass members, `read_checksummed` and `write_checksummed`,
as every store uses them, and what a device that lies through them can and cannot do.

`OnePassKV` is `SplitKV` (tests/test_store_page_device.py) plus both members, written
here from the protocol's words: the move, then XXH3-64 (the `xxhash` package) of each
page in page format. Its `lie` replaces an answer: the stores must take the honest
device's pages exactly as they take `SplitKV`'s, and must contain every lie — an
answer of the wrong form fails that offload or load with a `StoreFaultError` and
stores nothing; wrong values are caught by the load's verification, never served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
import xxhash

import test_store_page_device as page_device
from test_store_page_device import KV, SplitKV, keys, run_load, settle, slots_of, transfer
from unicache_fsm.pools.transfer import PoolTransfer
from unicache_fsm.store.errors import StoreFaultError
from unicache_fsm.store.memory import MemoryStore

make_store = page_device.make_store  # the fixture (memory, file and Redis stores)


def _stored(store: Any, names: list[str]) -> int:
    """How many leading pages of `names` the store would restore (LOOKUP)."""
    return max(store.lookup("q", [PoolTransfer(KV, None, names)]), default=0)


def _sums(data: torch.Tensor, n: int) -> list[int]:
    rows = data.contiguous().view(torch.uint8).view(n, -1)
    return [xxhash.xxh3_64_intdigest(row.numpy().tobytes()) for row in rows]


class OnePassKV(SplitKV):
    """`SplitKV` with both one-pass members; `lie(call, honest)` may replace an answer."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.lie: Callable[[str, list[int]], object] = lambda call, honest: honest

    def read_checksummed(self, pages: torch.Tensor, *, out: torch.Tensor) -> object:
        self.calls.append("read")
        self.read_page_ids(pages, out=out)
        return self.lie("read", _sums(out, pages.numel()))

    def write_checksummed(self, pages: torch.Tensor, data: torch.Tensor) -> object:
        self.calls.append("write")
        self.write_page_ids(pages, data)
        return self.lie("write", _sums(data, pages.numel()))


def test_an_honest_one_pass_device_round_trips_on_every_store(
    make_store: Callable[..., Any],
) -> None:
    store, device = make_store(), OnePassKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=11)
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    assert "read" in device.calls  # the offload read and hashed in one call
    assert run_load(store, "r", [7, 8, 9], names)
    assert torch.equal(device.pages([7, 8, 9]), device.pages([1, 2, 3]))
    if isinstance(store, MemoryStore):
        assert "write" in device.calls  # the memory store loads from its rows in one pass


class _Shifty(list):  # type: ignore[type-arg]
    """A list whose items, read one by one, are not what iterating it yields."""

    def __getitem__(self, i: Any) -> Any:
        return "not a checksum"


class NotOffered(SplitKV):
    """`SplitKV` whose one-pass members are None: not offered (a device that forwards
    another's optional members, where that one has none)."""

    read_checksummed = None
    write_checksummed = None


def test_one_pass_members_that_are_none_are_not_offered(
    make_store: Callable[..., Any],
) -> None:
    store, device = make_store(), NotOffered()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=17)
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    assert run_load(store, "r", [7, 8, 9], names), store.last_error
    assert torch.equal(device.pages([7, 8, 9]), device.pages([1, 2, 3]))


class _PassesForInt(type):
    """A metaclass whose classes compare equal to `int` and hash as it does: a set of
    their types looks like ``{int}`` to every test but identity."""

    def __eq__(cls, other: object) -> bool:
        return other is int or type.__eq__(cls, other)

    def __hash__(cls) -> int:
        return hash(int)


class _LikeInt(int, metaclass=_PassesForInt):
    """An int subclass that passes for `int` (and equals every checksum)."""

    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


class _Unhashable(type):
    """A metaclass with `__eq__` and no `__hash__`: its classes are unhashable."""

    def __eq__(cls, other: object) -> bool:
        return cls is other


class _OddInt(int, metaclass=_Unhashable):
    """An int subclass whose class cannot go into a set."""


BAD_ANSWERS = {
    "none": lambda honest: None,
    "a string": lambda honest: "0" * len(honest),
    "a tuple": lambda honest: tuple(honest),
    "one short": lambda honest: honest[:-1],
    "one more": lambda honest: [*honest, 0],
    "a negative": lambda honest: [-1, *honest[1:]],
    "too big": lambda honest: [1 << 64, *honest[1:]],
    "a bool": lambda honest: [True, *honest[1:]],
    "a float": lambda honest: [float(honest[0]), *honest[1:]],
    "a list subclass": lambda honest: _Shifty(honest),
    "NumPy integers": lambda honest: [np.uint64(h) for h in honest],
    "an int subclass passing for int": lambda honest: [_LikeInt(h) for h in honest],
    "an int subclass of an unhashable class": lambda honest: [_OddInt(h) for h in honest],
}


@pytest.mark.parametrize("answer", list(BAD_ANSWERS), ids=list(BAD_ANSWERS))
def test_a_read_answer_of_the_wrong_form_fails_the_offload_and_stores_nothing(
    make_store: Callable[..., Any], answer: str
) -> None:
    store, device = make_store(), OnePassKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=12)
    device.lie = lambda call, honest: BAD_ANSWERS[answer](honest) if call == "read" else honest
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    store.progress()
    assert store.num_completed_offloads() == 1 and store.pop_completed_offload() is False
    assert isinstance(store.last_error, StoreFaultError)
    assert "read_checksummed" in str(store.last_error)
    assert _stored(store, names) == 0


def test_a_read_that_raises_fails_the_offload(make_store: Callable[..., Any]) -> None:
    store, device = make_store(), OnePassKV()
    store.attach({KV: device})

    def broken(call: str, honest: list[int]) -> object:
        raise OSError("the device went away")

    device.lie = broken
    names = keys(2)
    assert store.offload(transfer([1, 2], names))
    store.progress()
    assert store.pop_completed_offload() is False
    assert isinstance(store.last_error, OSError)
    assert _stored(store, names) == 0


def test_wrong_read_checksums_are_caught_when_the_pages_load(
    make_store: Callable[..., Any],
) -> None:
    """A device that hashes other bytes than it read gets its pages stored under wrong
    checksums: the load that reads them fails its verification and the pages go."""
    store, device = make_store(), OnePassKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=13)
    device.lie = lambda call, honest: [h ^ 1 for h in honest] if call == "read" else honest
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    device.lie = lambda call, honest: honest
    assert not run_load(store, "r", [7, 8, 9], names)
    assert _stored(store, names) == 0


@pytest.mark.parametrize(
    "answer",
    ["none", "one short", "a string", "a list subclass", "an int subclass passing for int"],
)
def test_a_write_answer_of_the_wrong_form_fails_the_load(answer: str) -> None:
    store, device = MemoryStore(), OnePassKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=14)
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    device.lie = lambda call, honest: BAD_ANSWERS[answer](honest) if call == "write" else honest
    assert not run_load(store, "r", [7, 8, 9], names)
    assert isinstance(store.last_error, StoreFaultError)
    assert "write_checksummed" in str(store.last_error)


def test_a_write_that_reports_another_checksum_fails_the_load_and_keeps_the_page() -> None:
    """The store compares what the device says it wrote with what it stored: a device
    that wrote (or hashed) other bytes fails the load, with a `StoreFaultError` naming
    it; the store's row, hashed again, checks out, so the page stays (a device's lie
    costs the store nothing) and an honest load of it succeeds."""
    store, device = MemoryStore(), OnePassKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=15)
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    device.lie = lambda call, honest: [*honest[:2], honest[2] ^ 1] if call == "write" else honest
    assert not run_load(store, "r", [7, 8, 9], names)
    assert isinstance(store.last_error, StoreFaultError)
    assert "'kv' answered write_checksummed" in str(store.last_error)
    assert _stored(store, names) == 3
    device.lie = lambda call, honest: honest
    assert run_load(store, "r2", [7, 8, 9], names)
    assert torch.equal(device.pages([7, 8, 9]), device.pages([1, 2, 3]))


@pytest.mark.parametrize("one_pass", [True, False], ids=["write_checksummed", "verify-first"])
def test_a_page_corrupted_in_the_memory_store_never_loads(one_pass: bool) -> None:
    """The memory store loads straight from its rows: a byte flipped in a stored page
    fails the batch on both paths; verify-first lands nothing, the one-pass path at
    most the load's own reserved slots, which a failed load's caller frees."""
    store = MemoryStore()
    device = OnePassKV() if one_pass else SplitKV()
    store.attach({KV: device})
    device.fill([1, 2, 3], seed=16)
    names = keys(3)
    assert store.offload(transfer([1, 2, 3], names))
    settle(store)
    stored = store.stored_bytes(KV, names[1])
    assert stored is not None
    stored[5] ^= 0x10
    assert not run_load(store, "r", [7, 8, 9], names)
    assert _stored(store, names) == 1  # the corrupt page and the chain after it went
    if not one_pass:
        assert not device.k[0][slots_of([7, 8, 9])].any()
    store.close()
