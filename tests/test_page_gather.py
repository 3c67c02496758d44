"""Pages gathered from page-major buffers into the page format and scattered back
(`unicache_fsm.store.checksum.gather_checksums` / `scatter_checksums`, native in
``unicache_fsm._pagecopy`` where built), against a reference written here with NumPy
slicing and the `xxhash` package.

The layout: buffer ``s`` holds pages of ``P`` rows of ``row_bytes[s]`` bytes; page ``i``
of the page format holds, token by token, that token's row of every buffer in order (a
KV cache's per-layer K and V buffers, K0 V0 K1 V1 ...). Every shape here (one buffer
or many, rows of odd sizes, pages of 1 to 16 tokens, pages shorter than XXH3's long
path, a page gathered twice) lands the reference's bytes and checksums on the native
path (AVX2 and portable) and the Python one; bad arguments are typed errors that move
nothing; threads at once land what one thread does.
"""

from __future__ import annotations

import subprocess
import sys
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
PATHS = pytest.mark.parametrize("native", [True, False], ids=["native-if-built", "python"])

# (page_size, row_bytes): K and V of 2 layers of 2 KiB; one buffer; odd rows; page 1;
# short pages (<= 240 bytes: XXH3's short paths); 64-byte rows, 16 tokens
SHAPES = [
    (16, [2048, 2048, 2048, 2048]),
    (4, [4096]),
    (3, [100, 36, 8, 77]),
    (1, [256, 256, 256]),
    (2, [16, 16]),
    (16, [64] * 6),
]


def _buffers(page_size: int, row_bytes: list[int], pages: int, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=pages * page_size * r, dtype=np.uint8) for r in row_bytes]


def _reference(buffers: list[Any], row_bytes: list[int], pages: list[int], p: int) -> Any:
    """The page format of `pages`, token by token, each token's row of every buffer."""
    parts = [
        buf[(page * p + t) * r : (page * p + t + 1) * r]
        for page in pages
        for t in range(p)
        for buf, r in zip(buffers, row_bytes, strict=True)
    ]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _hashes(formatted: Any, n: int) -> list[int]:
    return [xxhash.xxh3_64_intdigest(page.tobytes()) for page in formatted.reshape(n, -1)]


@PATHS
@pytest.mark.parametrize(("page_size", "row_bytes"), SHAPES)
def test_a_gather_lands_the_reference_bytes_and_checksums(
    monkeypatch: pytest.MonkeyPatch, native: bool, page_size: int, row_bytes: list[int]
) -> None:
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    buffers = _buffers(page_size, row_bytes, 9, seed=page_size)
    pages = [3, 1, 8, 3, 0]  # a page twice, page 0, the last page
    want = _reference(buffers, row_bytes, pages, page_size)
    dst = np.zeros_like(want)
    assert checksum.gather_checksums(dst, buffers, row_bytes, pages, page_size) == _hashes(
        want, len(pages)
    )
    assert np.array_equal(dst, want)
    dst[:] = 0
    assert checksum.gather_pages(dst, buffers, row_bytes, pages, page_size) is None
    assert np.array_equal(dst, want)


@PATHS
@pytest.mark.parametrize(("page_size", "row_bytes"), SHAPES)
def test_a_scatter_lands_each_page_in_its_rows_and_nowhere_else(
    monkeypatch: pytest.MonkeyPatch, native: bool, page_size: int, row_bytes: list[int]
) -> None:
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    source = _buffers(page_size, row_bytes, 9, seed=1)
    formatted = _reference(source, row_bytes, [2, 5, 7], page_size)
    dests = [np.zeros_like(b) for b in source]
    got = checksum.scatter_checksums(formatted, dests, row_bytes, [4, 1, 6], page_size)
    assert got == _hashes(formatted, 3)
    assert np.array_equal(_reference(dests, row_bytes, [4, 1, 6], page_size), formatted)
    others = [0, 2, 3, 5, 7, 8]
    assert not _reference(dests, row_bytes, others, page_size).any()
    again = [np.zeros_like(b) for b in source]
    checksum.scatter_pages(formatted, again, row_bytes, [4, 1, 6], page_size)
    assert all(np.array_equal(a, d) for a, d in zip(again, dests, strict=True))


