"""Property models from configs: :func:`build_model` and the trained-model facade :class:`PropertyPredictor`.

Sits above :mod:`mlip_unc.models.property` (shared base classes and part builders) and
:mod:`mlip_unc.models.baselines` (which builds on property), so neither of the two imports
the other's caller. ``build_model`` picks the class from ``config.model.method``:

    bgnn / agl    :class:`~mlip_unc.models.property.PropertyModel` with a ``BayesianLinear`` head
    fullbnn       :class:`~mlip_unc.models.property.PropertyModel` with a ``BayesianMLP`` head
    mcdropout, ensemble, mve, laplace   :func:`mlip_unc.models.baselines.build_baseline`
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.config import Method, PropertyConfig
from mlip_unc.models.baselines import build_baseline
from mlip_unc.models.checkpoint import CheckpointError, load_checkpoint
from mlip_unc.models.property import (
    CHECKPOINT_KIND,
    PropertyModel,
    StandardisedModel,
    apply_calibration,
    make_backbone,
    make_noise_module,
    make_rotation,
    predict_graphs,
)
from mlip_unc.nn.bayesian import BayesianLinear, BayesianMLP

__all__ = ["TRAIN_ELEMENTS_KEY", "build_model", "PropertyPredictor", "molecule_elements"]

#: metadata key of a property checkpoint: the atomic numbers its training molecules held
TRAIN_ELEMENTS_KEY = "train_elements"


def molecule_elements(graphs: Sequence[Data]) -> list[set[int]]:
    """Atomic numbers of each molecule graph (:func:`~mlip_unc.data.molecules.smiles_to_graph`:
    column 0 of the ``from_smiles`` atom features; implicit hydrogens are not atoms there)."""
    return [{int(z) for z in graph.x[:, 0].tolist()} for graph in graphs]


def build_model(
    config: PropertyConfig,
    *,
    n_targets: int = 1,
    y_mean: Tensor | None = None,
    y_std: Tensor | None = None,
) -> StandardisedModel:
    """The model for ``config.model.method`` (parameters drawn from torch's global RNG)."""
    m, dtype = config.model, config.train.dtype.torch
    head: BayesianLinear | BayesianMLP
    if m.method in (Method.BGNN, Method.AGL):
        head = BayesianLinear(
            m.latent_dim,
            n_targets,
            prior_std=m.prior_std,
            init_std=m.init_std,
            estimator=m.estimator,
            dtype=dtype,
        )
    elif m.method is Method.FULLBNN:
        head = BayesianMLP(
            m.latent_dim,
            m.fullbnn_hidden,
            n_targets,
            prior_std=m.prior_std,
            init_std=m.init_std,
            estimator=m.estimator,
            dtype=dtype,
        )
    else:
        return build_baseline(config, n_targets=n_targets, y_mean=y_mean, y_std=y_std, dtype=dtype)
    return PropertyModel(
        make_backbone(config),
        head,
        make_noise_module(config, n_targets),
        rotation=make_rotation(config),
        mc_samples=m.mc_samples,
        n_targets=n_targets,
        y_mean=y_mean,
        y_std=y_std,
        dtype=dtype,
    )


@dataclass
class PropertyPredictor:
    """A trained model with its config, metadata and validation-fitted std calibrators.

    ``predict(graphs)`` returns numpy arrays ``(n, n_targets)``: ``mean``, ``std``,
    ``epistemic_std``, ``aleatoric_std``. A calibrator rescales the total std; epistemic and
    aleatoric stds are rescaled by the same factor, so their squares still add up.
    """

    model: StandardisedModel
    config: PropertyConfig
    metadata: dict[str, Any] = field(default_factory=dict)
    calibrators: list[Any] | None = None

    @classmethod
    def load(cls, path: str | Path) -> PropertyPredictor:
        """From ``DIR/model.pt`` (or the folder holding it); raises CheckpointError on bad files."""
        path = Path(path)
        if path.is_dir():
            path = path / "model.pt"
        payload = load_checkpoint(path, kind=CHECKPOINT_KIND)
        try:
            config = PropertyConfig.from_dict(payload["config"])
            meta = dict(payload.get("metadata", {}))
            norm = payload["normalization"]
            model = build_model(
                config,
                n_targets=int(meta["n_targets"]),
                y_mean=torch.tensor(norm["mean"]),
                y_std=torch.tensor(norm["std"]),
            )
            model.load_state_dict(payload["model_state"])
        except (KeyError, TypeError, ValueError, RuntimeError) as err:
            raise CheckpointError(f"{path} is not a usable property model: {err}") from None
        calibrators = None
        if payload.get("calibration"):
            from mlip_unc.uncertainty.recalibration import calibrator_from_state_dict

            calibrators = [calibrator_from_state_dict(d) for d in payload["calibration"]]
        return cls(model.eval(), config, meta, calibrators)

    def unseen_elements(self, graphs: Sequence[Data]) -> list[list[str]] | None:
        """Per molecule, the symbols of its elements that no training molecule held.

        The model's stds do not grow for them (a molecule with Si or Cl, trained on C, H, O,
        can get the epistemic std of one it knows), so such predictions are extrapolations that
        the std does not flag. ``None`` for a checkpoint that does not record its training
        elements (``metadata["train_elements"]``, written by training since it was added).
        """
        from ase.data import chemical_symbols

        seen = self.metadata.get(TRAIN_ELEMENTS_KEY)
        if seen is None:
            return None
        known = {int(z) for z in seen}
        return [
            [chemical_symbols[z] for z in sorted(elements - known)]
            for elements in molecule_elements(graphs)
        ]

    def predict(self, graphs: Sequence[Data], *, batch_size: int = 256) -> dict[str, np.ndarray]:
        out = predict_graphs(self.model, graphs, batch_size=batch_size)
        mean = out[keys.PREDICTION].double().cpu().numpy()
        std = out[keys.PREDICTION_VAR].double().clamp_min(0).sqrt().cpu().numpy()
        epi = out[keys.EPISTEMIC_VAR].double().clamp_min(0).sqrt().cpu().numpy()
        alea = out[keys.ALEATORIC_VAR].double().clamp_min(0).sqrt().cpu().numpy()
        return apply_calibration(
            self.calibrators, mean=mean, std=std, epistemic_std=epi, aleatoric_std=alea
        )
