"""``unicache-fsm explore [--pages N] [--requests R] [--page-size P] [--key-pages K]
[--swa-window W] [--swa-checkpoint C] [--host-pages H] [--faults F] [--unpinned]
[--corrupt] [--store-pages S] [--unrelated] [--depth D] [--minutes M] [--workers J]
[--coverage F] [--test-out F]``: search every state of a tiny system breadth-first.

Turns the arguments into a `Scope` of `unicache_fsm.testing.explore` (refusing an
unknown fault kind, a checkpoint without a window, a window that is not a whole number
of pages) and searches it, showing its progress (depth, states, time left under
``--minutes``) on stderr. Then prints the distinct states, transitions, states/s,
depth, the declared transitions reached and what ended the search (exhausted, "depth
limit D reached" or "time limit T s reached"). On a violation it prints the shortest
operation sequence as a pytest test (also written to ``--test-out``) and the machines'
diagrams along it, and exits 1 (`EXIT_CHECK_FAILED`). ``--swa-window`` is in tokens,
as in ``simulate`` (a multiple of the page size). The defaults are a scope that
exhausts in minutes (4 pages, 2 requests of one one-page key, FULL+SWA with a one-page
window, `DEFAULT_EXPLORE_FAULTS`).

The search's modules are imported when the command runs, never when this module is.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from unicache_fsm.cli.arguments import (
    MAX_EXPLORE_PAGES,
    MAX_MINUTES,
    MAX_STEPS,
    MAX_WORKERS,
    CliError,
    int_in,
    minutes,
    output_file,
    path_arg,
)
from unicache_fsm.cli.command import EXIT_CHECK_FAILED, EXIT_OK, Command
from unicache_fsm.console import print_summary, search_progress

__all__ = ["COMMAND", "DEFAULT_EXPLORE_FAULTS"]

# with the other defaults (4 pages, 2 requests of one one-page key, FULL+SWA window 1) a
# scope searched to exhaustion in about a minute on two cores; `all` multiplies each
# state's successors (the wild faults hit every call) past what minutes exhaust
DEFAULT_EXPLORE_FAULTS = "refuse_load,fail_batch_midway"


def _arguments(p: argparse.ArgumentParser) -> None:
    pages = int_in(1, MAX_EXPLORE_PAGES)
    top = MAX_EXPLORE_PAGES
    p.add_argument(
        "--pages", type=pages, default=4, metavar="N", help=f"FULL pool pages (4; 1-{top})"
    )
    p.add_argument(
        "--requests", type=int_in(1, 9), default=2, metavar="R", help="requests (2; 1-9)"
    )
    p.add_argument(
        "--page-size", type=pages, default=1, metavar="P", help=f"tokens a page (1; 1-{top})"
    )
    p.add_argument(
        "--key-pages",
        type=pages,
        default=1,
        metavar="K",
        help=f"pages of each request's key (1: every request asks for the same key; 1-{top})",
    )
    p.add_argument(
        "--swa-window",
        type=int_in(0, top * top),
        default=None,
        metavar="W",
        help=f"SWA window in tokens, a multiple of P of at most {top} pages; 0 explores a "
        f"FULL-only system (0-{top * top}; default: one page)",
    )
    p.add_argument(
        "--swa-checkpoint",
        type=int_in(0, top),
        default=0,
        metavar="K",
        help=f"keep the SWA window ending every K pages of a request too (0: off; 0-{top})",
    )
    p.add_argument(
        "--host-pages",
        type=int_in(0, top),
        default=0,
        metavar="H",
        help=f"host tier pages (0; 0-{top})",
    )
    p.add_argument(
        "--faults",
        default=DEFAULT_EXPLORE_FAULTS,
        metavar="KINDS",
        help="store faults the search may inject: all, none, or kinds joined by commas "
        f"({DEFAULT_EXPLORE_FAULTS}; the defaults are a scope that exhausts in minutes)",
    )
    p.add_argument(
        "--unpinned",
        action="store_true",
        help="a request may also match without pinning its prefix until its LOAD",
    )
    p.add_argument(
        "--corrupt", action="store_true", help="the search may corrupt a page the store holds"
    )
    p.add_argument(
        "--unrelated",
        action="store_true",
        help="the search may also compute a one-page key no request shares (not offloaded): "
        "another prefix that takes the slots evictions free",
    )
    p.add_argument(
        "--store-pages",
        type=int_in(0, top),
        default=0,
        metavar="S",
        help=f"the store holds at most S pages, evicting for room (0: unbounded; 0-{top})",
    )
    p.add_argument(
        "--depth",
        type=int_in(1, MAX_STEPS),
        default=None,
        metavar="D",
        help=f"stop after D operations (1-{MAX_STEPS}; default: no depth limit)",
    )
    p.add_argument(
        "--minutes",
        type=minutes,
        default=None,
        metavar="M",
        help=f"stop after M minutes (above 0, at most {MAX_MINUTES:.0f}; default: no time limit)",
    )
    p.add_argument(
        "--workers",
        type=int_in(1, MAX_WORKERS),
        default=None,
        metavar="J",
        help=f"processes (default: one per core; 1-{MAX_WORKERS})",
    )
    p.add_argument(
        "--coverage",
        type=path_arg,
        default=None,
        metavar="FILE.json",
        help="write the transitions reached (for diagram --coverage; default: not written)",
    )
    p.add_argument(
        "--test-out",
        type=path_arg,
        default=None,
        metavar="FILE.py",
        help="write the counterexample test there too (on a violation; default: only printed)",
    )


def _explore_scope(args: argparse.Namespace) -> Any:
    from unicache_fsm.store.faults import FaultKind
    from unicache_fsm.testing.explore import Scope

    text = args.faults.strip()
    kinds = {k.value: k for k in FaultKind}
    if text == "all":
        faults = tuple(FaultKind)
    elif text in ("none", ""):
        faults = ()
    else:
        names = [n.strip() for n in text.split(",")]
        bad = [n for n in names if n not in kinds]
        if bad:
            msg = f"--faults: unknown fault kind {bad[0]!r}; valid: all, none, {', '.join(kinds)}"
            raise CliError(msg)
        faults = tuple(dict.fromkeys(kinds[n] for n in names))
    if args.swa_checkpoint and args.swa_window == 0:
        msg = "--swa-checkpoint needs --swa-window above 0 (checkpoints keep SWA windows)"
        raise CliError(msg)
    for flag in ("coverage", "test_out"):
        path = getattr(args, flag)
        if path is not None:
            output_file("--" + flag.replace("_", "-"), path)
    window_pages = _window_pages(args.swa_window, args.page_size)
    try:
        return Scope(
            pages=args.pages,
            requests=args.requests,
            page_size=args.page_size,
            swa=window_pages > 0,
            swa_pages=args.pages,
            window_pages=max(1, window_pages),
            key_pages=args.key_pages,
            host_pages=args.host_pages,
            faults=faults,
            unpinned=args.unpinned,
            corrupt=args.corrupt,
            store_pages=args.store_pages,
            unrelated=args.unrelated,
            swa_checkpoint=args.swa_checkpoint,
        )
    except ValueError as exc:
        flag = str(exc).split()[0].removeprefix("Scope.").replace("_", "-")
        msg = f"--{flag}: {exc}"
        raise CliError(msg) from exc


def _window_pages(tokens: int | None, page_size: int) -> int:
    """``explore --swa-window`` (tokens, like ``simulate``'s) in pages; None: one page."""
    if tokens is None:
        return 1
    if tokens % page_size:
        lower, upper = tokens // page_size * page_size, (tokens // page_size + 1) * page_size
        near = f"{lower} or {upper}" if lower else str(upper)
        msg = (
            f"--swa-window {tokens} is in tokens and must be a multiple of the page size "
            f"{page_size} (--page-size): use {near}"
        )
        raise CliError(msg)
    if tokens // page_size > MAX_EXPLORE_PAGES:
        msg = (
            f"--swa-window {tokens} is {tokens // page_size} pages of {page_size} tokens; "
            f"at most {MAX_EXPLORE_PAGES} pages"
        )
        raise CliError(msg)
    return tokens // page_size


def _explore_result(args: argparse.Namespace, report: Any) -> str | None:
    """Why the search ended, when no violation did it: which limit, or exhausted."""
    if report.violation is not None:
        return None
    if report.exhausted:
        return "exhausted: every reachable state checked, no invariant broken"
    if args.depth is not None and report.depth >= args.depth:
        return f"depth limit {args.depth} reached: no invariant broken so far"
    if args.minutes is not None:
        return f"time limit {args.minutes * 60:g} s reached: no invariant broken so far"
    return "stopped: no invariant broken so far"


def _run(args: argparse.Namespace) -> int:
    from unicache_fsm.testing.explore import explore

    scope = _explore_scope(args)
    seconds = None if args.minutes is None else args.minutes * 60
    with search_progress("exploring", seconds=seconds, depth=args.depth) as progress:
        report = explore(
            scope,
            max_depth=args.depth,
            minutes=args.minutes,
            workers=args.workers,
            progress=progress,
        )
    if args.coverage is not None:
        report.coverage.save(args.coverage)
    rows = [_summary_row(line) for line in report.summary().splitlines()]
    result = _explore_result(args, report)
    if result is not None:
        rows = [("result", result) if k == "result" else (k, v) for k, v in rows]
    print_summary(rows)
    if report.violation is None:
        return EXIT_OK
    test = report.violation.as_test()
    print("\n# -- the shortest counterexample, as a pytest test --\n")
    print(test)
    print("# -- the machines along it (Mermaid; last state highlighted) --\n")
    print(report.violation.diagrams())
    if args.test_out is not None:
        Path(args.test_out).write_text(test, encoding="utf-8")
    return EXIT_CHECK_FAILED


def _summary_row(line: str) -> tuple[str, str]:
    """A ``label   text`` line of a search summary as a (label, text) row."""
    label, _, text = line.partition(" ")
    return label, text.strip()


COMMAND = Command(
    "explore",
    "explore every state of a tiny system breadth-first; shortest counterexamples",
    _arguments,
    _run,
)
