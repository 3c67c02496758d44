"""SWA checkpoints (issue 37): the reuse they buy back, and what it costs.

With a sliding-window model SGLang 0.5.23 keeps a request's SWA KV for its last window
only, so a later prompt that shares only a prefix of it finds no live window at the
prefix's end (on the device or in the store) and recomputes. `simulate --swa-checkpoint
K` also keeps the window ending at every K-page checkpoint. Per workload this runs
`simulate` at its defaults (400 requests, P = 16, a FULL pool of 4,096 tokens and an SWA
pool of the same size, as `simulate` builds it) with W = 256 tokens and prints:

- hit rates (device, external = loaded from the store, their sum) without SWA, with SWA
  at the default (0.5.23's rule) and with each K tried, the sum also as a share of the
  no-SWA rate; the best K (highest hit rate; the cheaper one on a tie) is marked;
- what each costs against the default: the bytes the store holds at the end (KV + SWA
  pages), and the SWA pool's occupancy (tokens in use, mean and peak over the steps);
- loads committed and KV-verified (every checkpoint load is checked byte for byte).

Run: ``python benchmarks/bench_swa.py [--quick]`` (or ``benchmarks/run.py swa``).
``--quick``: 40 requests, two workloads, two K.
"""

from __future__ import annotations

import argparse

import attrs

from unicache_fsm.console import print_table
from unicache_fsm.pools.transfer import PoolName
from unicache_fsm.scheduler import SimConfig, Simulation

WINDOW = 256
WORKLOADS = ("few_shot", "agentic", "multi_turn")
CHECKPOINTS = (8, 16, 32, 64)


@attrs.frozen
class Outcome:
    """One run's figures."""

    label: str
    device: float  # share of prompt tokens
    external: float
    store_bytes: int
    swa_mean: float  # SWA pool tokens in use, mean over steps (0 without SWA)
    swa_peak: int
    loads: int
    verified: int

    @property
    def hit(self) -> float:
        return self.device + self.external


def run(config: SimConfig, label: str) -> Outcome:
    sim = Simulation(config, timeline=True)
    report = sim.run()
    prompt = max(1, report.prompt_tokens)
    page_bytes = {PoolName.KV: sim.kv.page_nbytes}
    if sim.swa_kv is not None:
        page_bytes[PoolName.SWA] = sim.swa_kv.page_nbytes
    stored = sum(n * page_bytes.get(pool, 0) for pool, n in sim.stored_pages.items())
    assert sim.timeline is not None
    used = [o.capacity - o.free for o in sim.timeline.occupancy.get("SWA", [])]
    return Outcome(
        label=label,
        device=report.device_hit_tokens / prompt,
        external=report.loaded_tokens / prompt,
        store_bytes=stored,
        swa_mean=sum(used) / len(used) if used else 0.0,
        swa_peak=max(used, default=0),
        loads=report.loads_committed,
        verified=report.loads_verified,
    )


def best(outcomes: list[Outcome]) -> Outcome:
    """The highest hit rate; on a tie, the fewer store bytes, then the lower SWA mean,
    then the later one (the sparser checkpoints, tried last)."""
    return max(reversed(outcomes), key=lambda o: (round(o.hit, 4), -o.store_bytes, -o.swa_mean))


def compare(workload: str, requests: int, checkpoints: tuple[int, ...]) -> list[Outcome]:
    base = SimConfig(workload=workload, requests=requests)
    plain = run(base, "no SWA")
    swa = attrs.evolve(base, swa_window=WINDOW)
    default = run(swa, f"SWA W={WINDOW}, default (0.5.23)")
    tried = [
        run(attrs.evolve(swa, swa_checkpoint=k), f"SWA W={WINDOW}, K={k}") for k in checkpoints
    ]
    top = best(tried)
    rows = [plain, default, *tried]
    table = []
    for o in rows:
        mark = " (best K)" if o is top else ""
        table.append(
            [
                o.label + mark,
                f"{o.device:.1%}",
                f"{o.external:.1%}",
                f"{o.hit:.1%}",
                f"{o.hit / plain.hit:.0%}" if plain.hit else "-",
                f"{o.store_bytes / 2**20:.1f}",
                f"{o.store_bytes / default.store_bytes:.2f}x" if default.store_bytes else "-",
                f"{o.swa_mean:.0f} / {o.swa_peak}" if o is not plain else "-",
                f"{o.swa_mean / default.swa_mean:.2f}x"
                if default.swa_mean and o is not plain
                else "-",
                f"{o.loads} / {o.verified}",
            ]
        )
    print_table(
        f"{workload} ({requests} requests)",
        [
            "configuration",
            "device",
            "external",
            "hit",
            "vs no SWA",
            "store MiB",
            "vs default",
            "SWA pool mean / peak",
            "vs default",
            "loads / KV-verified",
        ],
        table,
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 requests, 2 workloads, 2 K")
    args = parser.parse_args(argv)
    requests = 40 if args.quick else SimConfig().requests
    workloads = WORKLOADS[:2] if args.quick else WORKLOADS
    checkpoints = (16, 32) if args.quick else CHECKPOINTS
    c = SimConfig()
    print(
        f"simulate defaults: P={c.page_size}, FULL pool {c.pool_tokens} tokens, SWA pool "
        f"{c.pool_tokens} tokens (the same size: `simulate` builds it so), W={WINDOW} tokens; "
        "K in pages; SWA pool in tokens in use (of its capacity)"
    )
    for workload in workloads:
        compare(workload, requests, checkpoints)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
