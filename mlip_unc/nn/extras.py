"""Optional dependencies (the ``mace``, ``dft`` and ``lammps`` extras): the pip command that
installs one, right for the way mlip-unc itself was installed.

- run from a source checkout (an editable install, or the repository on ``sys.path``):
  ``pip install -e ".[mace]"`` (the checkout's path instead of ``.`` outside it);
- installed from a local folder (``pip install path/``): ``pip install "path[mace]"``;
- installed from the package index: ``pip install "mlip-unc[mace]"``.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

__all__ = ["DISTRIBUTION", "MissingDependencyError", "pip_install_hint"]

DISTRIBUTION = "mlip-unc"


class MissingDependencyError(ImportError):
    """An optional dependency is not installed; the message says how to install it."""


def _source_root() -> Path | None:
    """The checkout this package runs from (its ``pyproject.toml`` beside ``mlip_unc/``)."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and f'name = "{DISTRIBUTION}"' in pyproject.read_text(encoding="utf-8"):
        return root
    return None


def _local_folder() -> Path | None:
    """The folder pip installed this package from (its ``direct_url.json``), if any."""
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None
    if not text:
        return None
    url = urlparse(str(json.loads(text).get("url", "")))
    return Path(unquote(url.path)) if url.scheme == "file" else None


def pip_install_hint(extra: str) -> str:
    """``pip install ...`` that adds the optional dependencies ``extra`` to this installation."""
    root = _source_root()
    if root is not None:
        try:
            here: Path | None = Path.cwd().resolve()
        except OSError:  # the working folder was removed
            here = None
        where = "." if root == here else str(root)
        return f'pip install -e "{where}[{extra}]"'
    folder = _local_folder()
    if folder is not None:
        return f'pip install "{folder}[{extra}]"'
    return f'pip install "{DISTRIBUTION}[{extra}]"'
