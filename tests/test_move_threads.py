"""Page moves split over threads (`PageBuffers.gather` / `scatter` with ``threads > 1``,
``unicache_fsm._pagecopy``) and who runs them (`unicache_fsm.store.team`).

A split move lands the same bytes and the same checksums as one thread, on torch's
OpenMP team and on threads of its own, whatever the thread count, from the main thread
or another one, in a forked child of a process that used the team; a bad thread count
is a typed error that moves nothing, a count past any int64 the most threads.
`find_openmp` reads the libgomp this process runs (torch's; never one whose file is
gone; through a symlinked environment too), and `use` switches the runtime, or leaves
it as it was for a file that is no libgomp, or refuses a libgomp inherited by fork. A
forked child of a process whose moves ran on the team runs torch's parallel work.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash

from unicache_fsm.store import checksum, team

try:
    from unicache_fsm import _pagecopy
except ImportError:  # pragma: no cover - built without a C compiler
    _pagecopy = None  # type: ignore[assignment]

needs_native = pytest.mark.skipif(_pagecopy is None, reason="the native copy was not built")

P = 16
ROWS = [2048] * 8  # 4 layers of K and V rows of 2 KiB: pages of 256 KiB
PAGE = P * sum(ROWS)
PAGES = 24  # in the buffers
MOVE = [5, 1, 17, 2, 3, 9, 23, 11, 12, 4, 20, 6]  # 12 pages, 3 MiB: up to 6 shares
RUNTIMES = ["team", "own"]


@pytest.fixture(params=RUNTIMES)
def runtime(request: pytest.FixtureRequest) -> Iterator[str]:
    """Moves on torch's OpenMP team (where found) or on threads of their own."""
    found = team.find_openmp()
    if request.param == "team" and found is None:
        pytest.skip("no libgomp loaded in this process")
    before = found if team.RUNTIME != team.OWN else None
    team.use(found if request.param == "team" else None)
    yield request.param
    team.use(before)


@pytest.fixture
def on_the_team() -> Iterator[str]:
    """Moves on torch's OpenMP team (skipped where none is found); the runtime before
    is restored after."""
    found = team.find_openmp()
    if found is None:
        pytest.skip("no libgomp loaded in this process")
    before = found if team.RUNTIME != team.OWN else None
    team.use(found)
    yield found
    team.use(before)


def _gathered(seed: int) -> tuple[checksum.PageBuffers, Any, Any]:
    """Buffers of random pages checked once, what `MOVE` gathers from them, and a zeroed
    destination of that size."""
    buffers = _buffers(seed)
    out = np.zeros(len(MOVE) * PAGE, dtype=np.uint8)
    return checksum.PageBuffers(buffers, ROWS, P), _reference(buffers, MOVE), out


def _buffers(seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=PAGES * P * r, dtype=np.uint8) for r in ROWS]


def _reference(buffers: list[Any], pages: list[int]) -> Any:
    parts = [
        buf[(page * P + t) * r : (page * P + t + 1) * r]
        for page in pages
        for t in range(P)
        for buf, r in zip(buffers, ROWS, strict=True)
    ]
    return np.concatenate(parts)


def _sums(formatted: Any, n: int) -> list[int]:
    return [xxhash.xxh3_64_intdigest(p.data) for p in formatted.reshape(n, -1)]


@needs_native
@pytest.mark.parametrize("threads", [1, 2, 3, 5, 64, 1000])
def test_a_split_gather_lands_what_one_thread_does(runtime: str, threads: int) -> None:
    buffers = _buffers(1)
    moves = checksum.PageBuffers(buffers, ROWS, P)
    want = _reference(buffers, MOVE)
    out = np.zeros(len(MOVE) * PAGE, dtype=np.uint8)
    assert moves.gather(out, MOVE, checksum=True, threads=threads) == _sums(want, len(MOVE))
    assert np.array_equal(out, want)
    out[:] = 0
    assert moves.gather(out, MOVE, checksum=False, threads=threads) is None
    assert np.array_equal(out, want)


