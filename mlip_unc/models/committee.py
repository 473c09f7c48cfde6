"""A committee of potentials (the deep-ensemble baseline).

:class:`Committee` wraps several models with the forward signature of
:class:`mlip_unc.models.potential.BayesianPotential` (and ``noise_variances``) into one;
:func:`mlip_unc.models.loading.load_potential` builds one from several checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from mlip_unc import keys
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.models.potential_uncertainty import UncertaintyMode

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

__all__ = ["Committee"]


class Committee(nn.Module):
    """Several potentials as one: mean prediction, variance across members (epistemic).

    Follows MACE's committee convention (population variance over the M members); the
    aleatoric variance is the members' mean noise variance. Every uncertainty mode other than
    "none" returns ENERGY_VAR (total), ENERGY_EPISTEMIC_VAR, ENERGY_ALEATORIC_VAR,
    LOCAL_ENERGY_VAR (the members' variance of the per-atom energies), FORCES_VAR with forces
    and STRESS_VAR with ``compute_stress`` (both epistemic: the members' variance, like the
    single model's outputs; add :meth:`noise_variances` for the total). There is no KAPPA (a
    committee has no single latent posterior). The cost is M forward and M backward passes
    whatever the mode.

    Shapes:
        - **output:** ENERGY and the energy variances ``(n_graphs,)``, ATOMIC_ENERGIES and
          LOCAL_ENERGY_VAR ``(n_atoms,)``, FORCES and FORCES_VAR ``(n_atoms, 3)``, STRESS and
          STRESS_VAR ``(n_graphs, 3, 3)``
    """

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        if len(members) < 2:
            raise ValueError(f"a committee needs at least 2 members, got {len(members)}")
        for name in ("type_map", "r_max"):
            values = {repr(getattr(m, name, None)) for m in members}
            if len(values) > 1:
                raise ValueError(f"the committee's members differ in {name}: {sorted(values)}")
        self.members = nn.ModuleList(members)

    @property
    def type_map(self) -> list[int] | None:
        """The members' (common) atomic numbers in ``atom_type`` order."""
        return getattr(self.members[0], "type_map", None)

    @property
    def r_max(self) -> float | None:
        """The members' (common) graph cutoff, Angstrom."""
        return getattr(self.members[0], "r_max", None)

    def noise_variances(self, batch: BaseData) -> dict[str, Tensor]:
        """The members' mean aleatoric variances (keys of ``BayesianPotential.noise_variances``)."""
        outs = [cast(BayesianPotential, m).noise_variances(batch) for m in self.members]
        return {k: torch.stack([o[k] for o in outs]).mean(0) for k in outs[0]}

    def forward(
        self,
        batch: BaseData,
        *,
        compute_forces: bool = True,
        compute_stress: bool = False,
        uncertainty: UncertaintyMode | str = "none",
        **_: Any,
    ) -> dict[str, Tensor]:
        outs = [
            m(batch, compute_forces=compute_forces, compute_stress=compute_stress)
            for m in self.members
        ]

        def stack(key: str) -> Tensor:  # (M, ...)
            return torch.stack([o[key].detach() for o in outs])

        energy = stack(keys.ENERGY)  # (M, n_graphs)
        atomic = stack(keys.ATOMIC_ENERGIES)  # (M, n_atoms)
        result = {keys.ENERGY: energy.mean(0), keys.ATOMIC_ENERGIES: atomic.mean(0)}
        with_unc = UncertaintyMode(uncertainty) is not UncertaintyMode.NONE
        if with_unc:
            epistemic = energy.var(0, unbiased=False)
            aleatoric = self.noise_variances(batch)[keys.ENERGY].detach()
            result.update(
                {
                    keys.ENERGY_EPISTEMIC_VAR: epistemic,
                    keys.ENERGY_ALEATORIC_VAR: aleatoric,
                    keys.ENERGY_VAR: epistemic + aleatoric,
                    keys.LOCAL_ENERGY_VAR: atomic.var(0, unbiased=False),
                }
            )
        for wanted, key, var_key in (
            (compute_forces, keys.FORCES, keys.FORCES_VAR),  # (M, n_atoms, 3)
            (compute_stress, keys.STRESS, keys.STRESS_VAR),  # (M, n_graphs, 3, 3)
        ):
            if wanted:
                values = stack(key)
                result[key] = values.mean(0)
                if with_unc:
                    result[var_key] = values.var(0, unbiased=False)
        return result
