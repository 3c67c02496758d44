"""The reference scheduler loop, its workloads and its report.

`Simulation(SimConfig(...)).run()` is what ``unicache-fsm simulate`` runs; see
`scheduler.simulation` for the step, `scheduler.workloads` for the request mixes and
`scheduler.report` for what is measured.
"""

from __future__ import annotations

from unicache_fsm.scheduler.report import SimReport
from unicache_fsm.scheduler.simulation import (
    SimConfig,
    SimConfigError,
    Simulation,
    SimulationStalledError,
    warm_up,
)
from unicache_fsm.scheduler.workloads import WORKLOADS, RequestSpec, make_workload

__all__ = [
    "WORKLOADS",
    "RequestSpec",
    "SimConfig",
    "SimConfigError",
    "SimReport",
    "Simulation",
    "SimulationStalledError",
    "make_workload",
    "warm_up",
]
