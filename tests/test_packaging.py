"""Packaging: the public namespace is locked, and the specs ship inside the wheel."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

import unicache_fsm.fsm
from unicache_fsm.integrations.errors import SglangUnavailableError

ROOT = Path(__file__).resolve().parents[1]


def test_fsm_namespace_is_locked() -> None:
    assert sorted(unicache_fsm.fsm.__all__) == [
        "ANY_STATE",
        "AsyncCompiledExecutor",
        "AsyncExecutor",
        "AsyncReferenceExecutor",
        "AwaitableGuardError",
        "CompiledExecutor",
        "Executor",
        "FlatMachine",
        "FlatTransition",
        "GuardRejectedError",
        "IllegalTransitionError",
        "InvalidSpecError",
        "MachineBuilder",
        "MachineSpec",
        "ReferenceExecutor",
        "SpecProblem",
        "StateKind",
        "StateSpec",
        "TransitionEvent",
        "TransitionSpec",
        "UnicacheFsmError",
        "UnknownStateError",
        "UnknownTriggerError",
        "bundled_machines",
        "bundled_spec",
        "dump_spec",
        "flatten",
        "load_spec",
        "model_id",
        "parse_spec",
    ]
    for name in unicache_fsm.fsm.__all__:
        assert hasattr(unicache_fsm.fsm, name), name


def clean_copy(tmp_path: Path) -> Path:
    """The checkout copied without build outputs (setuptools builds in the tree it is
    given, and a build/ or an in-place extension would feed stale files to a build)."""
    src = tmp_path / "src"
    shutil.copytree(
        ROOT,
        src,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", "build", "dist", "*.egg-info", "__pycache__", ".*cache", ".hypothesis",
            ".venv*", "*.so", "out",
        ),
    )  # fmt: skip
    return src


def wheel_names(project: Path | str, out: Path, env: dict[str, str] | None = None) -> list[str]:
    """Build a wheel of `project` (a tree or an sdist) into `out`; its file names."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(project)],
        check=True,
        capture_output=True,
        env=env,
    )
    (wheel,) = out.glob("unicache_fsm-*.whl")
    return zipfile.ZipFile(wheel).namelist()


@pytest.mark.slow
def test_a_wheel_builds_without_a_c_compiler(tmp_path: Path) -> None:
    """The extensions are optional: with no working C compiler (CC=/bin/false) the
    build goes on and the wheel holds the package without them (the Python paths)."""
    names = wheel_names(
        clean_copy(tmp_path), tmp_path / "wheel", {**os.environ, "CC": "/bin/false"}
    )
    assert "unicache_fsm/hashing.py" in names and "unicache_fsm/pools/pageflags.py" in names
    assert "unicache_fsm/specs/offload.toml" in names
    assert not [n for n in names if n.endswith((".so", ".pyd", ".c"))]


@pytest.mark.slow
def test_the_sdist_carries_the_c_sources_and_builds_the_extensions(tmp_path: Path) -> None:
    """An sdist holds the C sources, their stubs and the specs, and a wheel built from
    it has the extensions (where a compiler is: required in CI)."""
    src, dist = clean_copy(tmp_path), tmp_path / "dist"
    build = f"from setuptools import build_meta; print(build_meta.build_sdist({str(dist)!r}))"
    done = subprocess.run(
        [sys.executable, "-c", build], cwd=src, check=True, capture_output=True, text=True
    )
    sdist = dist / done.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        members = {m.split("/", 1)[1] for m in tar.getnames() if "/" in m}
    for native in ("_pagechain", "_pagecheck", "_pagecopy"):
        assert {f"unicache_fsm/{native}.c", f"unicache_fsm/{native}.pyi"} <= members
    assert {"setup.py", "pyproject.toml", "specs/offload.toml"} <= members
    assert not [m for m in members if m.endswith(".so")]
    names = wheel_names(sdist, tmp_path / "wheel")
    assert "unicache_fsm/specs/offload.toml" in names
    if os.environ.get("UNICACHE_FSM_REQUIRE_NATIVE") == "1":  # CI: a compiler is there
        for native in ("_pagechain", "_pagecheck", "_pagecopy"):
            assert [n for n in names if n.startswith(f"unicache_fsm/{native}.") and ".so" in n]


