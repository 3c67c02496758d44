"""Fault variants: an operation once more for each store fault the search may inject.

- `fault_variants(op, kinds, scope)` — `op`, and one variant per fault of the scope among
  `kinds` (the faults that apply to the calls it makes), injected on its call; a fault
  that drops pages from the store is followed by the LOOKUP that demotes what it lost.
- `punched(scope)` — with a capacity store, the statement that stops the audit checking
  that chains stay whole (an operation removed a page from a chain's middle on purpose).
- `wild_variants(op, calls)` — the variants of a plain `op` for the wild faults: one per
  eligible call it made (counted while it ran), each answering its first option.
- `other_answers(variant, plain, options)` — a wild variant's other answers, once its
  first showed how many the call has (up to the number `WILD_FAULTS` explores).
- `wild_variant(op, kind, call, answer)` — one such variant.
"""

from __future__ import annotations

from collections.abc import Sequence

from unicache_fsm.store.faults import FaultKind
from unicache_fsm.testing.explore.faults import LOSING_FAULTS, WILD_FAULTS
from unicache_fsm.testing.explore.operations import Op
from unicache_fsm.testing.explore.scope import Scope


def fault_variants(op: Op, kinds: Sequence[FaultKind], scope: Scope) -> list[Op]:
    """`op`, and one variant per fault of the scope that applies to its calls."""
    out = [op]
    for kind in kinds:
        if kind in scope.faults:
            code = f"with inject(s, FaultKind.{kind.name}):\n    " + op.code.replace("\n", "\n    ")
            if kind in LOSING_FAULTS:
                code += punched(scope)
                if "reverify(s)" not in op.code:
                    code += "\nreverify(s)"  # the LOOKUP that demotes what the store lost
            out.append(Op(f"{op.label}[{kind.value}]", code, kind))
    return out


def punched(scope: Scope) -> str:
    """With a capacity store: the statement that stops the audit checking that chains
    stay whole (a page was removed from a chain's middle on purpose), else nothing."""
    return "\ns.check_chains = False" if scope.store_pages else ""


def wild_variants(op: Op, calls: dict[FaultKind, int]) -> list[Op]:
    """The variants of the plain `op` for the wild faults of the scope: one per eligible
    call it made (`calls`, counted while it ran), each answering its first option (the
    others follow from `other_answers` once the call showed how many it has)."""
    return [
        wild_variant(op, kind, call, 0)
        for kind in WILD_FAULTS
        for call in range(1, calls.get(kind, 0) + 1)
    ]


def other_answers(variant: Op, plain: Op, options: int) -> list[Op]:
    """The other answers of a wild `variant` (its first answer ran and saw `options`),
    up to the number `WILD_FAULTS` explores for its kind."""
    assert variant.fault is not None
    top = min(options, WILD_FAULTS[variant.fault])
    return [wild_variant(plain, variant.fault, variant.call, j) for j in range(1, top)]


def wild_variant(op: Op, kind: FaultKind, call: int, answer: int) -> Op:
    """`op` with the wild fault `kind` on its `call`-th eligible call, each of the
    store's picks there taking option `answer`."""
    args = f"FaultKind.{kind.name}, call={call}, answer={answer}"
    code = f"with inject(s, {args}):\n    " + op.code.replace("\n", "\n    ")
    return Op(f"{op.label}[{kind.value}@{call}#{answer}]", code, kind, call, answer)
