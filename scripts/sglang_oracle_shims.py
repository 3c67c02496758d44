"""Start-up shims of the SGLang oracle virtualenv (installed there by `sglang_env.sh`).

`scripts/sglang_env.sh` copies this file into the oracle venv's site-packages as
``unicache_sglang_shims.py`` and imports it from a ``.pth`` file, so every Python
process of that venv runs it before anything else. It does two things:

1. **A stand-in for ``torchvision``.** SGLang imports torchvision at module load
   (multimodal processors and model configs reached through the scheduler imports);
   the radix cache, its components and its linker never call it. The registry's
   torchvision wheels are CUDA builds that fail to load against the local CPU
   torch 2.13.0, and a CUDA torch 2.14.1 would weigh ~6 GB. So imports of
   ``torchvision`` and any ``torchvision.*`` submodule are served by an empty
   package whose attributes are placeholder classes: they can be named, subclassed
   and used as defaults, and raise `RuntimeError` when instantiated. The finder is
   appended to ``sys.meta_path``: a real torchvision, if one is ever installed,
   wins. ``importlib.metadata`` still reports no torchvision distribution, so
   libraries that probe for it (transformers) treat it as absent.
2. **A per-venv torch extensions folder.** SGLang's page hashing JIT-builds a small
   C++ extension; ``TORCH_EXTENSIONS_DIR`` defaults to ``torch_extensions`` inside
   the venv so the build made by ``sglang_env.sh`` is the one the suite reuses.

This file is not part of the library and is never imported by it.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from collections.abc import Sequence
from typing import Any

STAND_IN_ROOT = "torchvision"
STAND_IN_VERSION = "0.0.0+unicache-oracle-stand-in"


class _PlaceholderMeta(type):
    """Class-level attribute access yields further placeholders (``Mode.BICUBIC``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")


def _placeholder(qualname: str) -> type:
    def refuse(self: object, *args: object, **kwargs: object) -> None:
        msg = (
            f"{qualname} belongs to the torchvision stand-in of the SGLang oracle venv "
            "(see scripts/sglang_oracle_shims.py); nothing in the radix cache calls it"
        )
        raise RuntimeError(msg)

    short = qualname.rsplit(".", 1)[-1]
    return _PlaceholderMeta(short, (), {"__init__": refuse, "__qualname__": qualname})


class StandInModule(types.ModuleType):
    """A stand-in package: unknown attributes are placeholder classes."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == STAND_IN_ROOT or fullname.startswith(STAND_IN_ROOT + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return StandInModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__path__ = []
        module.__dict__["__version__"] = STAND_IN_VERSION


def install() -> None:
    """Install both shims (idempotent)."""
    if not any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        sys.meta_path.append(_StandInFinder())
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))


install()
