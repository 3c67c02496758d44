"""The ``unicache-fsm`` command line, run through `main` and once as ``python -m``.

Bad input must give exit code 2 and exactly one ``unicache-fsm: error:`` line on
stderr, never a traceback. Image tests need Graphviz: they skip locally when ``dot``
is missing and fail in CI (``CI`` set), which installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import unicache_fsm
from unicache_fsm.cli import COMMANDS, EXIT_BAD_INPUT, EXIT_CHECK_FAILED, EXIT_OK, main
from unicache_fsm.fsm import loader
from unicache_fsm.fsm.diagram import render_dot, render_markdown_doc, render_mermaid

ROOT = Path(__file__).resolve().parents[1]
MACHINES = loader.bundled_machines()

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None and not os.environ.get("CI"),
    reason="Graphviz 'dot' is not installed (CI installs it: apt-get install graphviz)",
)

SMALL_SPEC = """
machine = "door"
initial = "closed"
[states.closed]
[states.open]
[states.gone]
final = true
[[transitions]]
trigger = "open_it"
source = "closed"
dest = "open"
[[transitions]]
trigger = "close_it"
source = "open"
dest = "closed"
[[transitions]]
trigger = "remove"
source = ["closed", "open"]
dest = "gone"
"""


def run_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run `main`, assert it failed on bad input with one error line; return that line."""
    code = main(argv)
    captured = capsys.readouterr()
    assert code == EXIT_BAD_INPUT, captured
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("unicache-fsm: error: "), lines[0]
    assert "Traceback" not in captured.err
    return lines[0]


def test_commands_are_a_table() -> None:
    assert [c.name for c in COMMANDS] == [
        "diagram",
        "docs",
        "check-trace",
        "fuzz",
        "explore",
        "simulate",
        "check-linker",
    ]


# -- diagram: text formats ---------------------------------------------------------------


