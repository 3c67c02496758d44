"""Deployed by configuration: `StoreLinker`, wrapped in a `ContractMonitor` (raise mode:
every call is also shown legal), built from the launch JSON by SGLang 0.5.23's own
`UnifiedCacheLinkerConfig.from_dict` and `create_unified_cache_linker`, serving SGLang's
real `UnifiedRadixCache` on CPU straight from its own K/V buffers.

- Full and Full + SWA, pages of 1 and 16, memory, file and Redis stores: after every
  load, each layer the forward reads right after its `wait_until` holds the bytes that
  were offloaded (Full layers: every loaded slot; SWA layers: the trailing window).
- A second process (a real subprocess) on the same file directory or Redis server, same
  model, gets hits and reads the same bytes.
- Two models under one namespace string never share a page; nor do two layouts. (On CPU
  SGLang resolves `ServerArgs` only for the placeholder model paths ``dummy`` and
  ``none``: they are the two models.)
- The linker owns no KV-sized tensor: every tensor reachable from it but SGLang's own
  buffers and the store is a view of SGLang's memory or smaller than one pool.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch

from sglang_linker.engine import Engine, Kv, Loaded
from unicache_fsm.integrations.sglang import ModelIdentity, StoreLinker
from unicache_fsm.integrations.sglang.footprint import owned_bytes, owned_tensors
from unicache_fsm.store.protocol import ExternalStore

HERE = Path(__file__).resolve().parent

#: (components, page size, SWA window): every store runs the first two, memory all four
LAYOUTS = {"full-p16": (None, 16), "swa-p1": (8, 1), "full-p1": (None, 1), "swa-p16": (16, 16)}
CASES = [
    pytest.param(store, layout, id=f"{store}-{layout}")
    for store in ("memory", "file", "redis")
    for layout in LAYOUTS
    if store == "memory" or layout in ("full-p16", "swa-p1")
]


def store_spec(kind: str, tmp_path: Path) -> dict[str, Any]:
    """``store`` and ``namespace`` of a launch config for a fresh store of `kind`."""
    if kind == "memory":
        return {"store": "memory"}
    if kind == "file":
        return {"store": f"file:{tmp_path / 'kv'}", "namespace": "team-a"}
    from redis_helpers import fresh_namespace, shared_server

    return {"store": shared_server().url, "namespace": fresh_namespace()}


def launch_json(extra: dict[str, Any], *, monitored: bool = True) -> dict[str, Any]:
    """The operator's ``--unified-cache-external-linker-config``."""
    linker = {
        "linker": "StoreLinker",
        "linker_module_path": "unicache_fsm.integrations.sglang",
        "linker_extra_config": extra,
    }
    if not monitored:
        return linker
    return {
        "linker": "ContractMonitor",
        "linker_module_path": "unicache_fsm.integrations.sglang",
        "linker_extra_config": {"wrap": linker, "mode": "raise"},
    }


def tokens_for(page: int) -> list[int]:
    return list(range(1, 4 * max(page, 4) + 1))  # 4 pages at P = 16, 16 tokens at P = 1


def assert_forward_read(engine: Engine, loaded: Loaded, full: Kv, swa: Kv | None) -> None:
    """Each layer the forward read right after its wait holds the offloaded bytes."""
    mapping = getattr(engine.kvcache, "layers_mapping", None)
    window = engine.window if engine.swa else 0
    assert set(loaded.layers_read) == set(range(engine.kvcache.layer_num))
    for layer, (k, v) in loaded.layers_read.items():
        local, is_swa = mapping[layer] if mapping is not None else (layer, False)
        if is_swa:
            assert swa is not None
            want_k, want_v = swa.k[local][-window:], swa.v[local][-window:]
            k, v = k[-window:], v[-window:]
        else:
            want_k, want_v = full.k[local], full.v[local]
        assert torch.equal(k, want_k) and torch.equal(v, want_v), f"layer {layer}"


@pytest.mark.parametrize(("store", "layout"), CASES)
def test_the_bytes_sglang_reads_after_every_load_are_the_bytes_offloaded(
    store: str, layout: str, tmp_path: Path
) -> None:
    if store == "redis":
        from unicache_fsm.testing.redis_server import available

        if not available() and not os.environ.get("CI"):
            pytest.skip("redis-server is not installed (apt-get install -y redis-server)")
    window, page = LAYOUTS[layout]
    engine = Engine.launched(
        launch_json(store_spec(store, tmp_path)), page=page, swa_window=window, tokens=512
    )
    assert isinstance(engine.store_linker, StoreLinker)
    tokens = tokens_for(page)
    full, swa = engine.compute(tokens)
    engine.settle_offloads()
    for round_ in range(2):  # load, insert (offloaded again), evict, load again
        engine.evict_all()
        loaded = engine.load([*tokens, 7], f"r{round_}")
        assert (loaded.loaded, loaded.failed) == (len(tokens), ())
        assert loaded.slots is not None and engine.read(loaded.slots).same(full)
        assert_forward_read(engine, loaded, full, swa)
        engine.insert_loaded(loaded)
        engine.settle_offloads()
    linker = engine.store_linker
    assert linker.in_flight() == {"loads": 0, "batches": 0, "verdicts": 0}
    assert linker.open_pages() == {"read": 0, "write": 0}  # nothing left open to the store
    engine.close()


