"""The native page-hash chain (`unicache_fsm._pagechain`) against the Python reference.

`hashing.page_digests` hashes in native code where the extension was built, and
``native=False`` is the page-by-page Python reference: every test here holds both to
hashlib and to SGLang's own vectors, and the extension's portable and SHA-NI
compressions to each other, at every length around a SHA-256 block boundary.
CI requires the extension (``UNICACHE_FSM_REQUIRE_NATIVE=1``, set by scripts/test.sh);
elsewhere the native tests skip where no compiler built it.
"""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm import hashing
from unicache_fsm.hashing import pack_tokens, page_digests, prior_digest

try:
    from unicache_fsm import _pagechain
except ImportError:  # pragma: no cover - built without a C compiler
    _pagechain = None  # type: ignore[assignment]

needs_native = pytest.mark.skipif(_pagechain is None, reason="the native chain was not built")


def hashlib_chain(data: bytes, stride: int, prior: bytes) -> list[bytes]:
    out = []
    for at in range(0, len(data) // stride * stride, stride):
        prior = hashlib.sha256(prior + data[at : at + stride]).digest()
        out.append(prior)
    return out


def test_the_native_extensions_are_built_where_required() -> None:
    if os.environ.get("UNICACHE_FSM_REQUIRE_NATIVE") != "1":
        pytest.skip("UNICACHE_FSM_REQUIRE_NATIVE is not set (scripts/test.sh sets it)")
    from unicache_fsm.pools import paged

    assert hashing.NATIVE_CHAIN
    assert _pagechain is not None
    assert paged.NATIVE_CHECK


def test_golden_vectors_on_both_paths() -> None:
    from test_hashing import load_vectors

    v = load_vectors()
    seed = prior_digest(hashing.namespace_seed(cache_salt="tenant-a"))
    cases = [
        (list(range(1, 9)), 4, b"", v["tokens_1_to_8_page4"]),
        (list(range(0, 8)), 4, b"", v["tokens_0_to_7_page4"]),
        (list(range(0, 16)), 16, b"", v["tokens_0_to_15_page16"]),
        (list(range(1, 9)), 4, seed, v["tokens_1_to_8_page4_salted_tenant-a"]),
    ]
    resume = v["resume_from_prior"]
    cases.append((resume["tokens"], 4, prior_digest(resume["prior"]), resume["hash"]))
    for tokens, page_size, prior, want in cases:
        packed = pack_tokens(tokens)
        for native in (True, False):
            got = [d.hex() for d in page_digests(packed, page_size, prior, native=native)]
            assert got == want, (tokens, page_size, native)


@needs_native
@pytest.mark.parametrize("hardware", [True, False])
def test_every_length_around_the_block_boundaries(hardware: bool) -> None:
    """Pages of 1 to 200 bytes, from a chain head (no prior) and from a digest: the
    padding spills into a second block from 56 bytes of input, and whole blocks are
    compressed straight from the page."""
    assert _pagechain is not None
    data = os.urandom(3 * 200)
    for stride in range(1, 201):
        for prior in (b"", hashlib.sha256(bytes([stride])).digest()):
            got = _pagechain.chain_digests(data, stride, prior, 0, 3 * stride, hardware)
            assert got == hashlib_chain(data[: 3 * stride], stride, prior), (stride, len(prior))
            joined = _pagechain.chain_digests(
                data, stride, prior, 0, 3 * stride, hardware, joined=True
            )
            assert joined == b"".join(got), (stride, len(prior))


@needs_native
@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=300),
    page_size=st.sampled_from([1, 2, 5, 6, 8, 16, 22, 24, 64]),
    prior=st.one_of(st.just(b""), st.binary(min_size=32, max_size=32)),
    start_page=st.integers(0, 3),
)
def test_native_matches_the_reference(
    tokens: list[int], page_size: int, prior: bytes, start_page: int
) -> None:
    assert _pagechain is not None
    packed = pack_tokens(tokens)
    stride = 4 * page_size
    end = len(packed) // stride * stride
    start = min(start_page * stride, end)
    want = hashlib_chain(packed[start:end], stride, prior)
    for hardware in (True, False):
        assert _pagechain.chain_digests(packed, stride, prior, start, end, hardware) == want
    if start == 0:
        assert page_digests(packed, page_size, prior) == want
        assert page_digests(packed, page_size, prior, native=False) == want


@needs_native
def test_any_buffer_is_read_in_place() -> None:
    assert _pagechain is not None
    data = os.urandom(4 * 100)
    want = hashlib_chain(data, 4, b"")
    for buf in (data, bytearray(data), memoryview(data)):
        assert _pagechain.chain_digests(buf, 4, b"", 0, len(data)) == want
    # a view into the middle of a buffer hashes from its own offset 0
    tail = memoryview(data)[8:]
    assert _pagechain.chain_digests(tail, 4, b"", 0, 392) == hashlib_chain(data[8:], 4, b"")


