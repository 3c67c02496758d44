"""``python -m unicache_fsm``: the same command line as ``unicache-fsm`` (`cli.main`)."""

from __future__ import annotations

import sys

from unicache_fsm.cli import main

if __name__ == "__main__":
    sys.exit(main())
