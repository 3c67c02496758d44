"""The search: `explore(scope)`, breadth-first over every state a tiny system reaches.

Starting from a fresh system of the scope (audited), it runs the shared breadth-first
driver (`unicache_fsm.testing.search.breadth_first`) over states kept as 16-byte
fingerprints (memory grows with 16 bytes per state plus the current and next frontier);
a frontier entry is its operation path. Every successor of one state is independent, so
a level's frontier is split across worker processes (``workers``; by default one per
core, at most 4): each expands states (`expansion.expand_state`) and returns
fingerprints, and the main process deduplicates and merges the transition counts.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.testing.explore.counterexample import Counterexample
from unicache_fsm.testing.explore.coverage import counter_of
from unicache_fsm.testing.explore.expansion import expand_job
from unicache_fsm.testing.explore.fingerprint import fingerprint
from unicache_fsm.testing.explore.operations import fresh_namespace
from unicache_fsm.testing.explore.report import Report
from unicache_fsm.testing.explore.scope import Scope
from unicache_fsm.testing.search import Successor, breadth_first

_RUNS = itertools.count()


def explore(
    scope: Scope,
    *,
    max_depth: int | None = None,
    minutes: float | None = None,
    workers: int | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> Report:
    """Breadth-first search of every state `scope` can reach (see `unicache_fsm.testing.explore`).

    Stops at the first level holding a violation (the reported one is the first found
    at that depth, so no shorter one exists), when no new state appears (exhausted),
    past `max_depth` operations, or after `minutes`. `workers` (default: one per core,
    at most 2 on a small machine) expand a level's states in parallel. `progress` is
    called after each level with (depth, states, frontier size).
    """
    if workers is None:
        workers = max(1, min(os.cpu_count() or 1, 4))
    if workers < 1:
        msg = f"workers must be >= 1, got {workers}"
        raise ValueError(msg)
    start = time.perf_counter()
    deadline = None if minutes is None else start + minutes * 60.0
    report = Report(scope, workers=workers)
    run = f"{os.getpid()}-{next(_RUNS)}"
    counts: Counter[Any] = Counter()
    root = fresh_namespace(scope.build())
    root["s"].audit()
    visited = {fingerprint(root, scope)}
    pool = _pool(workers)

    def expand(entries: Sequence[tuple[tuple[Any, ...], None]]) -> Iterator[list[Successor[None]]]:
        jobs_ = [(scope, path, run) for path, _ in entries]
        if pool is None:
            results: Any = map(expand_job, jobs_)
        else:
            chunk = max(1, len(jobs_) // (8 * workers))
            results = pool.imap(expand_job, jobs_, chunksize=chunk)
        for children, refused, level_counts in results:
            counts.update(level_counts)
            report.refused += refused
            yield children

    try:
        out = breadth_first(
            None, visited, expand, max_depth=max_depth, deadline=deadline, progress=progress
        )
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    report.depth, report.transitions, report.exhausted = out.depth, out.transitions, out.exhausted
    if out.violation is not None:
        path, error = out.violation
        report.violation = Counterexample(scope, path, error)
    report.states = len(visited)
    report.seconds = time.perf_counter() - start
    report.coverage = Coverage.from_counter(counter_of(counts))
    return report


def _pool(workers: int) -> Any:
    if workers == 1:
        return None
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    return multiprocessing.get_context(method).Pool(workers)
