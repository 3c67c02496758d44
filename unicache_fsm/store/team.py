"""Which threads run a native page move split over threads: torch's OpenMP team, where
it can be found, else threads the move starts itself.

torch's CPU build runs its parallel work (an ``index_select`` over many rows, a large
copy) on a team of OpenMP threads (GNU libgomp, shipped in torch's wheel) that spin on
their cores for milliseconds after each parallel region before they sleep. A move that
starts threads of its own right after a torch op finds those cores taken: measured on 2
cores, a gather of 8 MiB of SGLang's K/V pages split over two threads of its own ran at
about half the speed of one thread (5.5-6.4 GiB/s against 11.4), and at 14.8 with
``OMP_WAIT_POLICY=PASSIVE``. Handed to torch's team, whose spinning threads take the
shares at once, it ran at 15.6-17.3 GiB/s, as fast as torch's own gather of the same
pages (`benchmarks/bench_storelinker.py`).

- `RUNTIME` — who runs the shares, in words (benchmarks print it): ``"OpenMP team of
  <path>"`` or ``"threads of its own"``.
- `find_openmp() -> str | None` — the path of the libgomp the process has loaded (read
  from ``/proc/self/maps``: Linux): the one inside torch's package when there are
  several, else the only one; None when there is none, several outside torch, or the
  one it would name was deleted since it was loaded (its path would open another copy).
- `use(path) -> str` — hand the moves to the team of the libgomp at `path` (already
  loaded: opening it again returns the loaded copy, so its threads are torch's), or,
  with None, to threads of their own; returns the new `RUNTIME`. `OSError` /
  `AttributeError` (a file that is no libgomp) leave the runtime as it was. Done once at
  import with `find_openmp()` (threads of their own when it finds none, or one that
  cannot be opened); the tests switch it.
- `OWN` — `RUNTIME` when the moves start threads of their own.

Before a fork the forking thread's team ends (libgomp's ``omp_pause_resource_all``,
where it has it), so that torch's parallel work and split moves in the child start a
team of their own instead of waiting for threads that stayed in the parent.
The team is used only in the process that set it: a forked child (whose copy of the
team has no threads) starts threads of its own, and one that imports this module first
does too (its libgomp is its parent's: `use` finds it mapped at the same address there;
where the parent had not imported it and had run torch's parallel work, torch's own
parallel work in the child waits forever: libgomp is not fork-safe).
libgomp gives each thread that starts a parallel region a team of its own: a move
called from a thread other than torch's (a store's worker) gets one too, whose threads
spin after it as torch's do.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from pathlib import Path

import torch

__all__ = ["OWN", "RUNTIME", "find_openmp", "use"]

_set_team: Callable[[int], None] | None
try:
    from unicache_fsm._pagecopy import set_team as _set_team
except ImportError:  # pragma: no cover - built without a C compiler
    _set_team = None

OWN: str = "threads of its own"
_PAUSE_HARD = 2  # omp_pause_hard: the runtime's threads end
_pause: Callable[[int], int] | None = None  # omp_pause_resource_all of the runtime in use
_DELETED = " (deleted)"
RUNTIME: str = OWN
"""Who runs the shares of a split move, in words."""


def find_openmp(maps: str = "/proc/self/maps") -> str | None:
    """The path of the libgomp this process has loaded (the one inside torch's package
    when there are several), else None. A copy whose file was deleted or replaced since it
    was loaded (``(deleted)`` in the maps) counts among the several but is never named:
    opening its path again would load another runtime."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return None
    loaded: dict[str, bool] = {}  # path -> its file is gone
    for line in text.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6:
            continue
        path, gone = fields[5], fields[5].endswith(_DELETED)
        if gone:
            path = path.removesuffix(_DELETED)
        if os.path.basename(path).startswith("libgomp"):
            loaded[path] = loaded.get(path, False) or gone
    paths = list(loaded)
    if len(paths) > 1:
        here = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep
        paths = [p for p in paths if os.path.realpath(p).startswith(here)]
    return paths[0] if len(paths) == 1 and not loaded[paths[0]] else None


def _starts(maps: str, path: str) -> set[str]:
    """The start addresses of the mappings of `path` in the maps file `maps`."""
    try:
        text = Path(maps).read_text()
    except OSError:
        return set()
    return {
        line.split("-", 1)[0] for line in text.splitlines() if line.split(maxsplit=5)[5:] == [path]
    }


def _inherited(path: str) -> bool:
    """Whether this process got the libgomp at `path` from its parent by fork: the parent
    maps it at the same address (a process that loaded it itself, its parent or not, has
    it elsewhere: the loader places libraries at random)."""
    here = _starts("/proc/self/maps", path)
    return bool(here) and bool(here & _starts(f"/proc/{os.getppid()}/maps", path))


def use(path: str | None) -> str:
    """Split moves run on the OpenMP team of the loaded libgomp at `path`, or (None) on
    threads of their own; returns `RUNTIME`. A libgomp this process inherited by fork
    is not used (threads of their own): the team its parent ran left no threads here,
    and libgomp would wait for them forever."""
    global RUNTIME, _pause
    if _set_team is None:
        return RUNTIME
    if path is None:
        _set_team(0)
        RUNTIME, _pause = OWN, None
        return RUNTIME
    if _inherited(path):
        return use(None)
    runtime = ctypes.CDLL(path)
    entry = runtime.GOMP_parallel  # (OSError, AttributeError: nothing changed)
    address = ctypes.cast(entry, ctypes.c_void_p).value
    assert address is not None
    pause = getattr(runtime, "omp_pause_resource_all", None)  # OpenMP 5.0 (GCC 9)
    if pause is not None:
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    _set_team(address)
    RUNTIME, _pause = f"OpenMP team of {path}", pause
    return RUNTIME


def _end_team_before_fork() -> None:
    """Before a fork: end the forking thread's team of the runtime in use (its threads
    would not be in the child, where libgomp would wait for them forever at the next
    parallel region, torch's or a move's); the next region here starts a new one."""
    if _pause is not None:
        _pause(_PAUSE_HARD)


os.register_at_fork(before=_end_team_before_fork)

try:
    use(find_openmp())
except (OSError, AttributeError):  # a libgomp that cannot be opened or lacks the entry
    use(None)
