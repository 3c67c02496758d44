"""Seedable request workloads for the reference scheduler.

Every workload is a list of `RequestSpec` in arrival order. A request may wait for
another (`after`): the next turn of a conversation only arrives once the previous one
finished. Outputs are fixed in advance (a deterministic "model"), so a later prompt
can contain an earlier output, as chat history does.

Each models one way a serving engine sees prefixes come back, and at default
settings (``simulate``'s 4,096-token pool) each holds more shared context than the
device pool, so part of the reuse has to come back from the external store:

- ``multi_turn`` — chat: conversations over a few shared system prompts; each turn's
  prompt is the system prompt, the whole history and a new user message. Turns of
  many conversations interleave, so a conversation's history is often evicted from
  the device before its next turn arrives.
- ``few_shot`` — templated tasks: many long few-shot prefixes (one per 25 requests,
  at least 4), each request one of them plus a short unique question, the prefixes
  picked at random so that each comes back after the others pushed it out.
- ``agentic`` — agents in tool loops: every agent starts from one of two shared tool
  descriptions plus its task; each step's context is an earlier context
  (usually the latest, sometimes an older one to branch from) plus a tool result.
  Agents proceed in rounds, so an agent's context waits while every other agent takes
  its step (a slow tool call) and comes back after the device evicted it.
- ``random`` — unrelated random prompts, the no-structure baseline; its only reuse is
  one request in ten that retries an earlier prompt (a client resending after a
  timeout), usually long after the device dropped it.

`make_workload(name, requests=N, prompt_len=..., output_len=..., seed=S,
progress=None)`; `progress(done, total)` is called as requests are generated. An
unknown name raises `UnknownWorkloadError`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

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


def _multi_turn(rng: random.Random, n: int, prompt_len: int, output_len: int) -> Workload:
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
            yield None
        convs.append(turns)
    yield _rounds(convs)


def _rounds(groups: list[list[RequestSpec]]) -> list[RequestSpec]:
    """Interleave request chains round by round: step t of every chain, then t+1."""
    out: list[RequestSpec] = []
    depth = max(len(g) for g in groups)
    for t in range(depth):
        out.extend(g[t] for g in groups if t < len(g))
    return out


def _few_shot(rng: random.Random, n: int, prompt_len: int, output_len: int) -> Workload:
    shots = [_tokens(rng, 2 * prompt_len) for _ in range(max(4, n // 25))]
    out: list[RequestSpec] = []
    for i in range(n):
        question = _tokens(rng, rng.randint(8, 32))
        out.append(RequestSpec(f"shot{i}", rng.choice(shots) + question, _tokens(rng, output_len)))
        yield None
    yield out


def _agentic(rng: random.Random, n: int, prompt_len: int, output_len: int) -> Workload:
    tools = [_tokens(rng, prompt_len) for _ in range(2)]  # shared tool descriptions
    agents: list[list[RequestSpec]] = []
    made = 0
    while made < n:
        contexts = [rng.choice(tools) + _tokens(rng, 64)]  # the tools and a task
        steps: list[RequestSpec] = []
        for step in range(rng.randint(3, 8)):
            if made >= n:
                break
            # mostly continue the latest context, sometimes revisit an earlier one
            base = contexts[-1] if rng.random() < 0.7 else rng.choice(contexts)
            prompt = base + _tokens(rng, rng.randint(16, 64))  # a tool result
            output = _tokens(rng, output_len)
            rid = f"agent{len(agents)}-s{step}"
            steps.append(RequestSpec(rid, prompt, output, after=steps[-1].rid if steps else None))
            contexts.append(prompt + output)
            made += 1
            yield None
        agents.append(steps)
    yield _rounds(agents)


def _random(rng: random.Random, n: int, prompt_len: int, output_len: int) -> Workload:
    out: list[RequestSpec] = []
    for i in range(n):
        retry = out and rng.random() < 0.1  # a retry: an earlier prompt, sent again
        prompt = rng.choice(out).prompt if retry else _tokens(rng, prompt_len)
        out.append(RequestSpec(f"rand{i}", prompt, _tokens(rng, output_len)))
        yield None
    yield out


#: A generator yields None per request made, then the whole list once.
Workload = Iterator[list[RequestSpec] | None]

WORKLOADS: dict[str, Callable[[random.Random, int, int, int], Workload]] = {
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
    progress: Callable[[int, int], None] | None = None,
) -> list[RequestSpec]:
    """`requests` requests of workload `name`, the same for the same seed."""
    make = WORKLOADS.get(name)
    if make is None:
        raise UnknownWorkloadError(name)
    for made, item in enumerate(make(random.Random(seed), requests, prompt_len, output_len), 1):
        if item is not None:
            return item
        if progress is not None:
            progress(made, requests)
    msg = f"workload {name!r} ended without its request list"
    raise AssertionError(msg)
