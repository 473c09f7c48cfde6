"""The CLI is a thin layer over the public library: it imports no private name of mlip_unc.

Private helpers (``_select``, ``_f``) change without notice; a CLI built on them breaks
silently and shows users that the public functions are not enough. The CLI's own private
modules (``mlip_unc.cli._common``) are its business.
"""

from __future__ import annotations

import ast
from pathlib import Path

CLI = Path(__file__).resolve().parents[2] / "mlip_unc" / "cli"


def _private_imports(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith("mlip_unc"):
            continue
        module = node.module or ""
        if module == "mlip_unc.cli" or module.startswith("mlip_unc.cli."):
            continue
        parts = module.split(".")
        names = [a.name for a in node.names]
        if any(p.startswith("_") for p in parts) or any(n.startswith("_") for n in names):
            found.append(f"line {node.lineno}: from {module} import {', '.join(names)}")
    return found


def test_the_cli_imports_only_public_library_names():
    files = sorted(CLI.rglob("*.py"))
    assert files
    bad = {
        str(f.relative_to(CLI)): hits
        for f in files
        if (hits := _private_imports(ast.parse(f.read_text(encoding="utf-8"))))
    }
    assert not bad, bad


def test_the_check_finds_a_private_import():
    tree = ast.parse(
        "from mlip_unc.data.readers import _select, read_structures\n"
        "from mlip_unc.cli._common import fail\n"
    )
    assert _private_imports(tree) == [
        "line 1: from mlip_unc.data.readers import _select, read_structures"
    ]
