"""Review of issue 31: a protocol monitor whose trace cannot be written (a full disk)
never raises into the caller, in record mode nor in raise mode, and keeps checking."""

from __future__ import annotations

import pytest

from unicache_fsm.integrations.protocol import ProtocolMonitor

FULL = "/dev/full"  # every write fails with ENOSPC


@pytest.mark.parametrize("mode", ["record", "raise"])
def test_a_trace_on_a_full_disk_stops_the_trace_not_the_caller(mode: str) -> None:
    monitor = ProtocolMonitor(mode=mode, trace=FULL)
    # enough transitions to overflow the trace's write buffer several times
    for i in range(600):
        rid = f"request-{i}"
        monitor.before_lookup(rid)
        monitor.before_load(rid)
        monitor.after_load(rid, True)
        monitor.before_cancel(rid)
        monitor.after_cancel(rid, True)
    monitor.close_trace()
    monitor.close_trace()
    assert isinstance(monitor.trace_error, OSError)
    assert monitor.violations == []
    assert monitor.loads == []  # every load was cancelled and forgotten
    assert monitor.counter.total() > 0


def test_a_full_trace_leaves_violations_checked_and_recorded() -> None:
    monitor = ProtocolMonitor(mode="record", trace=FULL)
    for i in range(600):
        monitor.before_lookup(f"r{i}")
    monitor.before_count()
    monitor.after_count(-1)  # a count below zero: a violation, recorded
    monitor.close_trace()
    assert len(monitor.violations) == 1
    assert monitor.trace_error is not None
