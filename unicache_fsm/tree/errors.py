"""Errors of the radix tree: caller mistakes, each typed and carrying its culprit.

Every class derives from `TreeError` (a `UnicacheFsmError`) and the builtin it refines.
An operation that raises one of these has changed nothing in the tree or its pools.

- `UnalignedKeyError`: a key (or a length inside it) that is not whole pages.
- `ValueLengthError`: an insert whose slot tensor does not match its key.
- `InsertParamsError`: an insert's `prev_prefix_len` / `swa_evicted_seqlen` outside its key.
- `SlotTensorError`: a slot tensor with the wrong dtype, shape or device.
- `OwnedSlotsError`: an insert whose caller slots (past `prev_prefix_len`) include
  pages the tree already owns; names the pages and the nodes that own them.
- `TreeConfigError`: a `TreeConfig` field outside its domain (e.g. a window of 0).
- `LockUnderflowError`: unlocking a node whose path is not locked.
- `NodeStateError`: an operation that the node's residency does not allow now (e.g.
  offloading a node that is already stored); names the node and its state.
- `UnsupportedComponentError`: a component asked to do what it cannot (MAMBA and the
  external linker).
- `TreeConsistencyError`: `RadixTree.check()` found the tree inconsistent (a bug, not a
  caller mistake; lists every finding).
"""

from __future__ import annotations

from collections.abc import Sequence

from unicache_fsm.fsm.errors import UnicacheFsmError

__all__ = [
    "InsertParamsError",
    "LockUnderflowError",
    "NodeStateError",
    "OwnedSlotsError",
    "SlotTensorError",
    "TreeConfigError",
    "TreeConsistencyError",
    "TreeError",
    "UnalignedKeyError",
    "UnsupportedComponentError",
    "ValueLengthError",
]


class TreeError(UnicacheFsmError):
    """Root of the errors raised by `unicache_fsm.tree`."""


class UnalignedKeyError(TreeError, ValueError):
    """`what` (a length or position) is not a multiple of the page size."""

    def __init__(self, message: str, *, what: str, value: int, page_size: int) -> None:
        super().__init__(message)
        self.what = what
        self.value = value
        self.page_size = page_size


class ValueLengthError(TreeError, ValueError):
    def __init__(self, message: str, *, key_len: int, value_len: int) -> None:
        super().__init__(message)
        self.key_len = key_len
        self.value_len = value_len


class InsertParamsError(TreeError, ValueError):
    def __init__(self, message: str, *, what: str, value: int) -> None:
        super().__init__(message)
        self.what = what
        self.value = value


class OwnedSlotsError(TreeError, ValueError):
    """Caller slots that the tree already owns (`pages`, held by `node_ids`)."""

    def __init__(self, message: str, *, pages: list[int], node_ids: list[int]) -> None:
        super().__init__(message)
        self.pages = pages
        self.node_ids = node_ids


class TreeConfigError(TreeError, ValueError):
    """A `TreeConfig` field (`what`) whose `value` the tree cannot run with."""

    def __init__(self, message: str, *, what: str, value: object) -> None:
        super().__init__(message)
        self.what = what
        self.value = value


class SlotTensorError(TreeError, TypeError):
    def __init__(self, message: str, *, what: str, got: object) -> None:
        super().__init__(message)
        self.what = what
        self.got = got


class LockUnderflowError(TreeError, RuntimeError):
    def __init__(self, message: str, *, node_id: int) -> None:
        super().__init__(message)
        self.node_id = node_id


class NodeStateError(TreeError, RuntimeError):
    def __init__(self, message: str, *, node_id: int, state: str) -> None:
        super().__init__(message)
        self.node_id = node_id
        self.state = state


class UnsupportedComponentError(TreeError, NotImplementedError):
    def __init__(self, message: str, *, component: str) -> None:
        super().__init__(message)
        self.component = component


class TreeConsistencyError(TreeError, AssertionError):
    def __init__(self, findings: Sequence[str]) -> None:
        self.findings = tuple(findings)
        shown = "\n".join(f"  - {f}" for f in self.findings[:20])
        more = f"\n  ... and {len(self.findings) - 20} more" if len(self.findings) > 20 else ""
        super().__init__(f"tree check found {len(self.findings)} problem(s):\n{shown}{more}")
