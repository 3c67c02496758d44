"""Which store faults the search injects where, and how it injects one (`inject`).

- The tables: which fault kinds apply to which operation's store calls (a lookup, a
  load, a batch start, an offload, a progress), which drop pages from the store on their
  own (`LOSING_FAULTS`), and the wild faults (`WILD_FAULTS`: they may hit any call the
  linker makes, with how many of each call's options the search takes), after which no
  LOOKUP can be trusted to tell what the store holds (`UNTRUSTED`).
- `inject(s, kind)` — a ``with`` block in which `kind` fires on the system's store
  calls; with ``call=`` (>= 1) on that eligible call only, each of the store's picks
  taking option ``answer=`` (`OneCall`). The printed counterexample tests call it too.
- `OPTIONS` — how many options the last one-call block's faulted call had (the search
  then takes each of the others).
- `OneCall.NoSuchAnswer` — raised through the linker (a `BaseException`) when the
  faulted call has fewer options than ``answer``: the operation does not exist there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from unicache_fsm.serving.system import System
from unicache_fsm.store.faults import LYING, FaultKind, FaultPolicy, FaultRule

# which fault kinds apply to which operation's calls
LOOKUP_FAULTS = (FaultKind.FAIL_LOOKUP, FaultKind.EVICT_AFTER_LOOKUP)
LOAD_FAULTS = (FaultKind.REFUSE_LOAD,)
BATCH_FAULTS = (FaultKind.FAIL_BATCH_BEFORE_START, FaultKind.FAIL_BATCH_MIDWAY)
OFFLOAD_FAULTS = (FaultKind.REFUSE_OFFLOAD, FaultKind.FAIL_OFFLOAD)
PROGRESS_FAULTS = (FaultKind.DELAY_COMPLETION,)
LOSING_FAULTS = (FaultKind.EVICT_AFTER_LOOKUP,)  # the store drops pages itself
# the faults that may hit any call the linker makes, each on one call of the search's
# choosing, answering the option it chooses (`inject`): how many options are explored
# (RAISE_ERROR: the linker contains every exception type alike, so two options cover the
# one choice that matters, a cancel that reached the store or not; GARBAGE_ANSWER: the
# longest list of wrong answers a call has). The lying store's kinds (`LYING`) hit the
# calls they apply to the same way, one call of the search's choosing at a time (a count
# of completions, a pop, a call whose reply is lost, a start), with every malformed form
# of a completion (MALFORMED_COMPLETION: the longest list a pop has)
WILD_FAULTS = {
    FaultKind.RAISE_ERROR: 2,
    FaultKind.GARBAGE_ANSWER: 6,
    FaultKind.OVERCOUNT_COMPLETIONS: 1,
    FaultKind.UNDERCOUNT_COMPLETIONS: 1,
    FaultKind.MALFORMED_COMPLETION: 6,
    FaultKind.LOST_REPLY: 1,
    FaultKind.UNKNOWN_BATCH: 1,
}
assert set(WILD_FAULTS) == {FaultKind.RAISE_ERROR, FaultKind.GARBAGE_ANSWER, *LYING}
# the faults after which no LOOKUP can be trusted to tell what the store still holds
UNTRUSTED = (FaultKind.RAISE_ERROR, FaultKind.GARBAGE_ANSWER)

NEVER = 2**62  # a period no search reaches: the rule counts calls but never fires


@contextlib.contextmanager
def inject(s: System, kind: FaultKind, *, call: int = 0, answer: int = 0) -> Iterator[None]:
    """Inject `kind` on every eligible store call inside the block (one call, in practice);
    with `call` (>= 1) on the `call`-th eligible call only, where the store's every pick
    among wrong answers (or exception types) takes option number `answer`."""
    one = OneCall(kind, call, answer) if call else None
    s.faulty.policy = one or FaultPolicy({kind: FaultRule(every=1)}, delay_steps=1)
    try:
        yield
    finally:
        s.faulty.policy = FaultPolicy()
        if one is not None:
            OPTIONS[:] = [one.options]


# how many options the last `inject(call=...)` block's faulted call had to pick from (the
# fewest over its picks; 0: it picked nothing), so that the search takes each of them
OPTIONS: list[int] = [0]


class OneCall(FaultPolicy):
    """Fires `kind` on its `call`-th eligible call only; every pick takes option `answer`."""

    __slots__ = ("answer", "call", "kind", "options")

    class NoSuchAnswer(BaseException):
        """The faulted call has fewer options than `inject`'s `answer`: the variant does
        not exist. A `BaseException`, so that the linker's containment of store faults
        (which takes every `Exception`) lets it through to `apply`, which refuses the
        operation. (Nested: a control signal between `inject` and `apply`, not one of
        the package's errors.)"""

    def __init__(self, kind: FaultKind, call: int, answer: int) -> None:
        super().__init__({kind: FaultRule(every=NEVER)}, delay_steps=1)
        self.kind, self.call, self.answer = kind, call, answer
        self.options = 0

    def roll(self, kind: FaultKind) -> bool:
        super().roll(kind)  # counts the eligible call (never fires)
        hit = kind is self.kind and self.calls(kind) == self.call
        if hit:
            self.injected[kind] += 1
        return hit

    def pick(self, options: Sequence[object]) -> object:
        self.options = min(self.options or len(options), len(options))
        if self.answer >= len(options):
            msg = f"{self.kind.value}: this call has {len(options)} options, not {self.answer + 1}"
            raise OneCall.NoSuchAnswer(msg)
        return options[self.answer]