def test_diagram_of_every_machine_names_each(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram"]) == EXIT_OK
    out = capsys.readouterr().out
    expected = "\n".join(
        f"%% machine: {m}\n{render_mermaid(loader.bundled_spec(m))}" for m in MACHINES
    )
    assert out == expected


def test_diagram_of_every_machine_as_dot(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", "--format", "dot"]) == EXIT_OK
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("// machine: ")] == [
        f"// machine: {m}" for m in MACHINES
    ]
    assert out.count("digraph ") == len(MACHINES)


def test_diagram_of_one_machine_has_no_comment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", "offload", "-f", "dot", "--highlight", "pending"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out == render_dot(loader.bundled_spec("offload"), highlight="pending")


def test_diagram_of_a_spec_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "door.toml"
    path.write_text(SMALL_SPEC, encoding="utf-8")
    assert main(["diagram", str(path), "--highlight", "open"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out == render_mermaid(loader.parse_spec(SMALL_SPEC), highlight="open")


def test_diagram_text_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "lt.mmd"
    assert main(["diagram", "load_transaction", "-o", str(target)]) == EXIT_OK
    assert capsys.readouterr().out == f"{target}\n"
    assert target.read_text(encoding="utf-8") == render_mermaid(
        loader.bundled_spec("load_transaction")
    )


# -- diagram: images -----------------------------------------------------------------------


@needs_dot
def test_svg_of_one_machine_defaults_to_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["diagram", "offload", "--format", "svg"]) == EXIT_OK
    assert capsys.readouterr().out == "offload.svg\n"
    root = ET.parse(tmp_path / "offload.svg").getroot()
    assert root.tag.endswith("svg")


@needs_dot
def test_png_of_one_machine_to_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "pic.png"
    argv = ["diagram", "load_transaction", "-f", "png", "--highlight", "prepared", "-o"]
    assert main([*argv, str(target)]) == EXIT_OK
    assert capsys.readouterr().out == f"{target}\n"
    assert target.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")


@needs_dot
def test_svg_of_every_machine_into_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "new" / "folder"
    assert main(["diagram", "-f", "svg", "-o", str(folder)]) == EXIT_OK
    written = capsys.readouterr().out.splitlines()
    assert written == [str(folder / f"{m}.svg") for m in MACHINES]
    for m in MACHINES:
        svg = ET.parse(folder / f"{m}.svg").getroot()
        texts = {el.text for el in svg.iter() if el.text}
        assert {s.name for s in loader.bundled_spec(m).states()} <= texts


@needs_dot
def test_svg_of_every_machine_needs_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    not_a_dir = tmp_path / "file.svg"
    not_a_dir.write_text("keep me", encoding="utf-8")
    line = run_error(capsys, ["diagram", "-f", "svg", "-o", str(not_a_dir)])
    assert "must be a directory" in line
    assert not_a_dir.read_text(encoding="utf-8") == "keep me"


@needs_dot
def test_every_machine_to_a_file_name_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "all.png"
    line = run_error(capsys, ["diagram", "-f", "png", "-o", str(target)])
    assert "looks like a file name" in line and f"{len(MACHINES)} machines" in line
    assert not target.exists()


def test_images_without_graphviz_say_how_to_install_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no `dot` on it
    monkeypatch.chdir(tmp_path)
    line = run_error(capsys, ["diagram", "offload", "--format", "svg"])
    assert "apt-get install graphviz" in line and "brew install graphviz" in line
    assert list(tmp_path.iterdir()) == []


# -- diagram: bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["diagram", "no_such_machine"], "unknown machine 'no_such_machine'"),
        (["diagram", "offload", "--highlight", "nowhere"], "has no state 'nowhere'"),
        (["diagram", "--highlight", "queued"], "--highlight needs a MACHINE"),
        (["diagram", "missing/spec.toml"], "no spec file 'missing/spec.toml'"),
        (["diagram", "offload", "--format", "jpeg"], "invalid choice: 'jpeg'"),
        (["diagram", "offload", "--no-such-flag"], "unrecognized arguments"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in run_error(capsys, argv)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("machine = 'x'\n[states", "toml syntax"),
        (SMALL_SPEC.replace('dest = "open"', 'dest = "ajar"'), "unknown state: ajar"),
    ],
)
def test_invalid_spec_file_is_one_line(
    text: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    line = run_error(capsys, ["diagram", str(path)])
    assert "invalid machine spec" in line and needle in line


def test_text_output_into_a_folder_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = run_error(capsys, ["diagram", "offload", "-o", str(tmp_path)])
    assert str(tmp_path) in line


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram", "--help"]) == EXIT_OK
    assert "--highlight" in capsys.readouterr().out


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == EXIT_OK
    assert capsys.readouterr().out == f"unicache-fsm {unicache_fsm.__version__}\n"


# -- docs ----------------------------------------------------------------------------------


@pytest.fixture
def specs_copy(tmp_path: Path) -> Path:
    for m in MACHINES:
        shutil.copy(loader.specs_dir() / f"{m}.toml", tmp_path / f"{m}.toml")
    return tmp_path


def test_docs_writes_then_checks(specs_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["docs", "--specs-dir", str(specs_copy)]
    assert main([*argv, "--check"]) == EXIT_CHECK_FAILED
    stale = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in stale] == [str(specs_copy / f"{m}.md") for m in MACHINES]
    assert all("run `unicache-fsm docs`" in line for line in stale)
    assert not list(specs_copy.glob("*.md"))  # --check writes nothing

    assert main(argv) == EXIT_OK
    capsys.readouterr()
    for m in MACHINES:
        committed = (loader.specs_dir() / f"{m}.md").read_text(encoding="utf-8")
        assert (specs_copy / f"{m}.md").read_text(encoding="utf-8") == committed

    assert main([*argv, "--check"]) == EXIT_OK
    assert capsys.readouterr().out == f"{len(MACHINES)} docs up to date\n"

    edited = specs_copy / "offload.md"
    edited.write_text(edited.read_text(encoding="utf-8") + "hand edit\n", encoding="utf-8")
    assert main([*argv, "--check"]) == EXIT_CHECK_FAILED
    assert capsys.readouterr().out.split()[1] == str(edited)
    assert main(argv) == EXIT_OK
    assert capsys.readouterr().out.splitlines()[0] == f"wrote {edited}"
    assert edited.read_text(encoding="utf-8") == render_markdown_doc(loader.bundled_spec("offload"))


def test_docs_refuses_to_rewrite_an_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    installed = tmp_path / "site-packages" / "unicache_fsm" / "specs"
    installed.mkdir(parents=True)
    shutil.copy(loader.specs_dir() / "offload.toml", installed / "offload.toml")
    monkeypatch.setattr(loader, "specs_dir", lambda: installed)
    line = run_error(capsys, ["docs"])
    assert "installed package" in line and "--specs-dir" in line
    assert sorted(p.name for p in installed.iterdir()) == ["offload.toml"]
    assert main(["docs", "--check"]) == EXIT_CHECK_FAILED  # reading is fine


def test_the_source_checkout_specs_are_writable() -> None:
    assert loader.specs_are_source()


def test_docs_of_the_bundled_specs_are_up_to_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["docs", "--check"]) == EXIT_OK, capsys.readouterr().out


def test_docs_of_an_empty_folder_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "no *.toml spec files" in run_error(capsys, ["docs", "--specs-dir", str(tmp_path)])


# -- as a program --------------------------------------------------------------------------


def _python_m(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unicache_fsm", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=120,
    )


def test_python_m_draws_a_diagram() -> None:
    proc = _python_m("diagram", "load_transaction")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == render_mermaid(loader.bundled_spec("load_transaction"))


def test_python_m_reports_bad_input_without_traceback() -> None:
    proc = _python_m("diagram", "load_transaction", "--highlight", "prepared.nowhere")
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.startswith("unicache-fsm: error: machine 'load_transaction' has no state")
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_python_m_simulate_prints_no_warning() -> None:
    # torch's CPU wheel warns on import when NumPy is missing: numpy is a dependency.
    proc = _python_m("simulate", "--requests", "10", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stderr.lower(), proc.stderr


@pytest.mark.parametrize("name", ["../escaped_by_machine_name", "<tmp>/absolute_machine_name"])
def test_a_machine_name_never_writes_outside_the_output_folder(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = name.replace("<tmp>", str(tmp_path))
    spec = tmp_path / "spec" / "evil.toml"
    spec.parent.mkdir()
    spec.write_text(SMALL_SPEC.replace('machine = "door"', f"machine = {name!r}"))
    out = tmp_path / "out"
    out.mkdir()
    line = run_error(capsys, ["diagram", str(spec), "-f", "svg", "-o", f"{out}/"])
    assert "invalid machine name" in line
    written = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    assert written == {Path("spec"), Path("spec/evil.toml"), Path("out")}


# -- bad input found by an adversarial user (issue: simulate, check-trace, coverage) ----


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["simulate", "--requests", "0"], "--requests must be 1 or more"),
        (["simulate", "--requests", "2", "--pool-tokens", "1000000000000"], "--pool-tokens"),
    ],
)
def test_simulate_bad_sizes_are_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert needle in run_error(capsys, argv)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (bytes(range(128, 256)), "not UTF-8"),
        (b"[1, 2]\n", "expected a JSON object"),
        (
            b'{"seq": 1, "machine": "offload", "model": "m", "source": "", '
            b'"trigger": "<init>", "dest": "queued"}\n"text"\n',
            "record 2",
        ),
        (b"{oops\n", "not JSON"),
        (b"", "no trace records"),
        (b"\n  \n", "no trace records"),
    ],
    ids=["binary", "array", "string-line", "bad-json", "empty", "blank"],
)
def test_check_trace_of_a_file_that_is_no_trace_is_one_line(
    content: bytes, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(content)
    line = run_error(capsys, ["check-trace", str(path)])
    assert needle in line


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([["queued", "nope", "pending", 3]], "not a transition of offload"),
        ([["queued", "submit", "pending", -4]], "negative"),
        ([["queued", "submit", "pending", "many"]], "count"),
        ([["queued", "submit"]], "row"),
    ],
    ids=["unknown-transition", "negative", "non-int", "short-row"],
)
def test_diagram_coverage_with_bad_rows_is_one_line(
    rows: list[list[object]], needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "cov.json"
    path.write_text(json.dumps({"machines": {"offload": rows}}), encoding="utf-8")
    line = run_error(capsys, ["diagram", "offload", "--coverage", str(path)])
    assert needle in line, line


def test_fuzz_coverage_into_a_missing_folder_fails_before_the_campaign(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import time

    start = time.perf_counter()
    line = run_error(capsys, ["fuzz", "--minutes", "5", "--coverage", "/missing/dir/x.json"])
    assert "/missing/dir" in line
    assert time.perf_counter() - start < 60, "the campaign ran before the check"


# -- commands that never touch a tensor do not import torch -------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["diagram"],
        ["diagram", "offload", "-f", "dot"],
        ["check-trace", "<trace>"],
    ],
)
def test_tensor_free_commands_do_not_import_torch(argv: list[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"seq": 1, "machine": "offload", "model": "m", "source": "", '
        '"trigger": "<init>", "dest": "queued"}\n'
    )
    argv = [str(trace) if a == "<trace>" else a for a in argv]
    code = (
        "import sys\n"
        "from unicache_fsm.cli import main\n"
        f"rc = main({argv!r})\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "sys.exit(rc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "torch was imported" not in done.stderr
