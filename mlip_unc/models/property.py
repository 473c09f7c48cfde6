"""Molecular property regression: GIN backbone + (Bayesian) head + Gaussian noise.

As defined in docs/method.md section 2 of this project: the backbone maps a molecular graph
to a latent z (n_graphs, d); the head maps z to the target. Every model reports the
predictive mean and three variances, in the units of the targets::

    PREDICTION_VAR = EPISTEMIC_VAR + ALEATORIC_VAR

Targets are standardised with the training mean and std (buffers ``y_mean``, ``y_std``) for
training; :meth:`PropertyModel.predict` un-standardises (means shifted and scaled, variances
scaled by std^2).

Methods (:func:`mlip_unc.models.factory.build_model` picks the class from the config's
``method``):
    bgnn / agl    ``BayesianLinear`` head, closed-form predictive (no sampling)
    fullbnn       ``BayesianMLP`` head, Monte Carlo predictive
    mcdropout, ensemble, mve, laplace   see :mod:`mlip_unc.models.baselines`

This module holds what every method shares (the standardisation, :class:`PropertyModel`, the
builders of its parts, batched prediction and calibration); :mod:`mlip_unc.models.baselines`
builds on it and :mod:`mlip_unc.models.factory` sits above both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data import Batch, Data

from mlip_unc import keys
from mlip_unc.config import Intervention, PropertyConfig
from mlip_unc.nn.bayesian import BayesianLinear, BayesianMLP
from mlip_unc.nn.gin import ATOM_VOCAB, BOND_VOCAB, MolecularGIN
from mlip_unc.nn.likelihood import make_noise
from mlip_unc.nn.rotation import RandomRotation

__all__ = [
    "CHECKPOINT_KIND",
    "StandardisedModel",
    "PropertyModel",
    "make_backbone",
    "make_noise_module",
    "make_rotation",
    "apply_calibration",
    "feature_metadata",
    "predict_graphs",
]

CHECKPOINT_KIND = "property"
_MC_SEED = 0  # Monte Carlo predictions are reproducible: a local generator with a fixed seed


def feature_metadata() -> dict[str, Any]:
    """What the backbone expects of its input graphs (stored in checkpoints)."""
    return {
        "featurizer": "torch_geometric.utils.from_smiles",
        "atom_vocab": list(ATOM_VOCAB),
        "bond_vocab": list(BOND_VOCAB),
    }


class _PredictiveHead(Protocol):
    """A head with predictive moments ``(mean, epistemic var)``, each ``(n, out)``
    (``BayesianLinear``, ``DeterministicHead``, ``LaplaceHead``)."""

    def predictive(self, z: Tensor) -> tuple[Tensor, Tensor]: ...


class StandardisedModel(nn.Module):
    """Holds the target standardisation; subclasses implement ``predictive`` in standard units.

    Subclasses provide ``forward(batch, *, generator) -> dict`` (training outputs: LATENT,
    PREDICTION — one posterior draw when training — and ALEATORIC_VAR), ``kl()`` and
    ``predictive(batch, *, generator) -> dict`` (PREDICTION, EPISTEMIC_VAR, ALEATORIC_VAR,
    PREDICTION_VAR, LATENT; standardised units).
    """

    y_mean: Tensor
    y_std: Tensor

    if TYPE_CHECKING:  # the subclasses' contract (class docstring)

        def predictive(
            self, batch: Batch, *, generator: torch.Generator | None = None
        ) -> dict[str, Tensor]: ...

    def __init__(
        self,
        n_targets: int,
        y_mean: Tensor | None = None,
        y_std: Tensor | None = None,
        *,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.n_targets = n_targets
        dtype = dtype or torch.get_default_dtype()
        mean = (
            torch.zeros(n_targets) if y_mean is None else torch.as_tensor(y_mean).reshape(n_targets)
        )
        std = torch.ones(n_targets) if y_std is None else torch.as_tensor(y_std).reshape(n_targets)
        mean, std = mean.to(dtype), std.to(dtype)
        if bool((std <= 0).any()):
            raise ValueError(
                "target std must be positive (a constant target cannot be standardised)"
            )
        self.register_buffer("y_mean", mean.clone())
        self.register_buffer("y_std", std.clone())

    def standardise(self, y: Tensor) -> Tensor:
        """Targets (n, n_targets) -> standard units, in the model's dtype."""
        return (y.to(self.y_mean.dtype) - self.y_mean) / self.y_std

    def kl(self) -> Tensor:
        return self.y_mean.new_zeros(())

    def post_fit(self, graphs: Sequence[Data]) -> None:
        """Hook run once after training, given the training graphs (last-layer Laplace)."""

    @property
    def bayes_head(self) -> BayesianLinear | None:
        """The Bayesian last layer (for latent regularisers and posterior statistics), if any."""
        return None

    @torch.no_grad()
    def predict(
        self, batch: Batch, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        """Predictive moments in target units (call in eval mode)."""
        out = self.predictive(batch, generator=generator)
        scale2 = self.y_std**2
        result = {
            keys.PREDICTION: out[keys.PREDICTION] * self.y_std + self.y_mean,
            keys.EPISTEMIC_VAR: out[keys.EPISTEMIC_VAR] * scale2,
            keys.ALEATORIC_VAR: out[keys.ALEATORIC_VAR] * scale2,
        }
        result[keys.PREDICTION_VAR] = result[keys.EPISTEMIC_VAR] + result[keys.ALEATORIC_VAR]
        result[keys.LATENT] = out[keys.LATENT]
        return result


class PropertyModel(StandardisedModel):
    """Backbone -> optional rotation Q -> head, plus a noise module; one latent per graph.

    ``LATENT`` in the outputs is the head's input (Q z under the rotation intervention).

    Shapes:
        - **input:** a PyG ``Batch`` of ``from_smiles`` graphs
        - **output:** dict of ``(n_graphs, n_targets)`` tensors and LATENT ``(n_graphs, d)``
    """

    def __init__(
        self,
        backbone: MolecularGIN,
        head: nn.Module,
        noise: nn.Module,
        *,
        n_targets: int = 1,
        y_mean: Tensor | None = None,
        y_std: Tensor | None = None,
        rotation: nn.Module | None = None,
        mc_samples: int = 50,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__(n_targets, y_mean, y_std, dtype=dtype)
        self.backbone, self.head, self.noise = backbone, head, noise
        self.rotation = rotation
        self.mc_samples = mc_samples

    @property
    def bayes_head(self) -> BayesianLinear | None:
        return self.head if isinstance(self.head, BayesianLinear) else None

    def latent(self, batch: Batch) -> Tensor:
        z = self.backbone(
            batch[keys.NODE_FEATURES],
            batch[keys.EDGE_INDEX],
            edge_attr=batch[keys.EDGE_FEATURES],
            batch=batch[keys.BATCH],
        )
        return z if self.rotation is None else self.rotation(z)

    def kl(self) -> Tensor:
        kl = getattr(self.head, "kl", None)
        return super().kl() if kl is None else kl()

    def forward(
        self, batch: Batch, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        z = self.latent(batch)
        if isinstance(self.head, (BayesianLinear, BayesianMLP)):
            pred = self.head(z, generator=generator)  # one draw per example in training mode
        else:
            pred = self.head(z)
        return {keys.LATENT: z, keys.PREDICTION: pred, keys.ALEATORIC_VAR: self.noise(z)}

    def predictive(
        self, batch: Batch, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        z = self.latent(batch)
        if isinstance(self.head, BayesianMLP):
            gen = generator or torch.Generator(device=z.device).manual_seed(_MC_SEED)
            mean, epi = self.head.predictive(z, n_samples=self.mc_samples, generator=gen)
        else:
            mean, epi = cast(_PredictiveHead, self.head).predictive(z)
        alea = self.noise(z)
        return {
            keys.PREDICTION: mean,
            keys.EPISTEMIC_VAR: epi,
            keys.ALEATORIC_VAR: alea,
            keys.PREDICTION_VAR: epi + alea,
            keys.LATENT: z,
        }


def make_backbone(config: PropertyConfig) -> MolecularGIN:
    """The GIN backbone of ``config.model`` (parameters drawn from torch's global RNG)."""
    m = config.model
    return MolecularGIN(
        m.hidden,
        m.layers,
        m.latent_dim,
        pooling=m.pooling,
        dropout=m.dropout,
        norm=m.norm,
        dtype=config.train.dtype.torch,
    )


def make_noise_module(config: PropertyConfig, n_targets: int) -> nn.Module:
    """The aleatoric noise module of ``config.model.likelihood`` for ``n_targets`` targets."""
    m = config.model
    return make_noise(
        m.likelihood,
        m.latent_dim,
        n_targets,
        init_std=m.noise_init_std,
        dtype=config.train.dtype.torch,
    )


def make_rotation(config: PropertyConfig) -> nn.Module | None:
    """The rotation intervention Q z when ``config.train.intervention`` asks for it, else None."""
    if config.train.intervention is not Intervention.ROTATION:
        return None
    return RandomRotation(
        config.model.latent_dim, seed=config.train.seed, dtype=config.train.dtype.torch
    )


# ---------------------------------------------------------------------- prediction
@torch.no_grad()
def predict_graphs(
    model: StandardisedModel, graphs: Sequence[Data], *, batch_size: int = 256, latent: bool = False
) -> dict[str, Tensor]:
    """Predictive moments of ``graphs`` in target units, concatenated: ``(n, n_targets)`` each.

    The model is put in eval mode (its mode is restored afterwards). With ``latent=True`` the
    head inputs LATENT ``(n, d)`` are returned too. Batches go to the model's device; the
    results come back on the CPU.
    """
    was_training = model.training
    model.eval()
    parts: dict[str, list[Tensor]] = {}
    try:
        graphs = list(graphs)
        for start in range(0, len(graphs), batch_size):
            batch = Batch.from_data_list(graphs[start : start + batch_size]).to(model.y_mean.device)
            out = model.predict(batch)
            for key, value in out.items():
                if key != keys.LATENT or latent:
                    parts.setdefault(key, []).append(value.cpu())
    finally:
        model.train(was_training)
    return {key: torch.cat(values) for key, values in parts.items()}


def apply_calibration(calibrators: list[Any] | None, **arrays: np.ndarray) -> dict[str, np.ndarray]:
    """Rescale ``std``, ``epistemic_std``, ``aleatoric_std`` (n, n_targets) per target column."""
    if not calibrators:
        return arrays
    std = arrays["std"]
    new = np.column_stack([np.asarray(c.transform(std[:, t])) for t, c in enumerate(calibrators)])
    ratio = np.divide(new, std, out=np.ones_like(new), where=std > 0)
    return {
        **arrays,
        "std": new,
        "epistemic_std": arrays["epistemic_std"] * ratio,
        "aleatoric_std": arrays["aleatoric_std"] * ratio,
    }
