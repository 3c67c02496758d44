"""An order workflow in the engine: nested states, parallel regions, guards.

    python examples/order.py [--trace FILE.jsonl]

Three orders go through ``examples/order.toml``: one is paid, packed and shipped (a
first attempt to ship before the payment is captured is refused by a guard), one goes
back from the checkout to the cart and is then cancelled while being picked, and one
is cancelled after its payment was captured (and refunded). Each order logs its
callbacks, so the output shows the order in which nested and parallel states are
entered and exited. The scenario runs on both executors, which must agree, and the
compiled run's trace is replayed against the spec, as
``unicache-fsm check-trace --spec examples/order.toml FILE.jsonl`` would.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from unicache_fsm import (
    CompiledExecutor,
    Executor,
    GuardRejectedError,
    ReferenceExecutor,
    TraceRecorder,
    check_trace,
    load_spec,
    read_trace,
    spec_lookup,
)

SPEC = Path(__file__).resolve().parent / "order.toml"


class Order:
    """An order: its items, what was paid, and a log of the callbacks that ran."""

    def __init__(self, name: str, machine: Executor) -> None:
        self.name = name
        self.machine = machine  # the guard asks it which states are active
        self.items: list[str] = []
        self.paid = 0
        self.log: list[str] = []
        self.state = ""

    @property
    def fsm_id(self) -> str:
        return self.name

    # -- guards --------------------------------------------------------------------------
    def has_items(self, **_: Any) -> bool:
        return bool(self.items)

    def payment_captured(self, **_: Any) -> bool:
        return self.machine.is_active(self, "fulfilment.payment.captured")

    # -- callbacks -----------------------------------------------------------------------
    def add_to_cart(self, item: str, **_: Any) -> None:
        self.items.append(item)

    def open_checkout(self, **_: Any) -> None:
        self.log.append("enter checkout")

    def close_checkout(self, **_: Any) -> None:
        self.log.append("exit checkout")

    def reserve_stock(self, **_: Any) -> None:
        self.log.append(f"enter fulfilment: reserve {len(self.items)} items")

    def end_fulfilment(self, **_: Any) -> None:
        self.log.append("exit fulfilment")

    def record_payment(self, amount: int = 0, **_: Any) -> None:
        self.paid = amount
        self.log.append(f"captured {amount}")

    def refund_if_paid(self, **_: Any) -> None:
        self.log.append(f"refund {self.paid}" if self.paid else "nothing to refund")


def run(kind: type[Executor], trace_path: Path | None = None) -> list[Order]:
    """The scenario of the module docstring on one executor; returns the orders."""
    machine = kind(load_spec(SPEC), Order)
    recorder = TraceRecorder(trace_path) if trace_path is not None else None
    if recorder is not None:
        machine.add_observer(recorder)
    shipped, dropped, refunded = (Order(n, machine) for n in ("A-1", "B-2", "C-3"))
    for order in (shipped, dropped, refunded):
        machine.initialize(order)

    for item in ("book", "lamp"):
        machine.fire(shipped, "add_item", item=item)
    for trigger in ("check_out", "next", "place", "pack"):
        machine.fire(shipped, trigger)
    both = all(machine.is_active(shipped, p) for p in ("fulfilment.payment", "fulfilment.shipping"))
    shipped.log.append(f"both regions active: {both}")
    try:
        machine.fire(shipped, "ship")
    except GuardRejectedError as exc:
        shipped.log.append(f"refused: guard {exc.guard!r}")
    machine.fire(shipped, "capture", amount=42)
    machine.fire(shipped, "ship")

    try:
        machine.fire(dropped, "check_out")
    except GuardRejectedError as exc:
        dropped.log.append(f"refused: guard {exc.guard!r}")
    machine.fire(dropped, "add_item", item="pen")
    for trigger in ("check_out", "back", "check_out", "next", "place", "cancel"):
        machine.fire(dropped, trigger)

    machine.fire(refunded, "add_item", item="chair")
    for trigger in ("check_out", "next", "place"):
        machine.fire(refunded, trigger)
    machine.fire(refunded, "capture", amount=99)
    machine.fire(refunded, "cancel")
    if recorder is not None:
        recorder.close()
    return [shipped, dropped, refunded]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="An order workflow in unicache_fsm.")
    parser.add_argument("--trace", type=Path, default=None, metavar="FILE.jsonl")
    args = parser.parse_args(argv)
    if args.trace is not None:
        return report(args.trace)
    with tempfile.TemporaryDirectory(prefix="order_example_") as scratch:
        return report(Path(scratch) / "order.jsonl")


def report(trace: Path) -> int:
    """Run both executors (the compiled one recording into `trace`) and check the trace."""
    compiled = run(CompiledExecutor, trace)
    reference = run(ReferenceExecutor)
    for order in compiled:
        print(f"{order.name}  {order.state}")
        for line in order.log:
            print(f"       {line}")
    agree = [(o.state, o.log) for o in compiled] == [(o.state, o.log) for o in reference]
    print(f"executors agree: {agree}")
    result = check_trace(read_trace(trace), spec_lookup([load_spec(SPEC)]))
    print(f"trace:    {trace} ({result.records} records, legal: {result.ok})")
    return 0 if agree and result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
