"""Operations and the states they run on: a state is a namespace of Python names.

- `Op` — one operation: its label, and the Python statement that performs it (the very
  text a printed counterexample runs), with the fault variant's kind, call and answer.
- `fresh_namespace(s)` — a state: ``s``, the system, beside the helpers statements call;
  a statement adds the requests ``r0, r1, ...`` (`named_requests` lists them).
- `apply(op, ns)` — run the statement, then (``audit=True``) every invariant of the kit;
  `Refused` when the tiny pools cannot serve it (it is not enabled there), any other
  exception is a finding.
- `replay(scope, path)` — a fresh system of `scope` after `path`, unaudited.
- `snapshot(ns)` — an independent copy of a state (system and requests deep-copied
  together, helpers shared), so a successor is reached without replaying its path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import attrs

from unicache_fsm.copying import deep
from unicache_fsm.fsm.errors import UnicacheFsmError
from unicache_fsm.serving.request import Request
from unicache_fsm.serving.system import System
from unicache_fsm.store.faults import FaultKind
from unicache_fsm.testing.explore.faults import OneCall, inject
from unicache_fsm.testing.explore.helpers import corrupt, node_at, reverify
from unicache_fsm.testing.explore.scope import Scope
from unicache_fsm.tree import EvictParams

REFUSALS = ("the FULL pool cannot hold", "the SWA pool cannot hold")


@attrs.frozen
class Op:
    """One operation: a label for reports and the Python statement that performs it
    (run with ``s``, the system, and ``r0, r1, ...``, the requests, in scope)."""

    label: str
    code: str
    fault: FaultKind | None = None  # a variant: the fault injected on the plain op's call
    call: int = 0  # a wild fault's variant: the eligible call it hits (1, 2, ...)
    answer: int = 0  # ... and the option each of the store's picks takes there


_COMPILED: dict[str, Any] = {}


def named_requests(ns: dict[str, Any], scope: Scope) -> list[tuple[int, Request | None]]:
    """Each request number of `scope` with its request in `ns` (None: not begun)."""
    return [(i, ns.get(f"r{i}")) for i in range(scope.requests)]


def fresh_namespace(s: System) -> dict[str, Any]:
    """The state of system `s` before any request: the names a statement runs with."""
    return {
        "s": s,
        "EvictParams": EvictParams,
        "FaultKind": FaultKind,
        "inject": inject,
        "node_at": node_at,
        "reverify": reverify,
        "corrupt": corrupt,
    }


def _run(op: Op, ns: dict[str, Any]) -> None:
    code = _COMPILED.get(op.code)
    if code is None:
        code = _COMPILED[op.code] = compile(op.code, f"<op {op.label}>", "exec")
    exec(code, ns)  # the operation's statement, the same text the printed test runs


class Refused(UnicacheFsmError):
    """The tiny pools cannot serve the operation: it is not enabled in that state."""


def apply(op: Op, ns: dict[str, Any], *, audit: bool = True) -> None:
    """Run `op` on the system in `ns`, then (with `audit`) check every invariant.

    Raises `Refused` when the harness cannot allocate; any other exception is a finding.
    """
    try:
        _run(op, ns)
    except AssertionError as exc:
        if str(exc).startswith(REFUSALS):
            raise Refused(str(exc)) from exc
        raise
    except OneCall.NoSuchAnswer as exc:  # a wild fault's answer the call does not have
        raise Refused(str(exc)) from exc
    if audit:
        ns["s"].audit()


def replay(scope: Scope, path: Sequence[Op]) -> dict[str, Any]:
    """A fresh system of `scope` after `path` (no audits: the path was checked)."""
    ns = fresh_namespace(scope.build())
    for op in path:
        apply(op, ns, audit=False)
    return ns


_STATE_NAMES = re.compile(r"s|r[0-9]+")


def snapshot(ns: dict[str, Any]) -> dict[str, Any]:
    """An independent copy of the state in `ns` (the system and the requests, deep-copied
    together; the helpers shared), so that each successor of a state is reached without
    replaying its path. The copy's machines keep the original's observers.

    The copy is ``copy.deepcopy``'s, made faster by `unicache_fsm.copying.deep`."""
    out = dict(ns)
    state = {k: v for k, v in ns.items() if _STATE_NAMES.fullmatch(k)}
    out.update(deep(state, {}))
    return out
