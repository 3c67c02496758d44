"""A TCP-like connection in the engine: nothing here is about caches.

    python examples/tcp.py [--trace FILE.jsonl]

Runs two connections through a handshake in which one ACK carries the wrong number (the
`ack_matches` guard refuses it and the state does not move), sends data, closes both
sides in order, and resets a third connection mid-handshake. Every transition is
recorded as JSON lines (default: a temporary file, removed at exit), and the trace is replayed
against ``examples/tcp.toml`` — the same check as::

    unicache-fsm check-trace --spec examples/tcp.toml FILE.jsonl

The spec is data (``tcp.toml``); this file only supplies the model: its state slot,
its guard and its callbacks, each called with the trigger's arguments.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from unicache_fsm import (
    CompiledExecutor,
    GuardRejectedError,
    TraceRecorder,
    check_trace,
    load_spec,
    read_trace,
    spec_lookup,
)

SPEC = Path(__file__).resolve().parent / "tcp.toml"


class Connection:
    """One end of a connection: sequence numbers and what it sent (`log`)."""

    __slots__ = ("expected_ack", "isn", "log", "name", "next_seq", "state")
    state: str  # the FSM's state slot

    def __init__(self, name: str, isn: int) -> None:
        self.name = name
        self.isn = isn
        self.next_seq = isn
        self.expected_ack = -1
        self.log: list[str] = []

    @property
    def fsm_id(self) -> str:
        """How traces and errors name this connection."""
        return self.name

    # -- guard: reads the trigger's argument, never a stored verdict ------------------
    def ack_matches(self, ack: int = -1, **_: Any) -> bool:
        return ack == self.expected_ack

    # -- callbacks ---------------------------------------------------------------------
    def _emit(self, segment: str) -> None:
        self.log.append(segment)
        self.next_seq += 1
        self.expected_ack = self.next_seq

    def send_syn(self, **_: Any) -> None:
        self._emit(f"SYN seq={self.next_seq}")

    def send_syn_ack(self, seq: int, **_: Any) -> None:
        self._emit(f"SYN+ACK seq={self.next_seq} ack={seq + 1}")

    def send_ack(self, seq: int, **_: Any) -> None:
        self.log.append(f"ACK ack={seq + 1}")

    def transmit(self, data: bytes = b"", **_: Any) -> None:
        self.log.append(f"DATA seq={self.next_seq} len={len(data)}")
        self.next_seq += len(data)

    def send_fin(self, **_: Any) -> None:
        self._emit(f"FIN seq={self.next_seq}")

    def note_established(self, **_: Any) -> None:
        self.log.append("(established)")

    def release(self, **_: Any) -> None:
        self.log.append("(released)")


def run(trace_path: Path) -> list[Connection]:
    """The scenario of the module docstring; returns the connections it drove."""
    tcp = CompiledExecutor(load_spec(SPEC), Connection)
    server, client, doomed = Connection("server", 5000), Connection("client", 100), None
    with TraceRecorder(trace_path) as recorder:
        tcp.add_observer(recorder)
        for conn in (server, client):
            tcp.initialize(conn)
        tcp.fire(server, "listen")
        tcp.fire(client, "connect")
        tcp.fire(server, "syn", seq=client.isn)
        tcp.fire(client, "syn_ack", seq=server.isn, ack=client.isn + 1)
        try:
            tcp.fire(server, "ack", ack=12345)  # a stray ACK with the wrong number
        except GuardRejectedError as exc:
            print(f"refused:  {exc}")
        assert tcp.state_of(server) == "syn_received"
        tcp.fire(server, "ack", ack=server.isn + 1)
        tcp.fire(client, "send", data=b"hello")
        tcp.fire(client, "close")
        tcp.fire(server, "fin", seq=client.next_seq - 1)
        tcp.fire(server, "close")
        tcp.fire(client, "ack", ack=client.next_seq)
        doomed = Connection("doomed", 7)
        tcp.initialize(doomed)
        tcp.fire(doomed, "connect")
        print(f"doomed may ack with 8? {tcp.may_fire(doomed, 'syn_ack', seq=1, ack=8)}")
        tcp.fire(doomed, "reset")
    return [server, client, doomed]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A TCP-like connection in unicache_fsm.")
    parser.add_argument("--trace", type=Path, default=None, metavar="FILE.jsonl")
    args = parser.parse_args(argv)
    if args.trace is not None:
        return report(args.trace)
    with tempfile.TemporaryDirectory(prefix="tcp_example_") as scratch:
        return report(Path(scratch) / "tcp.jsonl")


def report(trace: Path) -> int:
    """Run the scenario recording into `trace`, print each connection, check the trace."""
    for conn in run(trace):
        print(f"{conn.name:<8} {conn.state:<8} {' | '.join(conn.log)}")
    result = check_trace(read_trace(trace), spec_lookup([load_spec(SPEC)]))
    print(f"trace:    {trace} ({result.records} records, legal: {result.ok})")
    print(f"check it: unicache-fsm check-trace --spec {SPEC} {trace}")
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
