"""Review of issue 31: a protocol monitor whose trace cannot be written (a full disk)
never raises into the caller, in record mode nor in raise mode, and keeps checking."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from unicache_fsm.integrations.protocol import MonitorConfigError, ProtocolMonitor

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


@pytest.mark.parametrize(
    "index",
    [np.array(3), [3], {"batch": 3}, np.float64(3.0)],
    ids=["ndarray", "list", "dict", "float"],
)
def test_an_unhashable_batch_index_is_recorded_never_raised(index: object) -> None:
    """A linker answering `start_layer_wise_loading` with something unhashable gets it
    back from the cache in `finish_layer_wise_loading`: each call is a violation, and
    the monitor in record mode raises nothing into the caller."""
    monitor = ProtocolMonitor(mode="record")
    monitor.before_lookup("r")
    monitor.before_load("r")
    monitor.after_load("r", True)
    monitor.before_start()
    monitor.after_start(index)  # not an int: a violation, the load stays queued
    monitor.before_finish(index)  # type: ignore[arg-type]
    monitor.after_finish(index, True)  # type: ignore[arg-type]
    assert len(monitor.violations) == 2
    assert "start_layer_wise_loading()" in str(monitor.violations[0])
    assert "finish_layer_wise_loading" in str(monitor.violations[1])
    monitor.before_cancel("r")
    monitor.after_cancel("r", True)  # the load was still queued: a legal cancel
    assert len(monitor.violations) == 2
    assert monitor.loads == []


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_trace_that_would_block_or_fail_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    """Opening a FIFO to write waits for a reader forever: the monitor is refused
    instead (a directory too), with the argument named."""
    path = tmp_path / "trace.jsonl"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(MonitorConfigError, match="trace") as info:
        _in_bounded_time(path)
    assert info.value.argument == "trace"


def _in_bounded_time(path: Path) -> ProtocolMonitor:
    """`ProtocolMonitor(trace=path)` on a thread, failing the test (not hanging it)
    past 10 s; a blocked open of a FIFO is then released by opening its reading end."""
    out: list[ProtocolMonitor] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(ProtocolMonitor(mode="record", trace=path))
        except BaseException as exc:  # handed to the test below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"ProtocolMonitor(trace={str(path)!r}) blocked")
    if errors:
        raise errors[0]
    return out[0]
