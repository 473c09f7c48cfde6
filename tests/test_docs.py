"""The documentation stays true: its code runs, its references resolve, the README stays short.

Code blocks of ``README.md`` and ``docs/**/*.md`` marked runnable (the line before the fence is
``<!-- runnable -->`` or ``<!-- runnable: slow -->``; docs/contributing.md) run in order, per
page, in a fresh folder; quick ones in the default suite, every marked one in the slow tier. A
block marked ``<!-- file: NAME -->`` is written to that file of the folder before them (a
module the runnable blocks import).
The other checks: the README's length and its test command against ``.ci/run``, its relative
links, every name of ``mlip_unc.__all__`` documented in the API reference, and the generated
configuration and command-line references complete.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

import mlip_unc

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts)]
MARKERS = {"<!-- runnable -->": "quick", "<!-- runnable: slow -->": "slow"}
FILE_MARKER = re.compile(r"^<!-- file: ([\w.-]+) -->$")  # the block is saved as that file
RUNNABLE_LANGUAGES = ("python", "bash")
BLOCK_TIMEOUT_S = 900
FENCE = re.compile(r"^```\s*([\w+-]*)")


@dataclass(frozen=True)
class Block:
    """A fenced code block: where it is, its language, its text and its marker."""

    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    tier: str | None  # "quick", "slow", "file" or None (not runnable)
    file: str | None = None  # the file name of a "file" block

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line} ({self.language or 'no language'})"


def code_blocks(page: Path) -> list[Block]:
    """Every top-level fenced block of ``page`` (fences at the start of a line)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        start, language = i, match.group(1)
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if i == len(lines):
            raise AssertionError(f"{page.relative_to(ROOT)}:{start + 1}: unclosed code fence")
        marker = lines[start - 1].strip() if start > 0 else ""
        code = "\n".join(lines[start + 1 : i]) + "\n"
        file = FILE_MARKER.match(marker)
        tier = "file" if file else MARKERS.get(marker)
        blocks.append(Block(page, start + 1, language, code, tier, file and file.group(1)))
        i += 1
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in code_blocks(page)]


def _page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _pages_with(tiers: set[str]) -> list[Path]:
    return [p for p in PAGES if any(b.tier in tiers for b in code_blocks(p))]


def _run_blocks(blocks: list[Block], workdir: Path) -> None:
    """Run ``blocks`` in order in ``workdir``; fail with the block and its output on error."""
    for name in ("configs", "examples"):
        (workdir / name).symlink_to(ROOT / name, target_is_directory=True)
    (workdir / "runs").mkdir()
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", MPLBACKEND="Agg")
    for block in blocks:
        if block.file is not None:
            (workdir / block.file).write_text(block.code, encoding="utf-8")
    for k, block in enumerate(b for b in blocks if b.file is None):
        if block.language == "python":
            script = workdir / f"block_{k}.py"
            command = [sys.executable, str(script)]
        else:
            script = workdir / f"block_{k}.sh"
            command = ["bash", "-euo", "pipefail", str(script)]
        script.write_text(block.code, encoding="utf-8")
        result = subprocess.run(
            command,
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=BLOCK_TIMEOUT_S,
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr)[-4000:]
            pytest.fail(
                f"{block} exited {result.returncode}:\n{block.code}\n--- output ---\n{output}"
            )


# ---------------------------------------------------------------- the blocks themselves


def test_pages_have_code_blocks_and_markers_are_valid() -> None:
    assert any(b.page == README and b.tier == "quick" for b in ALL_BLOCKS)
    for page in PAGES:
        text = page.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(text):
            if line.strip().startswith(("<!-- runnable", "<!-- file")):
                known = line.strip() in MARKERS or FILE_MARKER.match(line.strip())
                assert known, f"{page}:{n + 1}: unknown marker {line.strip()!r}"
                following = text[n + 1] if n + 1 < len(text) else ""
                assert FENCE.match(following), f"{page}:{n + 1}: a marker must precede a fence"
    for block in ALL_BLOCKS:
        if block.tier in ("quick", "slow"):  # a "file" block may hold any language
            assert block.language in RUNNABLE_LANGUAGES, f"{block}: only python/bash can run"


