"""The parts of the SGLang linker kit that run without SGLang: ``check-linker``'s refusal
where SGLang 0.5.23 is missing, the KV model, the obligations table, and the ready
`DirectoryFaults` on a real directory. (The kit inside SGLang: tests/sglang_linker.)
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import redis

from redis_helpers import REDIS_SKIP
from unicache_fsm.cli import main
from unicache_fsm.integrations.linker_kit.faults import BackendFaults, DirectoryFaults, RedisFaults
from unicache_fsm.integrations.linker_kit.kvmodel import KvModel
from unicache_fsm.integrations.linker_kit.obligations import (
    LinkerViolation,
    Obligation,
    Outcome,
    Verdicts,
)
from unicache_fsm.testing.redis_server import RedisServer

NO_SGLANG = importlib.util.find_spec("sglang") is None


@pytest.mark.skipif(not NO_SGLANG, reason="SGLang is importable here")
def test_check_linker_without_sglang_refuses_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = json.dumps({"linker": "L", "linker_module_path": "m"})
    assert main(["check-linker", config, "--report", str(tmp_path / "r")]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "needs SGLang 0.5.23" in lines[0], captured.err
    assert captured.out == "" and not (tmp_path / "r").exists()


def test_check_linker_refuses_an_unknown_fault_kind(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check-linker", "{}", "--faults", "lose,melt"]) == 2
    assert "unknown fault kind 'melt'" in capsys.readouterr().err


def test_the_kv_model_gives_each_prefix_one_answer() -> None:
    a, b = KvModel("dummy"), KvModel("none")
    h = a.prefix_hashes([1, 2, 3])
    assert h.tolist() == a.prefix_hashes([1, 2, 3]).tolist()
    assert h[:2].tolist() == a.prefix_hashes([1, 2]).tolist()  # a prefix's own hashes
    assert h[2] != a.prefix_hashes([9, 2, 3])[2]  # the same token after another prefix
    assert b.prefix_hashes([1, 2, 3]).tolist() != h.tolist()  # another model
    rows = a.values(h, "kv", 0, "k", 8)
    assert rows.shape == (3, 8) and rows.abs().max() <= 120
    assert not rows.equal(a.values(h, "kv", 1, "k", 8))  # another layer
    assert not rows.equal(a.values(h, "kv", 0, "v", 8))  # V is not K
    assert rows.to(__import__("torch").bfloat16).float().equal(rows)  # exact in bf16


def test_verdicts_report_fail_pass_and_why_not_applicable() -> None:
    v = Verdicts()
    v.checked(Obligation.ANSWERS, 3)
    v.skip(Obligation.SHARING, "no sharing")
    v.fail(LinkerViolation(Obligation.NO_ESCAPE, "lookup raised"))
    assert v.outcome(Obligation.ANSWERS) == (Outcome.PASS, "checked 3 times")
    assert v.outcome(Obligation.SHARING) == (Outcome.NOT_APPLICABLE, "no sharing")
    assert v.outcome(Obligation.NO_ESCAPE) == (Outcome.FAIL, "lookup raised")
    assert not v.ok
    assert str(LinkerViolation(Obligation.ANSWERS, "x")) == "answers: x"


def test_directory_faults_damage_real_files_and_take_the_directory_away(tmp_path: Path) -> None:
    root = tmp_path / "pages"
    (root / "kv").mkdir(parents=True)
    page = root / "kv" / "abc123.kv"
    page.write_bytes(bytes(range(64)))
    faults = DirectoryFaults(root)
    assert isinstance(faults, BackendFaults)
    assert faults.corrupt("abc123") and page.read_bytes() != bytes(range(64))
    assert len(page.read_bytes()) == 64
    assert faults.truncate("abc123") and len(page.read_bytes()) == 32
    assert not faults.lose("zzz") and faults.lose("abc123") and not page.exists()
    faults.set_reachable(False)
    assert not root.exists()
    faults.set_reachable(True)
    assert (root / "kv").is_dir()
    faults.fail_next_write()
    with pytest.raises(OSError, match="injected write failure"):
        faults.guard_write()
    faults.guard_write()  # once only


@REDIS_SKIP
def test_redis_faults_damage_real_values_and_cut_the_server_off() -> None:
    with RedisServer() as server:  # its own server: the outage drops every other client
        _damage_and_cut_off(server)


def _damage_and_cut_off(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url)
    name = "ns:page:abc123"
    client.set(name, bytes(range(64)))
    faults = RedisFaults(client)
    assert isinstance(faults, BackendFaults)
    assert faults.corrupt("abc123") and client.get(name) != bytes(range(64))
    assert faults.truncate("abc123") and len(client.get(name) or b"") == 32
    assert not faults.lose("zzz-no-such") and faults.lose("abc123") and client.get(name) is None
    other = redis.Redis.from_url(server.url)
    faults.set_reachable(False)
    try:
        with pytest.raises(redis.exceptions.RedisError):
            other.ping()
    finally:
        faults.set_reachable(True)
    assert redis.Redis.from_url(server.url).ping()
