"""Draw every bundled machine: Mermaid always, SVG too when Graphviz is installed.

    python examples/draw_diagrams.py [FOLDER]

writes ``<machine>.mmd`` (and ``<machine>.svg``) into FOLDER (default: a new
temporary folder), prints each path, and returns 0. The same files come from the
command line: ``unicache-fsm diagram MACHINE --format svg -o FOLDER``.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

from unicache_fsm.fsm.diagram import DiagramFormat, render_image, render_mermaid
from unicache_fsm.fsm.loader import bundled_machines, bundled_spec


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    folder = Path(args[0]) if args else Path(tempfile.mkdtemp(prefix="unicache_fsm_diagrams_"))
    folder.mkdir(parents=True, exist_ok=True)
    with_svg = shutil.which("dot") is not None
    for name in bundled_machines():
        spec = bundled_spec(name)
        mermaid = folder / f"{name}.mmd"
        mermaid.write_text(render_mermaid(spec), encoding="utf-8")
        print(mermaid)
        if with_svg:
            svg = folder / f"{name}.svg"
            svg.write_bytes(render_image(spec, DiagramFormat.SVG))
            print(svg)
    if not with_svg:
        print("Graphviz 'dot' is not installed: SVG skipped (apt-get install graphviz)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
