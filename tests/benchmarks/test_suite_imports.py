"""No benchmark suite imports another suite: shared pieces live in benchmarks/common.

A suite is a top-level module of benchmarks/ (``accuracy.py``) or a package (``speed/``); every
``import benchmarks.X`` / ``from benchmarks[.X] import ...`` in a module of suite S must name S
itself or ``common``. The allowed exceptions below name the code that has not moved yet and why;
an exception that is no longer needed fails the test too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
SHARED = "common"
PART_OF = {"force_uncertainty_size": "force_uncertainty"}  # the suite's part `size`, beside it

ALLOWED = {  # (module, imported suite): why, until the shared piece moves to benchmarks/common
    ("benchmarks/force_uncertainty_size.py", "active_learning"): (
        "another owner's module: the Si MD frames of active_learning.reference_sets_si"
    ),
}


def suite_of(path: Path) -> str:
    parts = path.relative_to(BENCHMARKS).parts
    name = parts[0] if len(parts) > 1 else path.stem
    return PART_OF.get(name, name)


def imported_suites(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, suite) of every import of a benchmarks module in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] == "benchmarks":
                names = [parts[1]] if len(parts) > 1 else [a.name for a in node.names]
                found += [(node.lineno, n) for n in names]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, a.name.split(".")[1])
                for a in node.names
                if a.name.startswith("benchmarks.")
            ]
    return found


def cross_imports() -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for path in sorted(BENCHMARKS.rglob("*.py")):
        if "results" in path.relative_to(BENCHMARKS).parts:
            continue
        own = suite_of(path)
        for line, name in imported_suites(ast.parse(path.read_text(encoding="utf-8"))):
            if PART_OF.get(name, name) not in (own, SHARED):
                key = (path.relative_to(REPO).as_posix(), PART_OF.get(name, name))
                out.setdefault(key, []).append(line)
    return out


def test_no_suite_imports_another_suite():
    found = cross_imports()
    new = {f"{m}:{lines} imports {s}" for (m, s), lines in found.items() if (m, s) not in ALLOWED}
    assert not new, (
        "cross-suite imports (move the shared piece to benchmarks/common): "
        + "; ".join(sorted(new))
    )
    stale = sorted(f"{m} -> {s}" for m, s in ALLOWED if (m, s) not in found)
    assert not stale, f"allowed but no longer imported (drop from ALLOWED): {stale}"


def test_common_imports_no_suite():
    for path in sorted((BENCHMARKS / SHARED).rglob("*.py")):
        names = {n for _, n in imported_suites(ast.parse(path.read_text(encoding="utf-8")))}
        assert names <= {SHARED}, f"{path.relative_to(REPO)} imports {sorted(names - {SHARED})}"


def test_the_walk_sees_every_form():
    tree = ast.parse(
        "from benchmarks import accuracy as a\nimport benchmarks.speed.suite\n"
        "def f():\n    from benchmarks.paper.study import X\n"
        "from benchmarks.common import n2p2\n"
    )
    assert imported_suites(tree) == [(1, "accuracy"), (2, "speed"), (5, "common"), (4, "paper")]
