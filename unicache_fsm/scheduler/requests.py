"""Per-request accounting of a simulation, and the modelled time to first token.

The scheduler loop tells a `RequestLog`, in this order, for each request:

- `admitted(rid, prompt, device=, host=)` — at admission: its prompt length, the
  tokens its device prefix match served, and those loaded back from the host tier;
- `loaded(rid, tokens)` — a committed load from the external store added `tokens`;
- `computed(rid, tokens)` — a prefill chunk recomputed `tokens` prompt tokens;
- `finished(rid)` — it is done.

`step` is the scheduler step the loop is in (the loop sets it); admission and finish
record it. `RequestRecord` holds one request's numbers; `saved` is the prompt tokens
it did not recompute.

`TtftModel` turns a record into a modelled time to first token, a model and not a
measurement (the simulation moves kilobytes on a CPU): prefill costs
`prefill_seconds_per_token` per recomputed token; a token loaded back costs
`kv_bytes_per_token` bytes at `host_bytes_per_second` (host tier) or
`store_bytes_per_second` (external store); a device hit costs nothing; queueing is
left out. The defaults describe an 8-B-class model on one GPU (32 layers, 8 KV heads
of 128 lanes in float16: 128 KiB of KV per token; 10,000 prefill tokens/s; 25 GB/s
from host memory, 5 GB/s from the store); `describe()` says so in words, and the run
report prints it beside the numbers.
"""

from __future__ import annotations

from collections.abc import Iterator

import attrs

__all__ = ["RequestLog", "RequestRecord", "TtftModel"]


@attrs.define(slots=True)
class RequestRecord:
    """One request: where its prompt tokens came from, and when (scheduler steps)."""

    rid: str
    admitted_step: int
    prompt_tokens: int
    device: int
    host: int
    external: int = 0
    computed: int = 0
    finished_step: int | None = None

    @property
    def hit(self) -> int:
        """The prefix hit: prompt tokens served without recompute."""
        return self.device + self.host + self.external

    @property
    def saved(self) -> int:
        """Prompt tokens not recomputed (the hit, as counted by what was computed)."""
        return self.prompt_tokens - self.computed


@attrs.frozen
class TtftModel:
    """A modelled time to first token (see the module docstring)."""

    prefill_seconds_per_token: float = 1e-4
    kv_bytes_per_token: int = 2 * 32 * 8 * 128 * 2
    host_bytes_per_second: float = 25e9
    store_bytes_per_second: float = 5e9

    def seconds(self, r: RequestRecord) -> float:
        """The modelled prefill time of `r`."""
        b = self.kv_bytes_per_token
        return (
            r.computed * self.prefill_seconds_per_token
            + r.host * b / self.host_bytes_per_second
            + r.external * b / self.store_bytes_per_second
        )

    def cold_seconds(self, r: RequestRecord) -> float:
        """The modelled prefill time had `r` recomputed its whole prompt."""
        return r.prompt_tokens * self.prefill_seconds_per_token

    def describe(self) -> str:
        return (
            f"modelled time to first token = recomputed tokens x "
            f"{self.prefill_seconds_per_token * 1e3:g} ms + tokens from the host tier x "
            f"{self.kv_bytes_per_token // 1024} KiB / {self.host_bytes_per_second / 1e9:g} GB/s "
            f"+ tokens from the external store x {self.kv_bytes_per_token // 1024} KiB / "
            f"{self.store_bytes_per_second / 1e9:g} GB/s; a device hit costs nothing and "
            "queueing is left out (an 8-B-class model: 32 layers, 8 KV heads of 128 lanes, "
            "float16)"
        )


@attrs.define
class RequestLog:
    """The loop's per-request notes (see the module docstring)."""

    step: int = 0
    records: dict[str, RequestRecord] = attrs.field(factory=dict)

    def admitted(self, rid: str, prompt: int, *, device: int, host: int) -> None:
        self.records[rid] = RequestRecord(rid, self.step, prompt, device, host)

    def loaded(self, rid: str, tokens: int) -> None:
        self.records[rid].external += tokens

    def computed(self, rid: str, tokens: int) -> None:
        self.records[rid].computed += tokens

    def finished(self, rid: str) -> None:
        self.records[rid].finished_step = self.step

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.records.values())

    def __len__(self) -> int:
        return len(self.records)