@pytest.mark.slow
def test_specs_ship_inside_a_non_editable_wheel(tmp_path: Path) -> None:
    out = tmp_path / "wheel"
    # built from a clean copy: setuptools builds in the tree it is given, and a build/
    # left in the checkout would feed stale files to later builds
    src = clean_copy(tmp_path)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("unicache_fsm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    toml_in_wheel = sorted(
        n for n in names if n.startswith("unicache_fsm/specs/") and n.endswith(".toml")
    )
    assert toml_in_wheel == sorted(
        f"unicache_fsm/specs/{p.name}" for p in (ROOT / "specs").glob("*.toml")
    )
    assert "unicache_fsm/py.typed" in names
    assert not [n for n in names if n.endswith(".c")]  # the sources stay in the sdist
    for native in ("_pagechain", "_pagecheck", "_pagecopy"):
        assert f"unicache_fsm/{native}.pyi" in names
        if os.environ.get("UNICACHE_FSM_REQUIRE_NATIVE") == "1":  # CI: a compiler is there
            assert [n for n in names if n.startswith(f"unicache_fsm/{native}.") and ".so" in n]

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(site)!r})
        import unicache_fsm
        from unicache_fsm.fsm import bundled_machines, bundled_spec
        from unicache_fsm.fsm.loader import specs_dir
        assert unicache_fsm.__file__.startswith({str(site)!r}), unicache_fsm.__file__
        assert str(specs_dir()).startswith({str(site)!r}), specs_dir()
        names = bundled_machines()
        assert all(bundled_spec(n).name == n for n in names)
        from unicache_fsm import hashing
        from unicache_fsm.pools import paged
        from unicache_fsm.store import checksum
        if {os.environ.get("UNICACHE_FSM_REQUIRE_NATIVE") == "1"!r}:
            assert hashing.NATIVE_CHAIN and paged.NATIVE_CHECK and checksum.NATIVE_COPY
        print(",".join(names))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path
    )
    machines = done.stdout.strip().split(",")
    assert {"load_transaction", "node_residency", "offload"} <= set(machines)

    # `docs` never rewrites the installed copy of the specs.
    installed = site / "unicache_fsm" / "specs"
    before = {p.name: p.read_bytes() for p in installed.iterdir()}
    refuse = f"import sys; sys.path.insert(0, {str(site)!r}); from unicache_fsm.cli import main; "
    refused = subprocess.run(
        [sys.executable, "-c", refuse + "sys.exit(main(['docs']))"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    assert "installed package" in refused.stderr and refused.stderr.count("\n") == 1
    assert {p.name: p.read_bytes() for p in installed.iterdir()} == before


def test_testing_kit_namespace_is_locked() -> None:
    import unicache_fsm.testing as kit

    assert sorted(kit.__all__) == [
        "BackendFaults",
        "Chain",
        "CheckedLinker",
        "DirectoryFaults",
        "InvariantViolation",
        "KvModel",
        "LinkerMachine",
        "LinkerViolation",
        "LoadTicket",
        "MemoryStoreMachine",
        "Obligation",
        "POISON",
        "RedisFaults",
        "RedisServer",
        "StoreMachine",
        "System",
        "SystemMachine",
        "check_linker",
        "check_rank_agreement",
        "check_store",
        "fault_policies",
        "keys_with_shared_prefixes",
        "load_profile",
        "page_key_chains",
        "page_sizes",
        "pool_sizes",
        "token_keys",
    ]
    # the linker kit's runners need SGLang 0.5.23: without it, a typed refusal
    needs_sglang = {"CheckedLinker", "LinkerMachine", "check_linker"}
    has_sglang = importlib.util.find_spec("sglang") is not None
    for name in kit.__all__:
        if name in needs_sglang and not has_sglang:
            with pytest.raises(SglangUnavailableError):
                getattr(kit, name)
        else:
            assert getattr(kit, name) is not None, name
