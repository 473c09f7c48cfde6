"""A committee of potentials (the deep-ensemble baseline) and loading potentials from checkpoints.

:class:`Committee` wraps several models with the forward signature of
:class:`mlip_unc.models.potential.BayesianPotential` (and ``noise_variances``) into one;
:func:`load_potential` reads one checkpoint (a :class:`BayesianPotential`) or several (a
:class:`Committee`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mlip_unc import keys
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.models.potential_uncertainty import UncertaintyMode

__all__ = ["Committee", "load_potential"]


class Committee(nn.Module):
    """Several potentials as one: mean prediction, variance across members (epistemic).

    Follows MACE's committee convention (population variance over the M members); the
    aleatoric variance is the members' mean noise variance. Every uncertainty mode other than
    "none" returns ENERGY_VAR, ENERGY_EPISTEMIC_VAR, ENERGY_ALEATORIC_VAR and FORCES_VAR; the
    cost is M forward and M backward passes whatever the mode.

    Shapes:
        - **output:** ENERGY and the energy variances ``(n_graphs,)``, FORCES and FORCES_VAR
          ``(n_atoms, 3)``
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"a committee needs at least 2 members, got {len(members)}")
        self.members = nn.ModuleList(members)

    def noise_variances(self, batch) -> dict[str, Tensor]:
        """The members' mean aleatoric variances (keys of ``BayesianPotential.noise_variances``)."""
        outs = [m.noise_variances(batch) for m in self.members]
        return {k: torch.stack([o[k] for o in outs]).mean(0) for k in outs[0]}

    def forward(
        self, batch, *, compute_forces: bool = True, uncertainty: UncertaintyMode | str = "none", **_: Any
    ) -> dict[str, Tensor]:
        outs = [m(batch, compute_forces=compute_forces) for m in self.members]
        energy = torch.stack([o[keys.ENERGY].detach() for o in outs])  # (M, n_graphs)
        result = {keys.ENERGY: energy.mean(0)}
        if compute_forces:
            forces = torch.stack([o[keys.FORCES].detach() for o in outs])  # (M, n_atoms, 3)
            result[keys.FORCES] = forces.mean(0)
        if UncertaintyMode(uncertainty) is not UncertaintyMode.NONE:
            epistemic = energy.var(0, unbiased=False)
            aleatoric = self.noise_variances(batch)[keys.ENERGY].detach()
            result.update({
                keys.ENERGY_EPISTEMIC_VAR: epistemic, keys.ENERGY_ALEATORIC_VAR: aleatoric,
                keys.ENERGY_VAR: epistemic + aleatoric,
            })  # fmt: skip
            if compute_forces:
                result[keys.FORCES_VAR] = forces.var(0, unbiased=False)
        return result


def load_potential(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> nn.Module:
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