@PATHS
@pytest.mark.parametrize("scatter", [False, True], ids=["gather", "scatter"])
def test_buffers_of_one_row_per_token_move_as_flat_ones(
    monkeypatch: pytest.MonkeyPatch, native: bool, scatter: bool
) -> None:
    """C-contiguous buffers of any shape are their bytes: a KV buffer kept as one row
    per token (2-D) moves as its flat self does, on both paths."""
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    page_size, row_bytes = SHAPES[2]
    flat = _buffers(page_size, row_bytes, 9, seed=5)
    shaped = [b.reshape(-1, r).copy() for b, r in zip(flat, row_bytes, strict=True)]
    pages = [4, 1, 6]
    want = _reference(flat, row_bytes, pages, page_size)
    if scatter:
        for b in shaped:
            b[...] = 0
        got = checksum.scatter_checksums(want, shaped, row_bytes, pages, page_size)
        assert _reference(
            [b.reshape(-1) for b in shaped], row_bytes, pages, page_size
        ).tobytes() == (want.tobytes())
    else:
        dst = np.zeros_like(want)
        got = checksum.gather_checksums(dst, shaped, row_bytes, pages, page_size)
        assert np.array_equal(dst, want)
    assert got == _hashes(want, len(pages))


@needs_native
@pytest.mark.parametrize("hardware", [True, False], ids=["avx2-if-any", "portable"])
def test_both_native_paths_agree_with_xxhash(hardware: bool) -> None:
    row_bytes = [2048, 2048] * 3
    buffers = _buffers(16, row_bytes, 6, seed=3)
    want = _reference(buffers, row_bytes, [5, 2], 16)
    dst = np.zeros_like(want)
    got = _pagecopy.gather_pages(dst, buffers, row_bytes, [5, 2], 16, True, hardware)
    assert got == _hashes(want, 2) and np.array_equal(dst, want)
    dests = [np.zeros_like(b) for b in buffers]
    back = _pagecopy.scatter_pages(dst, dests, row_bytes, [1, 4], 16, True, hardware)
    assert back == got
    assert np.array_equal(_reference(dests, row_bytes, [1, 4], 16), want)


