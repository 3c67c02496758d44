"""`ContractMonitor` switched on by configuration around a linker this project did not
write (the third-party `DirLinker`), built by SGLang 0.5.23's own factory: the wrapped
class is checked against 0.5.23's interface first (one line naming what is missing);
in record mode a violation is logged and counted, never raised into SGLang, and the
wrapped linker's answers are unchanged; counts of loads, offloads, bytes and violations
reach the log.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from sglang_linker.engine import Engine
from unicache_fsm.integrations.errors import LinkerConfigError
from unicache_fsm.integrations.protocol import ProtocolViolation

TOKENS = list(range(1, 17))
DIRLINKER = "sglang_linker.thirdparty.dirlinker"


def _monitor(wrap: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "linker": "ContractMonitor",
        "linker_module_path": "unicache_fsm.integrations.sglang",
        "linker_extra_config": {"wrap": wrap, **extra},
    }


def _dirlinker(root: Path) -> dict[str, Any]:
    return {
        "linker": "DirLinker",
        "linker_module_path": DIRLINKER,
        "linker_extra_config": {"root": str(root)},
    }


def test_record_mode_logs_and_counts_a_violation_and_changes_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Engine.launched(
        _monitor(_dirlinker(tmp_path / "pages"), mode="record", summary_every_s=3600)
    )
    monitor = engine.monitor
    assert monitor is not None and type(monitor.linker).__name__ == "DirLinker"
    wrote, _ = engine.compute(TOKENS)
    engine.settle_offloads()
    engine.evict_all()
    loaded = engine.load([*TOKENS, 99], "r1")
    assert (loaded.loaded, loaded.failed) == (16, ())
    assert loaded.slots is not None and engine.read(loaded.slots).same(wrote)

    # a planted misuse: the batch that landed is finished a second time
    index = monitor.layer_done_counter.producer_index
    with caplog.at_level(logging.ERROR, logger="unicache_fsm.integrations.protocol"):
        answer = monitor.finish_layer_wise_loading(index)  # recorded, not raised
    assert answer is monitor.linker.finish_layer_wise_loading(index)  # DirLinker's own
    assert "protocol violation" in caplog.text
    counts = monitor.counts()
    assert counts["violations"] == 1
    assert counts["loads_queued"] == counts["loads_landed"] == 1
    assert counts["offloads_accepted"] == counts["offloads_stored"] >= 1
    kv = engine.full_kv
    per_token = 2 * kv.layer_num * kv.k_buffer[0][0].numel() * kv.k_buffer[0].element_size()
    assert counts["bytes_loaded"] == 16 * per_token
    assert counts["bytes_offloaded"] >= 16 * per_token

    with caplog.at_level(logging.INFO, logger="unicache_fsm.integrations.sglang.monitor"):
        engine.close()
    line = [r.getMessage() for r in caplog.records if r.name.endswith("sglang.monitor")][-1]
    assert "loads_landed=1" in line and "violations=1" in line
    assert f"bytes_loaded={16 * per_token}" in line


def test_raise_mode_stops_the_call_before_the_wrapped_linker(tmp_path: Path) -> None:
    engine = Engine.launched(_monitor(_dirlinker(tmp_path / "pages"), mode="raise"))
    assert engine.monitor is not None
    with pytest.raises(ProtocolViolation):
        engine.monitor.finish_layer_wise_loading(7)
    engine.close()


@pytest.mark.parametrize(
    ("wrap", "says"),
    [
        (None, "linker_extra_config.wrap must be an object"),
        ({"linker": "DirLinker"}, "linker_module_path must be a non-empty string"),
        ({"linker": "X", "linker_module_path": "no_such_module_here"}, "cannot import"),
        ({"linker": "PageError", "linker_module_path": DIRLINKER}, "not a subclass"),
        (
            {"linker": "NoOffload", "linker_module_path": "sglang_linker.broken"},
            "abstract, missing offload",
        ),
        (
            {"linker": "OldOffload", "linker_module_path": "sglang_linker.broken"},
            "offload(transfers, session_id=...) fails",
        ),
        ({"backend": "lmcache"}, "one of mooncake, mori"),
        (
            {"linker": "DirLinker", "linker_module_path": DIRLINKER},  # no "root"
            "building sglang_linker.thirdparty.dirlinker.DirLinker raised KeyError",
        ),
    ],
)
def test_a_wrapped_linker_that_cannot_run_is_one_line(wrap: Any, says: str) -> None:
    with pytest.raises(LinkerConfigError) as info:
        Engine.launched(_monitor(wrap))
    text = str(info.value)
    assert says in text and len(text.splitlines()) == 1, text


def test_the_mode_is_checked() -> None:
    with pytest.raises(LinkerConfigError) as info:
        Engine.launched(_monitor({"backend": "mooncake"}, mode="log"))
    assert info.value.argument == "linker_extra_config.mode"
