"""``unicache-fsm diagram [MACHINE] --format mermaid|dot|svg|png [--highlight STATE]
[--coverage F] [-o PATH]``: draw machines.

Draws one machine (a bundled name or a ``.toml`` spec file) or, without MACHINE, every
bundled machine. Text formats go to stdout (several machines one after the other, each
preceded by a comment naming it) or to ``-o FILE``. Images need Graphviz; with one
machine ``-o`` is the file (default ``<machine>.<fmt>``), with several it is a directory
(default `DEFAULT_DIAGRAM_FOLDER`, created if missing; a missing path with a suffix such
as ``all.png`` is refused as a file name) receiving one file per machine; the paths
written are printed. ``--highlight`` fills one state (it needs MACHINE); ``--coverage``
labels and colours each arrow by a run's counts, and refuses a file that names a
transition the machine lacks. Every image is rendered before the first file is written.

Needs no torch: part of the core install.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from unicache_fsm.cli.arguments import CliError, input_file, output_file, path_arg, reading
from unicache_fsm.cli.command import EXIT_OK, Command
from unicache_fsm.fsm import loader
from unicache_fsm.fsm.coverage import Coverage
from unicache_fsm.fsm.diagram import DiagramFormat, render_dot, render_image, render_mermaid
from unicache_fsm.fsm.spec import MachineSpec

__all__ = ["COMMAND", "DEFAULT_DIAGRAM_FOLDER"]

#: where ``diagram --format svg|png`` writes every machine when no ``-o`` is given
DEFAULT_DIAGRAM_FOLDER = "unicache-fsm-diagrams"


# -- machine selection -----------------------------------------------------------------


def _is_spec_path(arg: str) -> bool:
    """A MACHINE argument names a file when it looks like one, else a bundled machine."""
    return arg.endswith(".toml") or "/" in arg or "\\" in arg


def _load_machine(arg: str) -> MachineSpec:
    """A bundled machine by name, or the spec file at a path."""
    if _is_spec_path(arg):
        path = Path(arg)
        if not path.is_file():
            msg = f"no spec file {arg!r}" + ("" if not path.exists() else " (not a regular file)")
            raise CliError(msg)
        with reading("MACHINE", path):
            return loader.load_spec(path)
    known = loader.bundled_machines()
    if arg not in known:
        msg = (
            f"unknown machine {arg!r}; bundled machines: {', '.join(known)} "
            "(or give the path of a .toml spec file)"
        )
        raise CliError(msg)
    return loader.bundled_spec(arg)


def _machines(arg: str | None) -> list[MachineSpec]:
    if arg is not None:
        return [_load_machine(arg)]
    return [loader.bundled_spec(name) for name in loader.bundled_machines()]


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "machine",
        nargs="?",
        metavar="MACHINE",
        help="a bundled machine name or a .toml spec file (default: every bundled machine)",
    )
    p.add_argument(
        "-f",
        "--format",
        choices=[f.value for f in DiagramFormat],
        default=DiagramFormat.MERMAID.value,
        help="output format (default: mermaid); svg and png need Graphviz",
    )
    p.add_argument(
        "--highlight",
        metavar="STATE",
        help="fill one state, named by dotted path (e.g. prepared.loading); needs MACHINE "
        "(default: none)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=path_arg,
        metavar="PATH",
        help="file to write (several machines as svg/png: a directory; default: stdout for "
        f"text, <machine>.<format> for one image, {DEFAULT_DIAGRAM_FOLDER}/ for several)",
    )
    p.add_argument(
        "--coverage",
        type=path_arg,
        metavar="FILE.json",
        help="label and colour each arrow by how often a run took it (from simulate/fuzz; "
        "default: no counts)",
    )


def _comment(fmt: DiagramFormat, name: str) -> str:
    return f"%% machine: {name}" if fmt is DiagramFormat.MERMAID else f"// machine: {name}"


def _coverage_of(
    path: Path | None,
) -> Callable[[MachineSpec], Mapping[tuple[int, str], int] | None]:
    """Per-spec declared-arrow counts from a coverage file (None: draw without)."""
    if path is None:
        return lambda spec: None
    input_file("--coverage", path)
    try:
        with reading("--coverage", path):
            cov = Coverage.load(path)
    except (KeyError, TypeError) as exc:
        msg = f"--coverage {str(path)!r} is not a coverage file ({exc})"
        raise CliError(msg) from None

    def declared(spec: MachineSpec) -> Mapping[tuple[int, str], int] | None:
        unknown = cov.unknown(spec)
        if unknown:
            shown = ", ".join(unknown[:3]) + (" ..." if len(unknown) > 3 else "")
            msg = (
                f"--coverage {str(path)!r}: {shown} is not a transition of {spec.name} "
                f"({len(unknown)} such row(s)); was the file made from another version of it?"
            )
            raise CliError(msg)
        return cov.declared(spec)

    return declared


def _run(args: argparse.Namespace) -> int:
    fmt = DiagramFormat(args.format)
    highlight: str | None = args.highlight
    if highlight is not None and args.machine is None:
        msg = "--highlight needs a MACHINE (state paths differ between machines)"
        raise CliError(msg)
    specs = _machines(args.machine)
    coverage = _coverage_of(args.coverage)
    output: Path | None = args.output
    # one file is checked here (never a FIFO: a wait; nor a device or a directory);
    # images into a folder are checked as they are named
    if output is not None and (not fmt.is_image or (len(specs) == 1 and not output.is_dir())):
        output_file("-o", output)
    if fmt.is_image:
        for path in _write_images(specs, fmt, highlight, output, coverage):
            print(path)
        return EXIT_OK
    render = render_mermaid if fmt is DiagramFormat.MERMAID else render_dot
    texts = [render(spec, highlight, coverage(spec)) for spec in specs]
    if len(specs) > 1:
        texts = [f"{_comment(fmt, s.name)}\n{t}" for s, t in zip(specs, texts, strict=True)]
    text = "\n".join(texts)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text, encoding="utf-8")
        print(output)
    return EXIT_OK


def _write_images(
    specs: Sequence[MachineSpec],
    fmt: DiagramFormat,
    highlight: str | None,
    output: Path | None,
    coverage: Callable[[MachineSpec], Mapping[tuple[int, str], int] | None],
) -> list[Path]:
    """Render every spec first (so a failure writes nothing), then write the files."""
    images = [(spec.name, render_image(spec, fmt, highlight, coverage(spec))) for spec in specs]
    if len(specs) == 1 and output is not None and not output.is_dir():
        targets = [output]
    else:
        if output is not None:
            folder = output
        else:  # one image beside the caller; several in a folder of their own
            folder = Path() if len(specs) == 1 else Path(DEFAULT_DIAGRAM_FOLDER)
        if folder.exists() and not folder.is_dir():
            msg = f"-o {str(folder)!r} must be a directory when drawing several machines"
            raise CliError(msg)
        if not folder.exists() and folder.suffix:
            msg = (
                f"-o {str(folder)!r} looks like a file name, but {len(specs)} machines are "
                "drawn: give a directory (created if missing) or one MACHINE"
            )
            raise CliError(msg)
        folder.mkdir(parents=True, exist_ok=True)
        targets = [folder / f"{name}.{fmt.value}" for name, _ in images]
        for target in targets:  # validation refuses such names; never trust one blindly
            if target.resolve().parent != folder.resolve():
                msg = f"machine name {target.stem!r} would write outside {str(folder)!r}"
                raise CliError(msg)
            output_file("-o", target)
    for target, (_, data) in zip(targets, images, strict=True):
        target.write_bytes(data)
    return targets


COMMAND = Command("diagram", "draw machines as Mermaid, DOT, SVG or PNG", _arguments, _run)
