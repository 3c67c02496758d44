"""The native fused page copy (`unicache_fsm._pagecopy`) against the `xxhash` package.

Its XXH3-64 equals ``xxhash.xxh3_64_intdigest`` at every length it hashes (241 .. 2100,
every offset of the buffer modulo 64 bytes, random lengths up to a few pages, 1 MiB
pages), on the AVX2 path and the portable one; its copies land the source's bytes in
the named rows and nowhere else, aligned (streaming stores) or not; bad arguments are
typed errors that leave the destination untouched; calls on several threads at once
land what one thread does. Through `unicache_fsm.store.checksum`, `copy_checksum` and
`copy_checksums` give the same bytes and values with the native copy on or off, at
every length 0 .. 2100 and for strided arrays (which take the Python path).

CI requires the extension (``UNICACHE_FSM_REQUIRE_NATIVE=1``, set by scripts/test.sh);
elsewhere the native tests skip when it was not built.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from unicache_fsm.store import checksum

try:
    from unicache_fsm import _pagecopy
except ImportError:  # pragma: no cover - built without a C compiler
    _pagecopy = None  # type: ignore[assignment]

needs_native = pytest.mark.skipif(_pagecopy is None, reason="the native copy was not built")
PATHS = pytest.mark.parametrize("hardware", [True, False], ids=["avx2-if-any", "portable"])
MiB = 1 << 20


def _bytes(n: int, seed: int) -> Any:
    return np.random.default_rng(seed).integers(0, 256, size=n, dtype=np.uint8)


def _at(n: int, offset: int) -> Any:
    """A zeroed 1-D uint8 array of `n` bytes starting `offset` bytes past a 64-byte
    boundary, inside a larger zeroed buffer (the whole buffer is returned second)."""
    whole = np.zeros(n + 192, dtype=np.uint8)
    start = (-whole.ctypes.data) % 64 + offset
    return whole[start : start + n], whole


def test_the_native_copy_is_built_where_required() -> None:
    if os.environ.get("UNICACHE_FSM_REQUIRE_NATIVE") != "1":
        pytest.skip("UNICACHE_FSM_REQUIRE_NATIVE is not set (scripts/test.sh sets it)")
    assert _pagecopy is not None
    assert checksum.NATIVE_COPY
    assert checksum.COPY_IMPLEMENTATION.startswith("native")


def test_the_implementation_is_named() -> None:
    if _pagecopy is None:
        assert checksum.COPY_IMPLEMENTATION == "Python"
    else:
        want = "native, AVX2" if _pagecopy.HARDWARE_AVX2 else "native, portable C"
        assert want == checksum.COPY_IMPLEMENTATION


# -- XXH3-64 ---------------------------------------------------------------------------


@needs_native
@PATHS
def test_xxh3_equals_xxhash_at_every_length_and_offset(hardware: bool) -> None:
    data = _bytes(2100 + 64, 1).tobytes()
    view = memoryview(data)
    for n in range(_pagecopy.SHORT_MAX + 1, 2101):
        offset = n % 64  # every offset modulo 64 comes round
        piece = view[offset : offset + n]
        assert _pagecopy.xxh3_64(piece, hardware) == xxhash.xxh3_64_intdigest(piece), n


@needs_native
@PATHS
@pytest.mark.parametrize("n", [MiB, MiB + 1, 4 * MiB - 17, 3 * 1024 + 1, 1024, 1025])
def test_xxh3_equals_xxhash_at_page_sizes(hardware: bool, n: int) -> None:
    data = _bytes(n, n)
    assert _pagecopy.xxh3_64(data, hardware) == xxhash.xxh3_64_intdigest(data)


@needs_native
@settings(max_examples=60, deadline=None)
@given(n=st.integers(241, 300_000), offset=st.integers(0, 63), seed=st.integers(0, 2**32 - 1))
def test_xxh3_equals_xxhash_at_random_lengths(n: int, offset: int, seed: int) -> None:
    data = memoryview(_bytes(n + offset, seed).tobytes())[offset:]
    want = xxhash.xxh3_64_intdigest(data)
    assert _pagecopy.xxh3_64(data) == want
    assert _pagecopy.xxh3_64(data, hardware=False) == want


@needs_native
@pytest.mark.parametrize("n", [0, 1, 16, 128, 240])
def test_xxh3_refuses_short_inputs(n: int) -> None:
    with pytest.raises(ValueError, match="240"):
        _pagecopy.xxh3_64(bytes(n))


@needs_native
def test_xxh3_refuses_what_is_not_a_contiguous_buffer() -> None:
    with pytest.raises(TypeError):
        _pagecopy.xxh3_64("not bytes" * 40)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _pagecopy.xxh3_64(_bytes(1000, 0)[::2])


# -- copy_rows ------------------------------------------------------------------------------


@needs_native
@PATHS
@pytest.mark.parametrize("row_bytes", [241, 1000, 64 << 10, MiB + 64])
def test_copy_rows_lands_each_row_and_returns_its_checksum(hardware: bool, row_bytes: int) -> None:
    src = _bytes(6 * row_bytes, row_bytes).reshape(6, row_bytes)
    dst = np.zeros((5, row_bytes), dtype=np.uint8)
    dst_rows, src_rows = [4, 0, 2], [5, 1, 1]
    got = _pagecopy.copy_rows(dst, dst_rows, src, src_rows, row_bytes, hardware)
    assert got == [xxhash.xxh3_64_intdigest(src[r]) for r in src_rows]
    for d, s in zip(dst_rows, src_rows, strict=True):
        assert np.array_equal(dst[d], src[s])
    assert not dst[[1, 3]].any()  # rows not named are untouched


@needs_native
@PATHS
@pytest.mark.parametrize("offset", [0, 1, 8, 31, 32, 63])
@pytest.mark.parametrize("n", [241, 4097, 64 << 10, MiB + 3])
def test_copy_rows_at_any_destination_alignment(hardware: bool, offset: int, n: int) -> None:
    """Aligned large pages take the streaming stores, others the regular ones: the same
    bytes land, and nothing beside them is written."""
    src = _bytes(n, offset + n)
    dst, whole = _at(n, offset)
    assert _pagecopy.copy_rows(dst, [0], src, [0], n, hardware) == [xxhash.xxh3_64_intdigest(src)]
    assert np.array_equal(dst, src)
    assert int(whole.astype(np.int64).sum()) == int(src.astype(np.int64).sum())


@needs_native
def test_copy_rows_of_no_rows_is_an_empty_list() -> None:
    dst = np.zeros((2, 256), dtype=np.uint8)
    assert _pagecopy.copy_rows(dst, [], _bytes(512, 0), [], 256) == []
    assert not dst.any()


@needs_native
@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"dst_rows": [0, 1]}, ValueError, "2 destination"),
        ({"src_rows": [4]}, ValueError, "source row 4 outside"),
        ({"src_rows": [-1]}, ValueError, "source row -1 outside"),
        ({"dst_rows": [2]}, ValueError, "destination row 2 outside"),
        ({"dst_rows": [2**70]}, ValueError, "outside"),
        ({"dst_rows": [1.0]}, TypeError, "float"),
        ({"src_rows": [True]}, TypeError, "bool"),
        ({"src_rows": 3}, TypeError, "sequence"),
        ({"row_bytes": 240}, ValueError, "row_bytes 240"),
        ({"row_bytes": 300}, ValueError, "row_bytes 300"),
        ({"dst": b"\0" * 512}, TypeError, "read-write"),
        ({"src": "text"}, TypeError, "bytes-like"),
        ({"src": _bytes(8 * 256, 0).reshape(8, 256)[::2]}, ValueError, "not C-contiguous"),
    ],
)
def test_copy_rows_refuses_bad_arguments_and_writes_nothing(
    change: dict[str, Any], error: type[Exception], match: str
) -> None:
    dst = np.zeros((2, 256), dtype=np.uint8)
    args: dict[str, Any] = {
        "dst": dst,
        "dst_rows": [1],
        "src": _bytes(4 * 256, 3).reshape(4, 256),
        "src_rows": [2],
        "row_bytes": 256,
    }
    args.update(change)
    with pytest.raises(error, match=match):
        _pagecopy.copy_rows(**args)
    assert not dst.any()


@needs_native
def test_copy_rows_refuses_a_destination_row_over_its_source_row() -> None:
    both = _bytes(4 * 256, 5)
    before = both.copy()
    with pytest.raises(ValueError, match="destination row 1 overlaps source row 1"):
        _pagecopy.copy_rows(both, [0, 1], both, [3, 1], 256)
    assert np.array_equal(both, before)  # checked before anything is written
    # views of one buffer: source row 0 is bytes 128 .. 383, over destination row 1
    with pytest.raises(ValueError, match="destination row 1 overlaps source row 0"):
        _pagecopy.copy_rows(both[:512], [1], both[128:896], [0], 256)
    assert np.array_equal(both, before)


@needs_native
def test_copy_rows_on_several_threads_lands_what_one_thread_does() -> None:
    pages, row = 32, 64 << 10
    src = _bytes(pages * row, 7).reshape(pages, row)
    order = np.random.default_rng(8).permutation(pages).tolist()
    serial = _pagecopy.copy_rows(np.zeros_like(src), list(range(pages)), src, order, row)
    dst = np.zeros_like(src)
    got: list[list[int]] = [[] for _ in range(4)]

    def work(k: int) -> None:
        mine = list(range(k, pages, 4))
        got[k] = _pagecopy.copy_rows(dst, mine, src, [order[i] for i in mine], row)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k in range(4):
        assert got[k] == serial[k::4]
    assert np.array_equal(dst, src[order])


# -- through unicache_fsm.store.checksum ----------------------------------------------------


@pytest.mark.parametrize("native", [True, False], ids=["native-if-built", "python"])
def test_copy_checksum_at_every_length(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    data = _bytes(2100 + 64, 9)
    for n in range(2101):
        src = data[n % 64 : n % 64 + n]
        dst, whole = _at(n, n % 7)
        assert checksum.copy_checksum(dst, src) == xxhash.xxh3_64_intdigest(src.tobytes()), n
        assert np.array_equal(dst, src)
        assert int(whole.astype(np.int64).sum()) == int(src.astype(np.int64).sum())


@pytest.mark.parametrize("n", [300, MiB + 5])
def test_copy_checksum_of_strided_arrays(n: int) -> None:
    """A strided source or destination (the Python path) copies and hashes the bytes as
    they landed."""
    src_whole = _bytes(2 * n, n)
    src = src_whole[::2]
    dst_whole = np.zeros(2 * n, dtype=np.uint8)
    dst = dst_whole[1::2]
    want = xxhash.xxh3_64_intdigest(np.ascontiguousarray(src).tobytes())
    assert checksum.copy_checksum(dst, src) == want
    assert np.array_equal(dst, src) and not dst_whole[::2].any()
    contiguous = np.zeros(n, dtype=np.uint8)
    assert checksum.copy_checksum(contiguous, src) == want
    assert checksum.copy_checksum(dst_whole[::2], contiguous) == want


def test_copy_checksum_refuses_a_read_only_destination_by_numpy_error() -> None:
    src = _bytes(1000, 10)
    dst = np.zeros(1000, dtype=np.uint8)
    dst.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        checksum.copy_checksum(dst, src)
    assert not dst.any()


@pytest.mark.parametrize("row_bytes", [100, 241, 300 << 10])
def test_copy_checksums_native_and_python_agree(
    monkeypatch: pytest.MonkeyPatch, row_bytes: int
) -> None:
    src = _bytes(5 * row_bytes, row_bytes).reshape(5, row_bytes)
    dst_rows, src_rows = [3, 0, 1], [4, 4, 2]
    results = []
    for native in (checksum.NATIVE_COPY, False):
        monkeypatch.setattr(checksum, "NATIVE_COPY", native)
        dst = np.zeros((4, row_bytes), dtype=np.uint8)
        results.append((checksum.copy_checksums(dst, dst_rows, src, src_rows), dst))
    (native_sums, native_dst), (python_sums, python_dst) = results
    assert native_sums == python_sums == [xxhash.xxh3_64_intdigest(src[r]) for r in src_rows]
    assert np.array_equal(native_dst, python_dst)
    assert np.array_equal(native_dst[dst_rows], src[src_rows]) and not native_dst[2].any()


def test_copy_checksums_refuses_unequal_rows() -> None:
    src = _bytes(4 * 300, 11).reshape(4, 300)
    dst = np.zeros((4, 300), dtype=np.uint8)
    with pytest.raises(ValueError, match="2 source row"):
        checksum.copy_checksums(dst, [0], src, [0, 1])
    with pytest.raises(ValueError, match="299 bytes"):
        checksum.copy_checksums(np.zeros((4, 299), dtype=np.uint8), [0], src, [0])
    assert not dst.any()


@pytest.mark.parametrize("native", [True, False], ids=["native-if-built", "python"])
@pytest.mark.parametrize("side", ["destination", "source"])
def test_copies_refuse_arrays_that_are_not_bytes(
    monkeypatch: pytest.MonkeyPatch, native: bool, side: str
) -> None:
    """A uint16 array (rows of 600 bytes that the native copy, reading bytes, would cut
    as rows of 300) is a TypeError naming its side on either path, before any write."""
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    wide = (np.arange(4 * 300) % 251).astype(np.uint16).reshape(4, 300)
    byte_rows = _bytes(4 * 300, 12).reshape(4, 300)
    dst, src = (
        (np.zeros_like(wide), byte_rows)
        if side == "destination"
        else (
            np.zeros((4, 300), dtype=np.uint8),
            wide,
        )
    )
    with pytest.raises(TypeError, match=f"{side} holds uint16"):
        checksum.copy_checksums(dst, [1, 3], src, [2, 0])
    with pytest.raises(TypeError, match=f"{side} holds uint16"):
        checksum.copy_checksum(dst[1], src[2])
    assert not dst.any()


@pytest.mark.parametrize("native", [True, False], ids=["native-if-built", "python"])
def test_copy_checksums_read_numpy_integer_rows_by_value(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    """Rows as a NumPy array or NumPy integers copy as the same ints do on both paths
    (the native copy refused them, the Python path took them); a bool row is a
    TypeError naming it on both, before any write."""
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    src = _bytes(4 * 300, 13).reshape(4, 300)
    want = [xxhash.xxh3_64_intdigest(src[2]), xxhash.xxh3_64_intdigest(src[0])]
    for dst_rows, src_rows in (
        (np.array([1, 3]), np.array([2, 0], dtype=np.uint32)),
        ([np.int64(1), np.int64(3)], [np.int32(2), 0]),
    ):
        dst = np.zeros((4, 300), dtype=np.uint8)
        assert checksum.copy_checksums(dst, dst_rows, src, src_rows) == want
        assert np.array_equal(dst[[1, 3]], src[[2, 0]]) and not dst[[0, 2]].any()
    dst = np.zeros((4, 300), dtype=np.uint8)
    with pytest.raises(TypeError, match="source row 1 is a bool"):
        checksum.copy_checksums(dst, [1, 3], src, [2, True])
    with pytest.raises(TypeError, match="destination row 0 is a float"):
        checksum.copy_checksums(dst, [1.0, 3], src, [2, 0])
    assert not dst.any()
