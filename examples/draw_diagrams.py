"""Draw and check your own machine: ``python examples/draw_diagrams.py``.

The machine is data (``door.toml``, the format of docs/spec-format.md). The example
prints its Mermaid diagram, drives one door with a trace recorder listening (in memory),
is refused an illegal trigger (a locked door cannot open: `IllegalTransitionError`,
state unchanged), and replays the recorded trace against the spec, as
``unicache-fsm check-trace --spec examples/door.toml FILE`` does for a trace file.
"""

from pathlib import Path
from types import SimpleNamespace

from unicache_fsm import (
    CompiledExecutor,
    IllegalTransitionError,
    TraceRecorder,
    check_trace,
    load_spec,
    render_mermaid,
    spec_lookup,
)

spec = load_spec(Path(__file__).with_name("door.toml"))
print(render_mermaid(spec))
# any object with a writable `state` attribute can be a model
doors, recorder, door = CompiledExecutor(spec, SimpleNamespace), TraceRecorder(), SimpleNamespace()
doors.add_observer(recorder)
doors.initialize(door)
for trigger in ("open", "close", "lock", "open"):
    try:
        doors.fire(door, trigger)
    except IllegalTransitionError as exc:
        print(f"refused: {exc}")
result = check_trace(recorder.records(), spec_lookup([spec], fallback=None))
print(f"the door is {door.state}; {result.records} records, legal: {result.ok}")
