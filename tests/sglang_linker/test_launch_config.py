"""``linker_extra_config`` mistakes, found when SGLang 0.5.23's factory builds the linker:
each is one `LinkerConfigError` line naming the key, raised at construction (a worker
that starts never fails on its first request instead), and nothing is left open.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from sglang_linker.engine import Engine
from unicache_fsm.integrations.errors import LinkerConfigError

MODULE = "unicache_fsm.integrations.sglang"


def _store_linker(**extra: Any) -> dict[str, Any]:
    return {"linker": "StoreLinker", "linker_module_path": MODULE, "linker_extra_config": extra}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize(
    ("extra", "argument", "says"),
    [
        ({"stroe": "memory"}, "linker_extra_config", "unknown keys ['stroe']"),
        ({"store": 7}, "linker_extra_config.store", "must be a non-empty string"),
        ({"store": "tape:/dev/st0"}, "linker_extra_config.store", "is not a store"),
        ({"namespace": "../up"}, "linker_extra_config.namespace", "1 to 47 of"),
        ({"namespace": "x" * 48}, "linker_extra_config.namespace", "1 to 47 of"),
        ({"staging_bytes": True}, "linker_extra_config.staging_bytes", "an integer"),
        ({"staging_bytes": "64M"}, "linker_extra_config.staging_bytes", "an integer"),
        ({"staging_bytes": 16}, "linker_extra_config.staging_bytes", "smaller than one page"),
        ({"load_timeout_s": float("nan")}, "linker_extra_config.load_timeout_s", "seconds"),
        ({"load_timeout_s": 0}, "linker_extra_config.load_timeout_s", "seconds"),
        ({"capacity_pages": 0}, "linker_extra_config.capacity_pages", "an integer"),
        ({"trace": ""}, "linker_extra_config.trace", "non-empty string"),
        ({"trace": "/"}, "linker_extra_config.trace", "cannot write it"),
    ],
)
def test_a_bad_key_is_one_line_naming_it(extra: dict[str, Any], argument: str, says: str) -> None:
    with pytest.raises(LinkerConfigError) as info:
        Engine.launched(_store_linker(**extra))
    assert info.value.argument == argument
    text = str(info.value)
    assert says in text and len(text.splitlines()) == 1, text


def test_a_store_that_cannot_be_reached_or_opened_is_refused_at_start(tmp_path: Path) -> None:
    port = _free_port()  # nothing listens there
    with pytest.raises(LinkerConfigError) as info:
        Engine.launched(_store_linker(store=f"redis://127.0.0.1:{port}/0"))
    assert info.value.argument == "linker_extra_config.store"
    assert str(port) in str(info.value) and len(str(info.value).splitlines()) == 1
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(LinkerConfigError) as info:
        Engine.launched(_store_linker(store=f"file:{blocker}"))
    assert info.value.argument == "linker_extra_config.store"


def test_the_defaults_serve(tmp_path: Path) -> None:
    engine = Engine.launched(_store_linker(), monitored=False)
    linker = engine.store_linker
    assert linker.settings.store == "memory" and linker.namespace is not None
    assert linker.namespace.startswith("default-")
    engine.close()
