"""``unicache-fsm docs [--check] [--specs-dir DIR]``: regenerate the specs' docs.

Regenerates ``<machine>.md`` next to every ``<machine>.toml`` of DIR (default: the
bundled specs of a source checkout, which also give the package's enums,
``unicache_fsm/spec_enums.py`` (`fsm.enums`); an installed package's copy is never
rewritten).
Every spec is read and rendered before the first file is written, so one bad spec
leaves every doc as it was. ``--check`` writes nothing and exits 1 (`EXIT_CHECK_FAILED`)
listing the stale files.

Needs no torch: part of the core install.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from unicache_fsm.cli.arguments import CliError, path_arg, reading, spec_input
from unicache_fsm.cli.command import EXIT_CHECK_FAILED, EXIT_OK, PROG, Command
from unicache_fsm.fsm import loader
from unicache_fsm.fsm.diagram import render_markdown_doc
from unicache_fsm.fsm.enums import enum_sources

__all__ = ["COMMAND"]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing the files that differ from what would be written",
    )
    p.add_argument(
        "--specs-dir",
        type=path_arg,
        metavar="DIR",
        help="the folder of *.toml specs to document (default: the bundled specs, and from a "
        "source checkout the package's enums generated from them)",
    )


def _run(args: argparse.Namespace) -> int:
    folder: Path = args.specs_dir if args.specs_dir is not None else loader.specs_dir()
    if args.specs_dir is None and not args.check and not loader.specs_are_source():
        msg = (
            f"the bundled specs in {str(folder)!r} belong to an installed package, not a "
            "source checkout; run `docs` from a checkout or pass --specs-dir DIR"
        )
        raise CliError(msg)
    if not folder.is_dir():
        msg = f"--specs-dir {str(folder)!r} is not a directory"
        raise CliError(msg)
    spec_files = sorted(folder.glob("*.toml"))
    if not spec_files:
        msg = f"no *.toml spec files in {str(folder)!r}"
        raise CliError(msg)
    spec_input("--specs-dir", folder)
    # every spec is read and rendered before the first file is written: one bad spec
    # leaves every doc as it was
    stale: list[tuple[Path, str]] = []
    for spec_file in spec_files:
        target = spec_file.with_suffix(".md")
        if target.exists() and not target.is_file():  # writing a FIFO blocks
            msg = f"--specs-dir: {str(target)!r} exists and is not a regular file"
            raise CliError(msg)
        with reading("--specs-dir", spec_file):
            text = render_markdown_doc(loader.load_spec(spec_file))
        current = target.read_text(encoding="utf-8") if target.is_file() else None
        if current != text:
            stale.append((target, text))
    documents = len(spec_files)
    if args.specs_dir is None and loader.specs_are_source():
        # a checkout's bundled specs also give the package's enums (unicache_fsm.spec_enums)
        for target, text in enum_sources(folder):
            documents += 1
            if target.exists() and not target.is_file():
                msg = f"{str(target)!r} exists and is not a regular file"
                raise CliError(msg)
            if not target.is_file() or target.read_bytes() != text.encode("utf-8"):
                stale.append((target, text))
    if not args.check:
        for target, text in stale:
            target.write_text(text, encoding="utf-8", newline="\n")
    if args.check:
        for target, _ in stale:
            print(f"stale: {target} (run `{PROG} docs` to regenerate it)")
        if stale:
            return EXIT_CHECK_FAILED
        print(f"{documents} docs up to date")
        return EXIT_OK
    for target, _ in stale:
        print(f"wrote {target}")
    print(f"{documents - len(stale)} of {documents} docs were up to date")
    return EXIT_OK


COMMAND = Command("docs", "regenerate specs/<machine>.md and the spec enums", _arguments, _run)
