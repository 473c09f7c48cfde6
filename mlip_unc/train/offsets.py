"""Per-element energy offsets refitted after training (``model.refit_offsets``).

Forces and stress do not depend on a constant energy per element, so the force term of the loss
leaves the offsets' direction free and only the (weakly weighted) energy term holds it. With a
learned energy noise that hold can give way: the noise grows with the energy error, which
weakens the pull further (docs/what-we-tried.md, "Gradient clipping and the energy offset").
The cure is closed form: the least-squares shift of the offsets ``b``
that best fits the training energies, ``min ||C db - (E - E_pred)||`` with ``C`` the
``(n_frames, n_types)`` element counts (the minimum-norm ``db`` when ``C`` is rank-deficient,
e.g. one composition). Forces, stress and every epistemic variance are unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.models.derivatives import atom_types
from mlip_unc.models.devices import to_device
from mlip_unc.models.potential import BayesianPotential

__all__ = ["element_counts", "refit_energy_offsets"]


def element_counts(model: BayesianPotential, graphs: Sequence[Any]) -> np.ndarray:
    """``(n_frames, n_types)`` atoms of each of the model's elements per graph."""
    n_types = len(model.type_map)
    z_to_index = model.z_to_index.cpu()  # the graphs stay on the CPU
    return np.stack(
        [
            np.bincount(atom_types(g, z_to_index, model.type_map).cpu().numpy(), minlength=n_types)
            for g in graphs
        ]
    ).astype(np.float64)


def refit_energy_offsets(
    model: BayesianPotential, graphs: Sequence[Any], *, batch_size: int = 16
) -> np.ndarray | None:
    """Shift ``model.atomic_energies`` in place by the least-squares fit of the energy residuals
    of ``graphs`` (those with an energy label) on their element counts.

    Returns the shifts ``(n_types,)`` in eV, or None when no graph has an energy.
    """
    device = model.atomic_energies.device
    pred, true, has = [], [], []
    with torch.no_grad():  # energies only: no force pass
        for k in range(0, len(graphs), batch_size):
            chunk = [
                graphs[i] for i in range(k, min(k + batch_size, len(graphs)))
            ]  # lists and on-disk sets alike
            batch = to_device(Batch.from_data_list(chunk), device)
            pred.append(
                model(batch, compute_forces=False)[keys.ENERGY].double().cpu()
            )  # posterior mean
            true.append(batch[keys.ENERGY].double().cpu())
            has.append(batch[keys.HAS_ENERGY].reshape(-1).bool().cpu())
    mask = torch.cat(has).numpy()
    if not mask.any():
        return None
    counts = element_counts(model, graphs)[mask]  # (n, n_types)
    residual = (torch.cat(true) - torch.cat(pred)).numpy()[mask]  # (n,) eV
    delta = np.linalg.lstsq(counts, residual, rcond=None)[0]  # (n_types,)
    with torch.no_grad():
        model.atomic_energies += torch.as_tensor(
            delta, dtype=model.atomic_energies.dtype, device=model.atomic_energies.device
        )
    return delta