@needs_native
@pytest.mark.parametrize("threads", [2, 4])
def test_a_split_scatter_lands_each_page_in_its_rows_and_nowhere_else(
    runtime: str, threads: int
) -> None:
    src_buffers = _buffers(2)
    formatted = _reference(src_buffers, MOVE)
    for checksummed in (True, False):
        dests = _buffers(3)
        want = [d.copy() for d in dests]
        got = checksum.PageBuffers(dests, ROWS, P).scatter(
            formatted, MOVE, checksum=checksummed, threads=threads
        )
        for page in MOVE:
            for s, r in enumerate(ROWS):
                span = slice(page * P * r, (page + 1) * P * r)
                want[s][span] = src_buffers[s][span]
        assert all(np.array_equal(d, w) for d, w in zip(dests, want, strict=True))
        assert got == (_sums(formatted, len(MOVE)) if checksummed else None)


@needs_native
@pytest.mark.parametrize("threads", [0, -1, 2.0, True, "2", None])
def test_a_bad_thread_count_is_a_value_error_and_nothing_moves(threads: Any) -> None:
    buffers = _buffers(4)
    out = np.zeros(len(MOVE) * PAGE, dtype=np.uint8)
    with pytest.raises(ValueError, match="threads"):
        checksum.PageBuffers(buffers, ROWS, P).gather(out, MOVE, checksum=True, threads=threads)
    assert not out.any()
    with pytest.raises((ValueError, TypeError)):  # the native call on its own
        _pagecopy.gather_pages(out, buffers, ROWS, MOVE, P, True, True, threads)
    assert not out.any()


@needs_native
def test_split_moves_from_other_threads_land_what_one_thread_does(runtime: str) -> None:
    buffers = _buffers(5)
    moves = checksum.PageBuffers(buffers, ROWS, P)
    want = _reference(buffers, MOVE)
    outs = [np.zeros(len(MOVE) * PAGE, dtype=np.uint8) for _ in range(3)]
    got: list[Any] = [None] * 3

    def work(i: int) -> None:
        for _ in range(3):
            got[i] = moves.gather(outs[i], MOVE, checksum=True, threads=2)

    workers = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not any(w.is_alive() for w in workers)
    for i in range(3):
        assert np.array_equal(outs[i], want) and got[i] == _sums(want, len(MOVE))


@needs_native
def test_a_forked_child_splits_moves_over_threads_of_its_own(runtime: str) -> None:
    moves, want, out = _gathered(6)
    torch.add(torch.ones(1 << 20), 1)  # the team has run torch's work in the parent
    moves.gather(out, MOVE, checksum=True, threads=2)

    def child() -> bytes:
        out[:] = 0
        sums = moves.gather(out, MOVE, checksum=True, threads=2)
        return b"ok" if np.array_equal(out, want) and sums == _sums(want, len(MOVE)) else b"wrong"

    assert _in_child(child) == b"ok"


def test_find_openmp_names_the_libgomp_torch_loaded() -> None:
    found = team.find_openmp()
    if found is None:
        pytest.skip("torch runs no libgomp here")
    assert Path(found).exists() and Path(found).name.startswith("libgomp")
    maps = Path("/proc/self/maps").read_text()
    assert found in maps


def _maps(tmp_path: Path, paths: list[str]) -> str:
    lines = [
        f"7f00{i:04x}000-7f00{i:04x}fff r-xp 00000000 08:01 {100 + i}    {p}"
        for i, p in enumerate(paths)
    ]
    lines.append("7ffd0000-7ffd1000 rw-p 00000000 00:00 0    [stack]")
    lines.append("7ffe0000-7ffe1000 rw-p 00000000 00:00 0")
    file = tmp_path / "maps"
    file.write_text("\n".join(lines) + "\n")
    return str(file)


