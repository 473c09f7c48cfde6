"""Architecture checks: import layers, module size, a fast ``mlip-unc --help``.

The layer table is the one of the redesign plan (docs/architecture.md): each top-level part of
``mlip_unc`` may import only the parts listed for it. Every import is found by walking the
syntax tree of every ``mlip_unc/**/*.py`` (imports inside functions, ``TYPE_CHECKING`` blocks,
relative imports and ``importlib.import_module("...")`` with a literal name included), so a
late import cannot hide a dependency.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "mlip_unc"

# ---------------------------------------------------------------------- the layer table
_BASE = frozenset({"keys", "atomic_write", "geometry", "config", "uncertainty"})
_MODELS = _BASE | {"data", "nn", "models", "registry"}
ALL_PARTS = frozenset(
    {
        "keys",
        "registry",
        "atomic_write",
        "geometry",
        "config",
        "uncertainty",
        "data",
        "nn",
        "models",
        "evaluation",
        "posthoc",
        "train",
        "calculator",
        "active",
        "testing",
        "cli",
    }
)

#: part -> the parts of mlip_unc it may import (its own part is always allowed)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "keys": frozenset(),
    "registry": frozenset(),  # found by name; builtins and plugins imported by name at runtime
    "atomic_write": frozenset(),
    "geometry": frozenset({"keys"}),
    "config": frozenset({"keys", "registry"}),
    "uncertainty": frozenset({"keys"}),
    "data": _BASE,
    "nn": _BASE,
    "models": _MODELS,
    "evaluation": _MODELS,  # a model run over a dataset, and its metrics
    "posthoc": _MODELS | {"evaluation"},  # fits on a trained model (posterior, levels, attach)
    "train": _MODELS | {"evaluation", "posthoc"},  # a run ends with both
    "calculator": _MODELS,
    "active": ALL_PARTS - {"cli", "testing"},
    "testing": ALL_PARTS - {"cli"},  # the contract checks exercise everything but the CLI
    "cli": ALL_PARTS - {"testing"},
    "__init__": ALL_PARTS - {"cli", "testing"},  # mlip_unc/__init__.py: nothing imports cli
}


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    part: str
    target: str
    module: str

    def __str__(self) -> str:
        if self.target == "cli":
            rule = "nothing imports cli (except cli itself)"
        else:
            allowed = sorted(MAY_IMPORT[self.part] - {self.part})
            rule = f"{self.part} may import " + (
                f"only {', '.join(allowed)}" if allowed else "nothing"
            )
            rule += " of mlip_unc (and itself)"
        return f"{self.path}:{self.line}: {self.part} imports {self.module} -- rule: {rule}"


def _module_name(path: str) -> str:
    """``mlip_unc/nn/bayesian.py`` -> ``mlip_unc.nn.bayesian``; ``.../__init__.py`` -> the package."""
    parts = list(Path(path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _part_of(module: str) -> str | None:
    """The top-level part of an ``mlip_unc`` module name (None outside mlip_unc)."""
    pieces = module.split(".")
    if pieces[0] != "mlip_unc":
        return None
    return "__init__" if len(pieces) == 1 else pieces[1]


def _imported_modules(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every ``(line, absolute module name)`` imported anywhere in ``tree``."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                prefix = ".".join(base)
                name = f"{prefix}.{node.module}" if node.module else prefix
            else:
                name = node.module or ""
            if name == "mlip_unc":  # `from mlip_unc import nn`: the imported names are the parts
                found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, name))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            fname = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if fname in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def check_source(path: str, source: str) -> list[Violation]:
    """Forbidden imports of one file of the package (``path`` relative to the repository root)."""
    module = _module_name(path)
    part = _part_of(module)
    if part is None or part not in MAY_IMPORT:
        return []  # outside the package, or a part the table lacks (test_every_module_has_a_layer)
    tree = ast.parse(source, filename=path)
    out = []
    for line, name in _imported_modules(tree, module, Path(path).name == "__init__.py"):
        target = _part_of(name)
        if target is None or target not in ALL_PARTS or target == part:
            continue  # outside mlip_unc, an attribute of the bare package, or its own part
        if target not in MAY_IMPORT[part]:
            out.append(Violation(path, line, part, target, name))
    return sorted(out, key=lambda v: v.line)


def _package_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_module_has_a_layer():
    """A new top-level module or package needs a row in the table (and in docs/architecture.md)."""
    unknown = sorted(
        f"{file.relative_to(ROOT).as_posix()}: part {part!r}"
        for file in _package_files()
        if (part := _part_of(_module_name(file.relative_to(ROOT).as_posix()))) not in MAY_IMPORT
    )
    if unknown:
        pytest.fail(
            "not in the layer table (tests/test_layers.py MAY_IMPORT):\n" + "\n".join(unknown),
            pytrace=False,
        )


def test_no_forbidden_imports():
    violations = []
    for file in _package_files():
        rel = file.relative_to(ROOT).as_posix()
        violations += check_source(rel, file.read_text(encoding="utf-8"))
    if violations:
        pytest.fail(
            f"{len(violations)} forbidden import(s):\n" + "\n".join(map(str, violations)),
            pytrace=False,
        )


@pytest.mark.parametrize(
    ("path", "source", "line", "target"),
    [
        ("mlip_unc/data/x.py", "def f():\n    from ..models import potential\n", 2, "models"),
        (
            "mlip_unc/data/x.py",
            "import torch\nimport mlip_unc.train.losses as losses\n",
            2,
            "train",
        ),
        ("mlip_unc/data/x.py", "from mlip_unc import nn\n", 1, "nn"),
        ("mlip_unc/nn/x.py", "from mlip_unc.data.graphs import build\n", 1, "data"),
        ("mlip_unc/nn/__init__.py", "from ..data import graphs\n", 1, "data"),
        ("mlip_unc/nn/sub/x.py", "from ...data import graphs\n", 1, "data"),
        ("mlip_unc/config/x.py", "from mlip_unc.uncertainty import moments\n", 1, "uncertainty"),
        ("mlip_unc/uncertainty/x.py", "from .. import geometry\n", 1, "geometry"),
        (
            "mlip_unc/models/x.py",
            "class A:\n    def m(self):\n        from mlip_unc.train.core import T\n",
            3,
            "train",
        ),
        (
            "mlip_unc/train/x.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mlip_unc.active import loop\n",
            3,
            "active",
        ),
        ("mlip_unc/calculator.py", "from .train import core\n", 1, "train"),
        (
            "mlip_unc/calculator.py",
            "from mlip_unc.evaluation import predictions\n",
            1,
            "evaluation",
        ),
        ("mlip_unc/evaluation/x.py", "from mlip_unc.posthoc.levels import f\n", 1, "posthoc"),
        ("mlip_unc/evaluation/x.py", "from mlip_unc.train.core import Trainer\n", 1, "train"),
        ("mlip_unc/posthoc/x.py", "from ..train import core\n", 1, "train"),
        ("mlip_unc/models/x.py", "from mlip_unc.evaluation.evaluate import f\n", 1, "evaluation"),
        ("mlip_unc/active/x.py", "from mlip_unc.cli import app\n", 1, "cli"),
        ("mlip_unc/keys.py", "from mlip_unc import geometry\n", 1, "geometry"),
        ("mlip_unc/geometry.py", "from mlip_unc.data import neighbours\n", 1, "data"),
        (
            "mlip_unc/models/x.py",
            "import importlib\nm = importlib.import_module('mlip_unc.train.core')\n",
            2,
            "train",
        ),
        ("mlip_unc/__init__.py", "from . import cli\n", 1, "cli"),
    ],
)
def test_the_checker_catches_a_forbidden_import(path, source, line, target):
    """The checker itself must see these (else the test above could pass vacuously)."""
    violations = check_source(path, source)
    assert [(v.line, v.target) for v in violations] == [(line, target)], violations


@pytest.mark.parametrize(
    ("path", "source"),
    [
        (
            "mlip_unc/data/x.py",
            "from mlip_unc import keys\nfrom ..geometry import edge_vectors\nimport torch\n",
        ),
        ("mlip_unc/data/x.py", "from . import splits\nfrom .graphs import build\n"),
        (
            "mlip_unc/nn/x.py",
            "from mlip_unc.config.enums import Estimator\nfrom ..uncertainty import moments\n",
        ),
        (
            "mlip_unc/models/x.py",
            "from mlip_unc.nn import bayesian\nfrom mlip_unc.data import graphs\n",
        ),
        ("mlip_unc/train/x.py", "from mlip_unc.models import potential\nfrom . import core\n"),
        (
            "mlip_unc/train/x.py",
            "from mlip_unc.posthoc import posterior\nfrom mlip_unc.evaluation import evaluate\n",
        ),
        ("mlip_unc/posthoc/x.py", "from mlip_unc.evaluation.predictions import predict\n"),
        ("mlip_unc/cli/x.py", "from mlip_unc.active import loop\nfrom . import _common\n"),
        ("mlip_unc/calculator.py", "from mlip_unc.models.checkpoint import load_checkpoint\n"),
        ("mlip_unc/__init__.py", "def __getattr__(n):\n    from mlip_unc.calculator import C\n"),
    ],
)
def test_the_checker_allows_permitted_imports(path, source):
    assert check_source(path, source) == []


def test_violation_message_names_file_line_and_rule():
    (v,) = check_source(
        "mlip_unc/nn/x.py", "import torch\n\n\ndef f():\n    from mlip_unc.data import graphs\n"
    )
    assert str(v) == (
        "mlip_unc/nn/x.py:5: nn imports mlip_unc.data -- "
        "rule: nn may import only atomic_write, config, geometry, keys, uncertainty of mlip_unc "
        "(and itself)"
    )


# ---------------------------------------------------------------------- module size
# A guideline, not a target to pack lines for (formatted code, one concept per module): the
# bound only stops a module from drifting towards the 1,000-line files we do not want.
MAX_LINES = 600


def test_no_module_over_600_lines():
    long = []
    for file in _package_files():
        n = len(file.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            long.append(f"{file.relative_to(ROOT).as_posix()}: {n} lines")
    if long:
        pytest.fail(
            f"{len(long)} module(s) over {MAX_LINES} lines:\n" + "\n".join(long), pytrace=False
        )


# ---------------------------------------------------------------------- CLI start-up
HELP_SECONDS = 2.0


def _help_command() -> list[str]:
    """The ``mlip-unc`` console script of this environment (pyproject: ``mlip_unc.cli:main``)."""
    script = Path(sys.executable).with_name("mlip-unc")
    if script.is_file():
        return [str(script), "--help"]
    found = shutil.which("mlip-unc")
    if found:
        return [found, "--help"]
    return [sys.executable, "-c", "from mlip_unc.cli import main; main()", "--help"]


def test_cli_help_answers_within_two_seconds():
    """Wall time of a fresh process, as a user sees it; one retry absorbs machine noise."""
    command = _help_command()
    times = []
    for _ in range(2):
        start = time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
        )
        times.append(time.perf_counter() - start)
        assert done.returncode == 0, done.stderr
        assert "Usage" in done.stdout and "property" in done.stdout, done.stdout
        if times[-1] < HELP_SECONDS:
            return
    pytest.fail(
        f"`{' '.join(Path(c).name for c in command)}` took {', '.join(f'{t:.2f}' for t in times)} s "
        f"(limit {HELP_SECONDS} s)"
    )
