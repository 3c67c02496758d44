"""Linker classes that cannot run under SGLang 0.5.23, for the monitor's interface check:
`NoOffload` leaves `offload` abstract, `OldOffload` takes ``offload(transfers)`` without
the ``session_id`` 0.5.23 passes."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from sglang_linker.thirdparty.dirlinker import DirLinker


class NoOffload(DirLinker):  # type: ignore[misc]
    @abstractmethod
    def offload(self, transfers: list[Any], session_id: str | None = None) -> bool: ...


class OldOffload(DirLinker):  # type: ignore[misc]
    def offload(self, transfers: list[Any]) -> bool:  # type: ignore[override]
        return False