def test_find_openmp_prefers_torch_s_libgomp_and_refuses_to_guess(tmp_path: Path) -> None:
    torch_gomp = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    system = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
    other = "/opt/x/lib/libgomp-1234abcd.so.1"
    assert team.find_openmp(_maps(tmp_path, [system, torch_gomp, system])) == torch_gomp
    assert team.find_openmp(_maps(tmp_path, [system, system])) == system
    assert team.find_openmp(_maps(tmp_path, [system, other])) is None
    assert team.find_openmp(_maps(tmp_path, ["/usr/lib/libc.so.6"])) is None
    assert team.find_openmp(str(tmp_path / "absent")) is None


@needs_native
def test_use_switches_the_runtime_and_a_file_that_is_no_libgomp_changes_nothing(
    tmp_path: Path,
) -> None:
    found = team.find_openmp()
    before = team.RUNTIME
    try:
        assert team.use(None) == team.OWN == team.RUNTIME
        with pytest.raises(OSError):
            team.use(str(tmp_path / "absent.so"))
        assert team.RUNTIME == team.OWN
        libc = next(
            (
                line.split()[-1]
                for line in Path("/proc/self/maps").read_text().splitlines()
                if os.path.basename(line.split()[-1]).startswith("libc.so")
            ),
            None,
        )
        if libc is not None:
            with pytest.raises(AttributeError):  # loaded, but no GOMP_parallel in it
                team.use(libc)
            assert team.RUNTIME == team.OWN
        if found is not None:
            assert team.use(found) == f"OpenMP team of {found}" == team.RUNTIME
    finally:
        team.use(found if before != team.OWN else None)


# pages larger than the native move's run (512 KiB) whose tokens are whole XXH3 blocks
# move by runs of tokens, the hash carried from run to run: (page_size, row_bytes) with
# tokens of 128 KiB (4 per run), of 96 KiB (5 per run: the last run of 16 is short), of
# 1 MiB (one per run, larger than a run), and, not whole blocks, of 100,000 bytes (the
# page in one piece)
RUNS = [
    (16, [2048] * 64),
    (16, [4096] * 24),
    (3, [1 << 19, 1 << 19]),
    (8, [50_000, 50_000]),
]


@needs_native
@pytest.mark.parametrize("hardware", [True, False], ids=["avx2-if-any", "portable"])
@pytest.mark.parametrize(("page_size", "row_bytes"), RUNS)
def test_large_pages_moved_by_runs_of_tokens_hash_as_one_input(
    page_size: int, row_bytes: list[int], hardware: bool
) -> None:
    count = 3
    rng = np.random.default_rng(page_size + len(row_bytes))
    buffers = [rng.integers(0, 256, size=count * page_size * r, dtype=np.uint8) for r in row_bytes]
    pages = [2, 0]
    want = np.concatenate(
        [
            buf[(page * page_size + t) * r : (page * page_size + t + 1) * r]
            for page in pages
            for t in range(page_size)
            for buf, r in zip(buffers, row_bytes, strict=True)
        ]
    )
    sums = _sums(want, len(pages))
    out = np.zeros_like(want)
    got = _pagecopy.gather_pages(out, buffers, row_bytes, pages, page_size, True, hardware)
    assert got == sums and np.array_equal(out, want)
    dests = [np.zeros_like(b) for b in buffers]
    back = _pagecopy.scatter_pages(want, dests, row_bytes, pages, page_size, True, hardware)
    assert back == sums
    for d, b, r in zip(dests, buffers, row_bytes, strict=True):
        for page in pages:
            span = slice(page * page_size * r, (page + 1) * page_size * r)
            assert np.array_equal(d[span], b[span])
        assert not d[page_size * r : 2 * page_size * r].any()  # page 1: not named


