"""Build script: what pyproject.toml cannot say.

- The machine specs live in ``specs/`` at the top of the checkout and ship inside the
  wheel as ``unicache_fsm/specs`` (`unicache_fsm.fsm.loader.specs_dir` finds either).
- Three optional C extensions, each the native form of one hot path that also runs in
  Python: ``unicache_fsm._pagechain`` (`unicache_fsm/_pagechain.c`), the SHA-256 page
  chain of `unicache_fsm.hashing` in one call (`hashing.NATIVE_CHAIN` says which one
  runs); ``unicache_fsm._pagecheck`` (`unicache_fsm/_pagecheck.c`), the live-page check
  of `unicache_fsm.pools.paged` (`paged.NATIVE_CHECK`); ``unicache_fsm._pagecopy``
  (`unicache_fsm/_pagecopy.c`), the page copies fused with their XXH3-64 checksum of
  `unicache_fsm.store.checksum` (`checksum.NATIVE_COPY`). Where no C compiler is found
  the build goes on without them and the same results come from Python;
  ``UNICACHE_FSM_NO_NATIVE=1`` in the environment builds without them. (An editable
  install keeps extensions built in place before, ``unicache_fsm/*.so``, and they still
  load: delete them to run the Python paths.)
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
            f"unicache_fsm.{name}",
            [f"unicache_fsm/{name}.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
        for name in ("_pagechain", "_pagecheck", "_pagecopy")
    ]
    if NATIVE
    else [],
)
