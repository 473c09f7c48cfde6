"""Loading potentials from checkpoint paths: :func:`load_potential`.

One checkpoint gives a :class:`~mlip_unc.models.potential.BayesianPotential`, several (or an
ensemble folder) a :class:`~mlip_unc.models.committee.Committee`. The checkpoint files
themselves are read by :mod:`mlip_unc.models.checkpoint` (weights only).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from mlip_unc.models.committee import Committee
from mlip_unc.models.potential import BayesianPotential

__all__ = ["load_potential"]


def load_potential(
    paths: str | os.PathLike | Sequence[str | os.PathLike],
) -> BayesianPotential | Committee:
    """A potential from checkpoint path(s); several paths (or an ensemble folder) -> Committee.

    A folder is read as its ``model.pt``, or, for an ensemble run, its ``member_*/model.pt``.
    Models are returned in eval mode.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            members = sorted(path.glob("member_*/model.pt"))
            files.extend(members if members else [path / "model.pt"])
        else:
            files.append(path)
    models = [BayesianPotential.from_checkpoint(f) for f in files]
    for model in models:
        model.eval()
    return models[0] if len(models) == 1 else Committee(models).eval()
