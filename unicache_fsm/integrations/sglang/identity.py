"""The model identity a store namespace is bound to.

Pages are filed under their page hash, and a page hash depends on the tokens alone: two
models (or one model with two KV layouts) that saw the same prompt compute the same
hashes and different bytes. An operator who gives both the same ``namespace`` string
would have one read the other's KV. So the namespace a `StoreLinker` actually uses is
``NAMESPACE-DIGEST``: the operator's string, then 16 hex digits of SHA-256 over
everything that decides what a page's bytes mean:

- the model: path and revision (SGLang's resolved model config, ``get_model()``, as its
  own linkers read it; the server args where it is not published);
- the page size;
- the dtype (the buffers' and the pool's own: SGLang keeps every fp8 format in uint8
  buffers), and every layer's K and V shape, pool by pool (``KV``; ``SWA`` for the SWA
  half of an `SWAKVPool`);
- the component set (``FULL``, ``SWA``, ...);
- the rank: tensor-parallel rank in the cache's group, pipeline and attention
  context-parallel ranks (each rank holds its own shard of the heads or layers).

`ModelIdentity.of(server_args, params, components, buffers)` reads it; `digest()` and
`namespace(operator)` are pure. The same model and layout on the same rank always gives
the same digest, in any process (a second server finds the first one's pages).

`Placement.of(params)` reads the same rank facts with their widths (tensor-parallel
group, pipeline, attention context-parallel); `per_rank(path)` is the file a rank
writes where every rank of a deployment is given one path (a trace):
``PATH.stem + ".tp{tp}.pp{pp}.cp{cp}" + PATH.suffix`` when the deployment has more than
one rank, `path` itself when it has one.
"""

from __future__ import annotations

import hashlib
import json
import operator
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

__all__ = ["ModelIdentity", "Placement"]

DIGEST_HEX = 16


def _published(section: str, name: str) -> Any:
    """A field of SGLang's published runtime config, or None where it is not published."""
    try:
        from sglang.srt import runtime_context

        bag = getattr(runtime_context, f"get_{section}")()
        return getattr(bag, name)
    except Exception:  # not published (a bare process), or no such field: fall back
        return None


def _int(value: object, default: int) -> int:
    """`value` as an int (any integer type but bool), else `default`."""
    if isinstance(value, bool):
        return default
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return default


def _tp(params: Any) -> tuple[int, int]:
    """(rank, width) in the cache's tensor-parallel group."""
    import torch.distributed as dist

    group = getattr(params, "attn_tp_cache_group", None) or getattr(params, "tp_cache_group", None)
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank(group=group)), int(dist.get_world_size(group=group))
    rank = _int(_published("parallel", "tp_rank"), 0)
    return rank, max(_int(_published("parallel", "tp_size"), 1), rank + 1)


@attrs.frozen
class Placement:
    """This worker's rank and the width of each parallel axis it is one rank of:
    ``tp`` (the cache's tensor-parallel group), ``pp``, ``attn_cp``."""

    ranks: tuple[tuple[str, int], ...]
    sizes: tuple[tuple[str, int], ...]

    @classmethod
    def of(cls, params: Any) -> Placement:
        tp, tp_size = _tp(params)
        pp = _int(getattr(params, "pp_rank", 0), 0)
        cp = _int(getattr(params, "attn_cp_rank", 0), 0)
        return cls(
            ranks=(("tp", tp), ("pp", pp), ("attn_cp", cp)),
            sizes=(
                ("tp", tp_size),
                ("pp", max(_int(getattr(params, "pp_size", 1), 1), pp + 1)),
                ("attn_cp", max(_int(getattr(params, "attn_cp_size", 1), 1), cp + 1)),
            ),
        )

    @property
    def several(self) -> bool:
        """Whether the deployment has more than one rank."""
        return any(size > 1 for _, size in self.sizes)

    def per_rank(self, path: str) -> str:
        """The file this rank writes for `path` (module docstring)."""
        where = Path(path)
        if not self.several or not where.name:
            return path
        ranks = dict(self.ranks)
        tag = f".tp{ranks['tp']}.pp{ranks['pp']}.cp{ranks['attn_cp']}"
        return str(where.with_name(where.stem + tag + where.suffix))


@attrs.frozen
class ModelIdentity:
    """What decides a page's bytes (module docstring); `layers` per pool: one
    ``(K shape, V shape)`` per layer, shapes without the token axis."""

    model_path: str
    revision: str | None
    page_size: int
    dtype: str
    layers: tuple[tuple[str, tuple[tuple[tuple[int, ...], tuple[int, ...]], ...]], ...]
    components: tuple[str, ...]
    ranks: tuple[tuple[str, int], ...]

    @classmethod
    def of(
        cls,
        server_args: Any,
        params: Any,
        components: Iterable[Any],
        buffers: Mapping[Any, Any],
    ) -> ModelIdentity:
        """Read from SGLang's objects: `buffers` maps each pool name to the SGLang pool
        whose ``k_buffer`` / ``v_buffer`` serve it."""
        model = _published("model", "model_path") or getattr(server_args, "model_path", "")
        revision = _published("model", "revision")
        if revision is None:
            revision = getattr(server_args, "revision", None)
        layers = []
        dtypes = set()
        for name, kv in sorted(buffers.items(), key=lambda item: str(item[0])):
            shapes = tuple(
                (tuple(k.shape[1:]), tuple(v.shape[1:]))
                for k, v in zip(kv.k_buffer, kv.v_buffer, strict=True)
            )
            dtypes |= {str(b.dtype) for b in [*kv.k_buffer, *kv.v_buffer]}
            # the pool's own dtype too: SGLang stores every fp8 format as uint8 buffers
            logical = getattr(kv, "dtype", None)
            if logical is not None:
                dtypes.add(str(logical))
            layers.append((str(getattr(name, "value", name)), shapes))
        ranks = Placement.of(params).ranks
        return cls(
            model_path=str(model),
            revision=None if revision is None else str(revision),
            page_size=int(params.page_size),
            dtype=",".join(sorted(dtypes)),
            layers=tuple(layers),
            components=tuple(sorted(str(getattr(c, "name", c)) for c in components)),
            ranks=ranks,
        )

    def digest(self) -> str:
        """16 hex digits of SHA-256 over every field (canonical JSON)."""
        text = json.dumps(attrs.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_HEX]

    def namespace(self, operator: str) -> str:
        """The store namespace: the operator's, then this identity's digest."""
        return f"{operator}-{self.digest()}"
