"""unicache_fsm: explicit finite state machines for the external-cache contract.

The public namespace is thin; see the subpackages (`unicache_fsm.fsm`, ...) for the parts.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