@needs_native
def test_every_page_length_around_the_block_edges_hashes_as_xxhash() -> None:
    """Page lengths from 241 bytes past several 1 KiB blocks, on both native paths."""
    for n in range(241, 3200, 13):
        row_bytes = [n - n // 2, n // 2]
        buffers = _buffers(1, row_bytes, 3, seed=n)
        want = _reference(buffers, row_bytes, [2, 0], 1)
        for hardware in (True, False):
            dst = np.zeros_like(want)
            got = _pagecopy.gather_pages(dst, buffers, row_bytes, [2, 0], 1, True, hardware)
            assert got == _hashes(want, 2), (n, hardware)


@PATHS
def test_no_pages_is_an_empty_list(monkeypatch: pytest.MonkeyPatch, native: bool) -> None:
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    buffers = _buffers(4, [512, 512], 3, seed=4)
    empty = np.zeros(0, np.uint8)
    assert checksum.gather_checksums(empty, buffers, [512, 512], [], 4) == []
    assert checksum.scatter_checksums(empty, buffers, [512, 512], [], 4) == []


def _bad_calls() -> list[tuple[str, dict[str, Any], type[Exception], str]]:
    return [
        ("a page past the buffers", {"pages": [1, 3]}, ValueError, "outside|0 .. 2"),
        ("a negative page", {"pages": [-1, 1]}, ValueError, "below 0|0 .. 2"),
        ("a bool page", {"pages": [True, 1]}, TypeError, "page 0 is a bool"),
        ("a float page", {"pages": [1.0, 1]}, TypeError, "page 0 is a float"),
        ("rows for fewer buffers", {"row_bytes": [512]}, ValueError, "buffer"),
        ("a zero row", {"row_bytes": [512, 0]}, ValueError, "row size|row sizes"),
        ("a bad page size", {"page_size": 0}, ValueError, "page_size"),
        ("a bool page size", {"page_size": True}, TypeError, "page_size is a bool"),
        ("a float page size", {"page_size": 4.0}, TypeError, "page_size is a float"),
        # page_size * 512 wraps a 64-bit size to 512: larger than memory, not small
        ("a page past memory", {"page_size": 2**55 + 1}, ValueError, "page_size"),
        ("a page size past int64", {"page_size": 2**70}, ValueError, "page_size"),
        ("too few page bytes", {"pages": [1, 2, 0]}, ValueError, "page-format bytes"),
    ]


@PATHS
@pytest.mark.parametrize("scatter", [False, True], ids=["gather", "scatter"])
@pytest.mark.parametrize(
    ("case", "change", "error", "match"), _bad_calls(), ids=[c[0] for c in _bad_calls()]
)
def test_bad_arguments_are_typed_errors_and_move_nothing(
    monkeypatch: pytest.MonkeyPatch,
    native: bool,
    scatter: bool,
    case: str,
    change: dict[str, Any],
    error: type[Exception],
    match: str,
) -> None:
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    call: dict[str, Any] = {"row_bytes": [512, 512], "pages": [1, 2], "page_size": 4}
    call.update(change)
    buffers = [np.zeros(3 * 4 * 512, np.uint8) for _ in range(2)]
    side = np.full(2 * 4 * 1024, 7, np.uint8)
    before = [b.copy() for b in (side, *buffers)]
    move = checksum.scatter_checksums if scatter else checksum.gather_checksums
    with pytest.raises(error, match=match):
        move(side, buffers, call["row_bytes"], call["pages"], call["page_size"])
    assert all(np.array_equal(a, b) for a, b in zip(before, (side, *buffers), strict=True))


@PATHS
def test_arrays_that_are_not_contiguous_bytes_are_refused(
    monkeypatch: pytest.MonkeyPatch, native: bool
) -> None:
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    buffers = [np.zeros(2 * 4 * 512, np.uint8) for _ in range(2)]
    side = np.zeros(4 * 1024, np.uint8)
    with pytest.raises(TypeError, match="buffer 1 must be a C-contiguous uint8"):
        checksum.gather_checksums(
            side, [buffers[0], buffers[1].view(np.uint16)], [512, 512], [1], 4
        )
    strided = np.zeros(8 * 1024, np.uint8)[::2]
    with pytest.raises(TypeError, match="page-format bytes must be a C-contiguous"):
        checksum.gather_checksums(strided, buffers, [512, 512], [1], 4)
    with pytest.raises(TypeError, match="got bytes"):
        checksum.scatter_checksums(side, [bytes(4096), buffers[1]], [512, 512], [1], 4)


@PATHS
@pytest.mark.parametrize(("page_size", "row_bytes"), SHAPES[:3])
def test_page_buffers_checked_once_move_what_the_functions_move(
    monkeypatch: pytest.MonkeyPatch, native: bool, page_size: int, row_bytes: list[int]
) -> None:
    """`PageBuffers`: the buffers checked when built, then gathers and scatters of
    them land what `gather_checksums` / `scatter_checksums` land; each call still
    checks its own side and pages, and a scatter the buffers' writability."""
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    buffers = _buffers(page_size, row_bytes, 9, seed=5)
    moves = checksum.PageBuffers(buffers, row_bytes, page_size)
    pages = [3, 1, 8]
    want = _reference(buffers, row_bytes, pages, page_size)
    dst = np.zeros_like(want)
    assert moves.gather(dst, pages, checksum=True) == _hashes(want, 3)
    assert np.array_equal(dst, want)
    assert moves.scatter(dst, [0, 2, 4], checksum=False) is None
    assert np.array_equal(_reference(buffers, row_bytes, [0, 2, 4], page_size), want)
    with pytest.raises(TypeError, match="page 1 is a float"):
        moves.gather(dst, [3, 1.0, 8], checksum=True)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="page-format bytes must be a C-contiguous"):
        moves.gather(dst.astype(np.int16), pages, checksum=True)
    before = [b.copy() for b in buffers]
    buffers[-1].flags.writeable = False  # after it was built: still refused
    with pytest.raises(TypeError, match=f"buffer {len(buffers) - 1} must be writable"):
        moves.scatter(dst, [0, 2, 4], checksum=True)
    assert all(np.array_equal(a, b) for a, b in zip(before, buffers, strict=True))


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([np.zeros(8, np.int16)], [4], 1), TypeError, "buffer 0 must be a C-contiguous"),
        (([np.zeros(8, np.uint8)], [4.0], 1), TypeError, "row size 0 is a float"),
        (([np.zeros(8, np.uint8)], [4], True), TypeError, "page_size is a bool"),
        (([np.zeros(8, np.uint8)], [4], 0), ValueError, "pages of 0 bytes"),
    ],
    ids=["int16 buffer", "float row", "bool page size", "page size 0"],
)
def test_page_buffers_refuse_bad_buffers_when_built(
    args: tuple[Any, ...], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        checksum.PageBuffers(*args, call="the test")


@needs_native
def test_the_native_move_refuses_overlapping_memory() -> None:
    whole = np.zeros(6 * 4 * 512, np.uint8)
    buffers = [whole[: 3 * 2048], whole[3 * 2048 :]]
    with pytest.raises(ValueError, match="overlaps"):
        _pagecopy.gather_pages(whole[:4096], buffers, [512, 512], [1], 4)
    with pytest.raises(ValueError, match="overlaps"):
        _pagecopy.scatter_pages(whole[:4096], buffers, [512, 512], [1], 4)


@PATHS
@pytest.mark.parametrize("scatter", [False, True], ids=["gather", "scatter"])
def test_both_paths_refuse_overlapping_memory_and_move_nothing(
    monkeypatch: pytest.MonkeyPatch, native: bool, scatter: bool
) -> None:
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    whole = np.arange(6 * 4 * 512, dtype=np.uint64).astype(np.uint8)
    before = whole.copy()
    buffers = [whole[: 3 * 2048], whole[3 * 2048 :]]
    move = checksum.scatter_checksums if scatter else checksum.gather_checksums
    with pytest.raises(ValueError, match="buffer 0 overlaps"):
        move(whole[1024 : 1024 + 4096], buffers, [512, 512], [2], 4)
    assert np.array_equal(whole, before)


@PATHS
@pytest.mark.parametrize("scatter", [False, True], ids=["gather", "scatter"])
def test_a_read_only_destination_is_a_type_error_and_nothing_moves(
    monkeypatch: pytest.MonkeyPatch, native: bool, scatter: bool
) -> None:
    monkeypatch.setattr(checksum, "NATIVE_COPY", native and checksum.NATIVE_COPY)
    buffers = [np.zeros(3 * 4 * 512, np.uint8) for _ in range(2)]
    side = np.full(2 * 4 * 1024, 7, np.uint8)
    # the last destination is the read-only one: a move that checks it late has written
    # the others already
    (buffers[1] if scatter else side).flags.writeable = False
    before = [b.copy() for b in (side, *buffers)]
    move = checksum.scatter_checksums if scatter else checksum.gather_checksums
    with pytest.raises(TypeError, match="must be writable"):
        move(side, buffers, [512, 512], [1, 2], 4)
    assert all(np.array_equal(a, b) for a, b in zip(before, (side, *buffers), strict=True))


@needs_native
@pytest.mark.parametrize(
    "call",
    [
        # page_size * 8 wraps to 0 (a division by zero, SIGFPE)
        "gather_pages(bytearray(0), [bytearray(16)], [8], [], 2**61, checksum=False)",
        # page_size * 4 wraps to 4: page 0 "fits", then 2**62 rows are copied (SIGSEGV)
        "gather_pages(bytearray(4), [bytearray(64)], [4], [0], 2**62 + 1, checksum=False)",
        "scatter_pages(bytes(4), [bytearray(64)], [4], [0], 2**62 + 1, checksum=False)",
        # the sum of the row sizes wraps
        "gather_pages(bytearray(0), [bytearray(8)] * 2, [2**62, 2**62], [], 1, False)",
    ],
)
def test_the_native_move_refuses_sizes_that_wrap(call: str) -> None:
    # in a child process: on a build that computes the wrapped size, the call crashes
    code = (
        "from unicache_fsm._pagecopy import gather_pages, scatter_pages\n"
        f"try:\n    {call}\nexcept ValueError as e:\n    print('refused:', e)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused:") and "larger than memory" in done.stdout


@needs_native
def test_gathers_on_several_threads_land_what_one_thread_does() -> None:
    row_bytes = [1024] * 8
    buffers = _buffers(16, row_bytes, 33, seed=5)
    pages = [list(range(i, 32, 4)) for i in range(1, 5)]
    want = [(_reference(buffers, row_bytes, p, 16)) for p in pages]
    got: list[Any] = [None] * 4
    outs = [np.zeros_like(w) for w in want]

    def work(i: int) -> None:
        for _ in range(5):
            got[i] = checksum.gather_checksums(outs[i], buffers, row_bytes, pages[i], 16)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert np.array_equal(outs[i], want[i]) and got[i] == _hashes(want[i], len(pages[i]))


def _outcome(move: Any, side: Any, buffers: list[Any], rows: Any, pages: Any, p: Any) -> Any:
    """What a move did: its answer and the bytes of every array, or its error's type."""
    try:
        got = move(side, buffers, rows, pages, p)
    except (TypeError, ValueError) as exc:
        return type(exc), [a.tobytes() for a in (side, *buffers)]
    return got, [a.tobytes() for a in (side, *buffers)]


@needs_native
@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    scatter=st.booleans(),
    checksummed=st.booleans(),
    page_size=st.sampled_from([0, 1, 2, 3, 16, True, 2**61, -1]),
    row_bytes=st.lists(st.sampled_from([0, 1, 8, 100, 512]), max_size=4),
    extra=st.integers(0, 2),
    pages=st.lists(st.integers(-1, 4), max_size=4),
    side_pages=st.integers(-1, 1),
)
def test_the_native_and_python_paths_do_the_same_to_any_arguments(
    scatter: bool,
    checksummed: bool,
    page_size: Any,
    row_bytes: list[int],
    extra: int,
    pages: list[int],
    side_pages: int,
) -> None:
    # valid and invalid shapes alike: the same answer and bytes, or the same error
    # type with nothing moved, whichever path runs
    p = int(page_size) if 0 < page_size < 64 else 2
    sizes = [3 * p * r + extra if r else 8 for r in row_bytes]
    side_size = max(0, (len(pages) + side_pages) * p * sum(row_bytes))
    if checksummed:
        move = checksum.scatter_checksums if scatter else checksum.gather_checksums
    else:
        move = checksum.scatter_pages if scatter else checksum.gather_pages
    outcomes = []
    for native in (True, False):
        rng = np.random.default_rng(7)
        side = rng.integers(0, 256, side_size, dtype=np.uint8)
        buffers = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(checksum, "NATIVE_COPY", native)
            outcomes.append(_outcome(move, side, buffers, row_bytes, pages, page_size))
    assert outcomes[0] == outcomes[1]
