"""The version is kept in one place, ``mlip_unc.__version__``, which the package metadata reads."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

import mlip_unc

ROOT = Path(__file__).resolve().parents[1]


def test_the_version_and_the_installed_metadata_agree() -> None:
    """A failure means the installed metadata is stale: ``pip install -e .`` again."""
    assert mlip_unc.__version__ == importlib.metadata.version("mlip-unc")


def test_pyproject_reads_the_version_from_the_package() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "mlip_unc.__version__"}