@needs_native
@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        ((b"abcd", 0, b"", 0, 4), "stride"),
        ((b"abcd", -4, b"", 0, 4), "stride"),
        ((b"abcd", 4, b"x" * 31, 0, 4), "prior"),
        ((b"abcd", 4, b"x" * 33, 0, 4), "prior"),
        ((b"abcd", 4, b"", 0, 8), "whole"),
        ((b"abcd", 4, b"", -4, 4), "whole"),
        ((b"abcdef", 4, b"", 0, 6), "whole"),
        ((b"abcd", 4, b"", 4, 0), "whole"),
    ],
)
def test_bad_arguments_are_typed_errors(args: tuple[Any, ...], culprit: str) -> None:
    assert _pagechain is not None
    with pytest.raises(ValueError, match=culprit):
        _pagechain.chain_digests(*args)


@needs_native
@pytest.mark.parametrize("bad", [None, "abcd", 7, [1, 2]])
def test_non_buffers_are_refused(bad: object) -> None:
    assert _pagechain is not None
    with pytest.raises(TypeError):
        _pagechain.chain_digests(bad, 4, b"", 0, 4)
    with pytest.raises(TypeError):
        _pagechain.chain_digests(b"abcd", 4, bad, 0, 4)


@needs_native
def test_long_chains_hashed_at_once_on_threads() -> None:
    """Threads hashing long chains at once (the GIL released inside) each get their
    own chain."""
    assert _pagechain is not None
    chains = [os.urandom(4 * 5000) for _ in range(4)]
    want = [hashlib_chain(c, 4, b"") for c in chains]
    got: list[list[bytes] | None] = [None] * 4

    def run(i: int) -> None:
        got[i] = _pagechain.chain_digests(chains[i], 4, b"", 0, len(chains[i]))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == want


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("prior", [b"x", b"x" * 31, b"x" * 33, bytearray(16)])
def test_a_prior_digest_of_the_wrong_length_is_refused_on_both_paths(
    native: bool, prior: bytes
) -> None:
    with pytest.raises(hashing.InvalidPriorHashError) as info:
        page_digests(pack_tokens([1, 2, 3, 4]), 2, prior, native=native)
    assert info.value.prior == bytes(prior)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("page_size", [0, -1, 1.0, True])
def test_a_bad_page_size_is_refused_on_both_paths(native: bool, page_size: object) -> None:
    with pytest.raises(hashing.PageSizeError):
        page_digests(pack_tokens([1, 2, 3, 4]), page_size, b"", native=native)  # type: ignore[arg-type]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("prior", [0, 32, None, "ab" * 32, [0] * 32])
def test_a_prior_that_is_no_bytes_is_refused_on_both_paths(native: bool, prior: object) -> None:
    """``bytes(32)`` is 32 zero bytes: an int prior was hashed as a digest of zeros (and 0
    as a chain head) instead of being refused."""
    with pytest.raises(hashing.InvalidPriorHashError, match="bytes-like") as info:
        page_digests(pack_tokens([1, 2, 3, 4]), 2, prior, native=native)  # type: ignore[arg-type]
    assert info.value.prior is prior


@pytest.mark.parametrize("native", [True, False])
def test_packed_tokens_of_any_buffer_are_hashed_by_their_bytes(native: bool) -> None:
    """An array('I') or a cast memoryview of the packed tokens hashes as its bytes (its
    len() counts items, not bytes: only a quarter of the pages were hashed), and a
    non-contiguous view as the bytes it shows."""
    import array

    tokens = list(range(64))
    packed = pack_tokens(tokens)
    want = page_digests(packed, 4, native=native)
    assert len(want) == 16
    for same in (array.array("I", tokens), memoryview(packed).cast("I"), bytearray(packed)):
        assert page_digests(same, 4, native=native) == want  # type: ignore[arg-type]
    spread = memoryview(bytes(b for b in packed for _ in (0, 1)))[::2]
    assert page_digests(spread, 4, native=native) == want  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="packed"):
        page_digests("x" * 64, 4, native=native)  # type: ignore[arg-type]


@pytest.mark.parametrize("native", [True, False])
def test_a_bytearray_changed_after_a_call_is_hashed_anew(native: bool) -> None:
    """The Python path's memo kept the caller's bytearray itself as a chain's pages, so
    after the caller changed it in place the next call found "the same" pages and
    answered the old digests. The pages are copied to bytes first."""
    packed = bytearray(pack_tokens(list(range(32))))
    first = page_digests(packed, 4, native=native)
    assert first == hashlib_chain(bytes(packed), 16, b"")
    packed[-1] ^= 0xFF  # the last page changes; the first page (the memo's key) does not
    assert page_digests(packed, 4, native=native) == hashlib_chain(bytes(packed), 16, b"")
    assert page_digests(packed, 4, native=native)[-1] != first[-1]