@pytest.mark.parametrize("block", [b for b in ALL_BLOCKS if b.language == "python"], ids=str)
def test_python_blocks_compile(block: Block) -> None:
    compile(block.code, str(block), "exec")


@pytest.mark.parametrize("page", _pages_with({"quick"}), ids=_page_id)
def test_quick_blocks_run(page: Path, tmp_path: Path) -> None:
    _run_blocks([b for b in code_blocks(page) if b.tier in ("quick", "file")], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages_with({"quick", "slow"}), ids=_page_id)
def test_all_runnable_blocks_run(page: Path, tmp_path: Path) -> None:
    _run_blocks([b for b in code_blocks(page) if b.tier is not None], tmp_path)


# ---------------------------------------------------------------- the README


def test_readme_is_at_most_200_lines() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= 200, f"README.md has {n} lines; move material into docs/"


def test_readme_test_command_is_what_ci_runs() -> None:
    ci_lines = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    ci_test = [line.strip() for line in ci_lines if "pytest" in line and "pip install" in line]
    assert len(ci_test) == 1, f".ci/run should have one install-and-pytest line, got {ci_test}"
    readme_lines = {
        line.strip()
        for b in code_blocks(README)
        if b.language == "bash"
        for line in b.code.splitlines()
    }
    assert ci_test[0] in readme_lines, "README.md's test command differs from .ci/run's"


def test_quickstart_page_has_the_readme_quick_start() -> None:
    section = README.read_text(encoding="utf-8").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    readme_code = [b.code for b in code_blocks(README) if b.code in section]
    page_code = [b.code for b in code_blocks(DOCS / "quickstart.md")]
    assert readme_code and page_code == readme_code, "docs/quickstart.md differs from the README"


def test_readme_relative_links_exist() -> None:
    text = README.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://|#|mailto:", target):
            continue
        path = ROOT / target.split("#", 1)[0]
        assert path.exists(), f"README.md links to {target}, which does not exist"


# ---------------------------------------------------------------- the API reference


def _documented_path(obj: object) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"  # type: ignore[attr-defined]


def test_public_names_have_docstrings_and_api_entries() -> None:
    api = (DOCS / "reference" / "api.md").read_text(encoding="utf-8")
    entries = set(re.findall(r"^::: ([\w.]+)", api, flags=re.MULTILINE))
    assert mlip_unc.__all__, "mlip_unc.__all__ is empty"
    for name in mlip_unc.__all__:
        obj = getattr(mlip_unc, name)
        doc = obj.__doc__ or ""
        assert doc.strip(), f"mlip_unc.{name} has no docstring"
        assert not doc.startswith(f"{name}("), f"mlip_unc.{name}: only the dataclass signature"
        assert _documented_path(obj) in entries, (
            f"mlip_unc.{name} is missing from docs/reference/api.md (::: {_documented_path(obj)})"
        )


def test_lazy_exports_match_all() -> None:
    assert sorted(mlip_unc.__all__) == sorted(mlip_unc._EXPORTS)


def test_import_mlip_unc_stays_light() -> None:
    code = "import sys, mlip_unc; mlip_unc.__all__; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# ---------------------------------------------------------------- generated references


def _hook(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, DOCS / "hooks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_configuration_reference_lists_every_key_with_a_description() -> None:
    hook = _hook("config_reference")
    for _, spec, _ in hook.ROOTS:
        root = hook._import(spec)
        tables = hook.tables(root)
        keys = {row.key for table in tables for row in table.rows}
        assert set(root.model_fields) <= keys
        for table in tables:
            for row in table.rows:
                assert row.description, f"{spec}: config key {row.key} has no description"
                assert row.type and row.default, row
    page = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    assert hook.MARKER in page
    rendered = hook.on_page_markdown(page)
    assert "`data.r_max`" in rendered and "`selection.top_k`" in rendered


def test_cli_reference_lists_every_command() -> None:
    import typer

    from mlip_unc.cli import app

    hook = _hook("cli_reference")
    rendered = hook.render()
    command = typer.main.get_command(app)
    for name in command.commands:  # type: ignore[attr-defined]
        assert f"`mlip-unc {name}`" in rendered
    assert "`--max-force-std`" in rendered
    assert hook.MARKER in (DOCS / "reference" / "cli.md").read_text(encoding="utf-8")


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    if shutil.which("mkdocs") is None and importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
