"""Seedable request workloads for the reference scheduler.

Every workload is a list of `RequestSpec` in arrival order. A request may wait for
another (`after`): the next turn of a conversation only arrives once the previous one
finished. Outputs are fixed in advance (a deterministic "model"), so a later prompt
can contain an earlier output, as chat history does.

- ``multi_turn`` — chats over a few shared system prompts; each turn's prompt is the
  system prompt, the whole history and a new user message.
- ``few_shot`` — a handful of long shared few-shot prefixes, each with a short
  unique question.
- ``agentic`` — tool loops whose context grows by tool results and which sometimes
  go back to an earlier context and branch from it.
- ``random`` — unique random prompts: no reuse at all (external hit rate 0).

`make_workload(name, requests=N, prompt_len=..., output_len=..., seed=S)`; an unknown
name raises `UnknownWorkloadError`.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = ["WORKLOADS", "RequestSpec", "UnknownWorkloadError", "make_workload"]

VOCAB = 32_000


class UnknownWorkloadError(UnicacheFsmError, ValueError):
    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}")


@attrs.frozen
class RequestSpec:
    """One request: its prompt, the output it will produce, and what it waits for."""

    rid: str
    prompt: tuple[int, ...] = attrs.field(repr=lambda p: f"<{len(p)} tokens>")
    output: tuple[int, ...] = attrs.field(repr=lambda p: f"<{len(p)} tokens>")
    namespace: str | None = None
    after: str | None = None

    @property
    def tokens(self) -> tuple[int, ...]:
        return self.prompt + self.output


def _tokens(rng: random.Random, n: int) -> tuple[int, ...]:
    return tuple(rng.randrange(1, VOCAB) for _ in range(n))


def _multi_turn(rng: random.Random, n: int, prompt_len: int, output_len: int) -> list[RequestSpec]:
    systems = [_tokens(rng, prompt_len) for _ in range(max(2, n // 60))]
    convs: list[list[RequestSpec]] = []
    made = 0
    while made < n:
        c = len(convs)
        history = rng.choice(systems)
        turns: list[RequestSpec] = []
        for t in range(rng.randint(2, 6)):
            if made >= n:
                break
            prompt = history + _tokens(rng, rng.randint(16, 48))
            output = _tokens(rng, output_len)
            rid = f"chat{c}-t{t}"
            turns.append(RequestSpec(rid, prompt, output, after=turns[-1].rid if turns else None))
            history = prompt + output
            made += 1
        convs.append(turns)
    # interleave conversations so that many chats are live at once
    out: list[RequestSpec] = []
    depth = max(len(c) for c in convs)
    for t in range(depth):
        out.extend(c[t] for c in convs if t < len(c))
    return out


def _few_shot(rng: random.Random, n: int, prompt_len: int, output_len: int) -> list[RequestSpec]:
    shots = [_tokens(rng, 2 * prompt_len) for _ in range(4)]
    return [
        RequestSpec(
            f"shot{i}",
            rng.choice(shots) + _tokens(rng, rng.randint(8, 32)),
            _tokens(rng, output_len),
        )
        for i in range(n)
    ]


def _agentic(rng: random.Random, n: int, prompt_len: int, output_len: int) -> list[RequestSpec]:
    out: list[RequestSpec] = []
    session = 0
    while len(out) < n:
        contexts = [_tokens(rng, prompt_len)]
        prev: str | None = None
        for step in range(rng.randint(3, 8)):
            if len(out) >= n:
                break
            # mostly continue the latest context, sometimes revisit an earlier one
            base = contexts[-1] if rng.random() < 0.7 else rng.choice(contexts)
            prompt = base + _tokens(rng, rng.randint(16, 64))  # a tool result
            output = _tokens(rng, output_len)
            rid = f"agent{session}-s{step}"
            out.append(RequestSpec(rid, prompt, output, after=prev))
            contexts.append(prompt + output)
            prev = rid
        session += 1
    return out


def _random(rng: random.Random, n: int, prompt_len: int, output_len: int) -> list[RequestSpec]:
    return [
        RequestSpec(f"rand{i}", _tokens(rng, prompt_len), _tokens(rng, output_len))
        for i in range(n)
    ]


WORKLOADS: dict[str, Callable[[random.Random, int, int, int], list[RequestSpec]]] = {
    "multi_turn": _multi_turn,
    "few_shot": _few_shot,
    "agentic": _agentic,
    "random": _random,
}


def make_workload(
    name: str,
    *,
    requests: int,
    prompt_len: int = 256,
    output_len: int = 32,
    seed: int = 0,
) -> list[RequestSpec]:
    """`requests` requests of workload `name`, the same for the same seed."""
    make = WORKLOADS.get(name)
    if make is None:
        raise UnknownWorkloadError(name)
    return make(random.Random(seed), requests, prompt_len, output_len)