SECOND = """
import json, sys, torch
sys.path.insert(0, {tests!r})
from sglang_linker.engine import Engine
from sglang_linker.test_deploy import launch_json
found = []
for n, config in enumerate(json.loads({configs!r})):
    for model in ("dummy", "none"):
        engine = Engine.launched(launch_json(config), page=16, tokens=512, model=model)
        loaded = engine.load({tokens!r} + [7], "second")
        assert loaded.failed == (), loaded.failed
        if loaded.loaded:
            torch.save(engine.read(loaded.slots).k, {out!r} + f".{{n}}.{{model}}")
        engine.close()
        found.append([model, loaded.host_hit, loaded.loaded])
print(json.dumps(found))
"""


def run_second(configs: list[dict[str, Any]], tokens: list[int], out: Path) -> list[Any]:
    """A second server process on the same stores: for each config, what a worker of
    the same model (``dummy``) and of another model (``none``) found; in ``out.N.dummy``
    the K the first one read."""
    script = SECOND.format(
        tests=str(HERE.parent), configs=json.dumps(configs), tokens=tokens, out=str(out)
    )
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found: list[Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_second_process_gets_hits_and_another_model_none(tmp_path: Path) -> None:
    """One subprocess (SGLang's import dominates its cost) serves the file and the Redis
    store: the same model finds what this process offloaded, byte for byte; another
    model under the same namespace string finds nothing."""
    from unicache_fsm.testing.redis_server import available

    kinds = ["file"] + (["redis"] if available() or os.environ.get("CI") else [])
    configs = [store_spec(kind, tmp_path) for kind in kinds]
    tokens = tokens_for(16)
    firsts, wrote = [], []
    for config in configs:
        first = Engine.launched(launch_json(config), page=16, tokens=512, model="dummy")
        full, _ = first.compute(tokens)
        first.settle_offloads()
        firsts.append(first)
        wrote.append(full)
    out = tmp_path / "second_k"
    found = run_second(configs, tokens, out)
    expected = [[m, h, h] for _ in configs for m, h in (("dummy", len(tokens)), ("none", 0))]
    assert found == expected
    for n, full in enumerate(wrote):
        assert torch.equal(torch.load(f"{out}.{n}.dummy"), full.k)
    for first in firsts:
        first.close()


def test_two_layouts_of_one_model_under_one_namespace_string_never_share_a_page(
    tmp_path: Path,
) -> None:
    config = store_spec("file", tmp_path)
    tokens = tokens_for(16)
    first = Engine.launched(launch_json(config), page=16, tokens=512, model="dummy")
    first.compute(tokens)
    first.settle_offloads()
    # the same model with another layout (an SWA component), same namespace string and
    # directory: no hit
    other = Engine.launched(launch_json(config), page=16, tokens=512, model="dummy", swa_window=16)
    assert other.load([*tokens, 7], "layout").host_hit == 0
    names = {first.store_linker.namespace, other.store_linker.namespace}
    assert len(names) == 2 and all(n.startswith("team-a-") for n in names)
    assert {p.name for p in (tmp_path / "kv").iterdir() if p.is_dir()} == names
    other.close()
    first.close()


def test_the_identity_covers_model_revision_layout_components_and_rank() -> None:
    engine = Engine.launched(launch_json({}, monitored=False), page=16, tokens=512)
    identity = engine.store_linker.identity
    assert isinstance(identity, ModelIdentity)
    assert identity.page_size == 16 and identity.components == ("FULL",)
    assert identity.dtype == "torch.bfloat16" and dict(identity.ranks)["tp"] == 0
    digests = {identity.digest()}
    for change in (
        {"model_path": "other"},
        {"revision": "v2"},
        {"page_size": 1},
        {"dtype": "torch.float16"},
        {"components": ("FULL", "SWA")},
        {"ranks": (("tp", 1), ("pp", 0), ("attn_cp", 0))},
        {"layers": ((identity.layers[0][0], identity.layers[0][1][:1]),)},  # a layer less
    ):
        digests.add(ModelIdentity(**{**_fields(identity), **change}).digest())
    assert len(digests) == 8
    engine.close()


def _fields(identity: ModelIdentity) -> dict[str, Any]:
    import attrs

    return {f.name: getattr(identity, f.name) for f in attrs.fields(ModelIdentity)}


def test_the_linker_owns_no_kv_sized_tensor(tmp_path: Path) -> None:
    """Every tensor the linker keeps is a view of SGLang's buffers or far smaller than
    one pool (main's `StoreLinker` kept a mirror as large as each pool)."""
    engine = Engine.launched(
        launch_json({"store": "memory"}, monitored=False), page=16, swa_window=16, tokens=512
    )
    tokens = tokens_for(16)
    engine.compute(tokens)
    engine.settle_offloads()
    engine.evict_all()
    loaded = engine.load([*tokens, 7], "r1")
    assert loaded.loaded == len(tokens)
    buffers = [t for pool in (engine.full_kv, engine.swa_kv) for t in pool.k_buffer + pool.v_buffer]
    smallest_pool = min(
        sum(t.nbytes for t in [*pool.k_buffer, *pool.v_buffer])
        for pool in (engine.full_kv, engine.swa_kv)
    )
    own = owned_tensors(engine.store_linker, beside=buffers, skip=(ExternalStore,))
    assert owned_bytes(own) < smallest_pool // 8, [tuple(t.shape) for t in own]
    engine.close()


def test_a_fresh_namespace_each_run_is_not_needed(tmp_path: Path) -> None:
    """The namespace is a function of the identity: two builds agree (a restarted server
    finds its pages)."""
    config = {"store": f"file:{tmp_path / 'kv'}", "namespace": f"n{uuid.uuid4().hex[:6]}"}
    one = Engine.launched(launch_json(config, monitored=False), page=16, tokens=512)
    two = Engine.launched(launch_json(config, monitored=False), page=16, tokens=512)
    assert one.store_linker.namespace == two.store_linker.namespace
    one.close()
    two.close()