@needs_native
@pytest.mark.parametrize("threads", [2**63, 2**64, 10**30])
def test_a_thread_count_past_any_int64_moves_as_the_most_threads_do(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    buffers = _buffers(7)
    moves = checksum.PageBuffers(buffers, ROWS, P)
    want = _reference(buffers, MOVE)
    sums = _sums(want, len(MOVE))
    out = np.zeros(len(MOVE) * PAGE, dtype=np.uint8)
    assert _pagecopy.gather_pages(out, buffers, ROWS, MOVE, P, True, True, threads) == sums
    assert np.array_equal(out, want)
    for native in (True, False):  # the native path and the Python one take the same counts
        monkeypatch.setattr(checksum, "NATIVE_COPY", native)
        out[:] = 0
        assert moves.gather(out, MOVE, checksum=True, threads=threads) == sums
        assert np.array_equal(out, want)


def test_find_openmp_names_no_libgomp_whose_file_is_gone(tmp_path: Path) -> None:
    torch_gomp = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    system = "/usr/lib/x86_64-linux-gnu/libgomp.so.1"
    gone = " (deleted)"
    # torch's copy was replaced on disk: still loaded (another runtime than the system's),
    # and its path would open a new copy
    assert team.find_openmp(_maps(tmp_path, [torch_gomp + gone, system])) is None
    assert team.find_openmp(_maps(tmp_path, [torch_gomp + gone])) is None
    assert team.find_openmp(_maps(tmp_path, [system + gone, torch_gomp])) == torch_gomp
    spaced = "/opt/my env/lib/libgomp.so.1"
    assert team.find_openmp(_maps(tmp_path, [spaced, spaced])) == spaced


@needs_native
def test_torch_s_libgomp_is_found_among_several_through_a_symlinked_environment(
    tmp_path: Path,
) -> None:
    system = Path("/usr/lib/x86_64-linux-gnu/libgomp.so.1")
    found = team.find_openmp()
    if found is None or not system.exists() or Path(found).resolve() == system.resolve():
        pytest.skip("needs torch's libgomp and the system's")
    link = tmp_path / "env"
    link.symlink_to(Path(sys.prefix).resolve())
    code = (
        f"import ctypes, torch; ctypes.CDLL({str(system)!r}); "  # a second libgomp
        "from unicache_fsm.store import team; print(team.RUNTIME)"
    )
    done = subprocess.run(
        [str(link / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip() == f"OpenMP team of {found}"


def _in_child(work: Any, wait: float = 30) -> bytes:
    """What `work()` (bytes) answers in a forked child, or a line saying it did not."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, work())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], wait)
        answer = os.read(read, 64) if ready else f"no answer in {wait} s".encode()
    finally:
        os.close(read)
        if not ready:
            os.kill(pid, 9)
        os.waitpid(pid, 0)
    return answer


@needs_native
def test_a_forked_child_that_sets_the_team_again_splits_over_threads_of_its_own(
    on_the_team: str,
) -> None:
    # a child that imports unicache_fsm first, or switches the runtime, finds the
    # libgomp its parent ran a team on: that team's threads stayed in the parent
    moves, want, out = _gathered(8)
    torch.add(torch.ones(1 << 22), 1)  # torch's team has run in this thread
    moves.gather(out, MOVE, checksum=True, threads=2)

    def child() -> bytes:
        runtime = team.use(team.find_openmp())
        out[:] = 0
        sums = moves.gather(out, MOVE, checksum=True, threads=2)
        ok = np.array_equal(out, want) and sums == _sums(want, len(MOVE))
        return (runtime if ok else "wrong").encode()

    assert _in_child(child) == team.OWN.encode()


@needs_native
def test_a_forked_child_of_a_process_whose_moves_ran_on_the_team_runs_torch_s_work(
    on_the_team: str,
) -> None:
    moves, want, out = _gathered(9)
    moves.gather(out, MOVE, checksum=True, threads=2)  # the team of this thread has run

    def child() -> bytes:
        torch.set_num_threads(2)
        total = int((torch.ones(1 << 22, dtype=torch.int64) + 1).sum())  # a parallel region
        out[:] = 0
        sums = moves.gather(out, MOVE, checksum=True, threads=2)
        ok = total == 2 << 22 and np.array_equal(out, want) and sums == _sums(want, len(MOVE))
        return b"ok" if ok else b"wrong"

    assert _in_child(child) == b"ok"
    assert moves.gather(out, MOVE, checksum=True, threads=2) == _sums(want, len(MOVE))
