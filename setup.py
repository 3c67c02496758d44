"""Build script: what pyproject.toml cannot say.

- The machine specs live in ``specs/`` at the top of the checkout and ship inside the
  wheel as ``unicache_fsm/specs`` (`unicache_fsm.fsm.loader.specs_dir` finds either).
- ``unicache_fsm._pagechain`` (C, `unicache_fsm/_pagechain.c`): the SHA-256 page chain
  of `unicache_fsm.hashing` in one native call. It is optional: where no C compiler is
  found the build goes on without it, and `unicache_fsm.hashing` computes the same
  digests in Python (`hashing.NATIVE_CHAIN` says which one runs).
  ``UNICACHE_FSM_NO_NATIVE=1`` in the environment builds without it.
"""

import os

from setuptools import Extension, find_packages, setup

NATIVE = os.environ.get("UNICACHE_FSM_NO_NATIVE") != "1"

setup(
    packages=[*find_packages(include=["unicache_fsm", "unicache_fsm.*"]), "unicache_fsm.specs"],
    package_dir={"unicache_fsm.specs": "specs"},
    package_data={"unicache_fsm": ["py.typed", "*.pyi"], "unicache_fsm.specs": ["*.toml", "*.md"]},
    include_package_data=False,  # exactly the package data above (not the C source)
    ext_modules=[
        Extension(
            "unicache_fsm._pagechain",
            ["unicache_fsm/_pagechain.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
    if NATIVE
    else [],
)
