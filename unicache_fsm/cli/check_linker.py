"""``unicache-fsm check-linker CONFIG_JSON_OR_@FILE [--minutes M] [--seed S] [--faults K]
[--report DIR]``: check any SGLang 0.5.23 linker inside SGLang's real cache.

This module holds the command line's side: the arguments, their ranges, and the checks
made before anything runs (an ``@FILE`` config must be a regular file, ``--report`` a
folder that can be made and written). The check itself, its printing and its exit
codes are `unicache_fsm.integrations.linker_kit.cli`'s; importing this module imports
neither SGLang nor torch.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from unicache_fsm.cli.arguments import (
    MAX_MINUTES,
    MAX_SEED,
    input_file,
    int_in,
    machine_minutes,
    output_folder,
    path_arg,
)
from unicache_fsm.cli.command import Command
from unicache_fsm.integrations.linker_kit import cli as check_linker_cli

__all__ = ["COMMAND"]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "config",
        metavar="CONFIG_JSON_OR_@FILE",
        help="the linker launch JSON (--unified-cache-external-linker-config), or @FILE",
    )
    p.add_argument(
        "--minutes",
        type=machine_minutes,
        default=1.0,
        help=f"machine budget, 0 (scenarios only) to {MAX_MINUTES:.0f} (default: 1)",
    )
    p.add_argument(
        "--seed",
        type=int_in(0, MAX_SEED),
        default=0,
        help="seed of the machine, 0 to 2**64-1 (default: 0)",
    )
    kinds = ",".join(check_linker_cli.FAULT_KINDS)
    p.add_argument(
        "--faults",
        type=check_linker_cli.fault_kinds,
        default=frozenset(check_linker_cli.FAULT_KINDS),
        help=f"backend faults to inject: a comma list of {kinds}, all or none (default: all)",
    )
    p.add_argument(
        "--report",
        type=path_arg,
        default=Path("check-linker-report"),
        help="report directory, created if missing (default: check-linker-report)",
    )


def _run(args: argparse.Namespace) -> int:
    config = str(args.config)
    if config.startswith("@"):
        input_file("CONFIG", Path(config[1:]))
    output_folder("--report", args.report)
    return check_linker_cli.run(args)


COMMAND = Command("check-linker", check_linker_cli.HELP, _arguments, _run)
