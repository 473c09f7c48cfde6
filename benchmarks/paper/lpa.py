"""The latent-posterior alignment study: variants, training, and one trained model -> one record.

As defined in docs/method.md sections 2 and 4-7 of this project (not the paper's code). The
study trains the Bayesian GIN property model (``bgnn``) on nested training fractions and
compares it with alignment-guided learning (``agl``) and the LPA-breaking interventions
(``isotropy``, ``anti``, ``rotation``), the latter also with the Bayesian last layer frozen
to the posterior of the ``bgnn`` run of the same seed and fraction (``<intervention>_frozen``),
so that only the latent geometry differs.

Data flow: :func:`variant_config` -> :func:`fit_property_model` (the project's ``Trainer``)
-> :func:`study_record` (a flat dict of floats, JSON-ready) -> :mod:`benchmarks.paper.report`.

Units: predictive stds, RMSE and NLL are in target units; the LPA quantities
(``z^T S z``, ``||z||^2``, ``s``, ``kappa``, ``A``) are in the model's standardised units
(the head works on targets divided by the training std ``y_scale``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.config import Intervention, Method, PropertyConfig, RegularizerKind
from mlip_unc.models.property import StandardisedModel, predict_graphs
from mlip_unc.train.property import freeze_posterior_from, property_trainer, seeded_model
from mlip_unc.train.task import FitResult
from mlip_unc.uncertainty import alignment as alignment
from mlip_unc.uncertainty import density as density
from mlip_unc.uncertainty.calibration import regression_metrics

__all__ = [
    "VARIANTS",
    "INTERVENTIONS",
    "VariantSpec",
    "RECORD_KEYS",
    "variant_config",
    "fit_property_model",
    "study_record",
]


# ====================================================================== variants
@dataclass(frozen=True)
class VariantSpec:
    """How one study variant differs from the plain ``bgnn`` configuration."""

    method: Method
    intervention: Intervention | None = None
    frozen: bool = False
    """Train with the Bayesian last layer frozen to the ``bgnn`` posterior (same seed, fraction)."""


INTERVENTIONS: tuple[str, ...] = ("isotropy", "anti", "rotation")
VARIANTS: dict[str, VariantSpec] = {
    "bgnn": VariantSpec(Method.BGNN),
    "agl": VariantSpec(Method.AGL),
    **{iv: VariantSpec(Method.BGNN, Intervention(iv)) for iv in INTERVENTIONS},
    **{
        f"{iv}_frozen": VariantSpec(Method.BGNN, Intervention(iv), frozen=True)
        for iv in INTERVENTIONS
    },
}
"""Study variants by name; ``<intervention>_frozen`` needs the ``bgnn`` model of its seed and fraction."""


def variant_config(base: PropertyConfig, variant: str, seed: int) -> PropertyConfig:
    """``base`` with the method, intervention and seed of ``variant`` (see :data:`VARIANTS`).

    ``agl`` keeps ``base``'s AGL form when ``base.train.regularizer`` is an ``agl_*`` term
    (otherwise the config's default, the mean form).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {list(VARIANTS)}")
    spec = VARIANTS[variant]
    agl = spec.method is Method.AGL and base.train.regularizer.startswith("agl_")
    reg = base.train.regularizer if agl else RegularizerKind.NONE
    train = base.train.updated(seed=seed, regularizer=reg, intervention=spec.intervention)
    model = base.model.updated(method=spec.method)
    return PropertyConfig(model=model, train=train)


def fit_property_model(
    config: PropertyConfig,
    train: Sequence[Data],
    val: Sequence[Data],
    *,
    freeze_posterior: str | Path | None = None,
    keep: str = "last",
) -> tuple[StandardisedModel, FitResult]:
    """Build and train a property model in memory with the project's ``Trainer``.

    The same steps as ``mlip_unc.train.property.train_property_model`` (seed, target
    standardisation on ``train``, ``build_model``, optional ``freeze_posterior_from``,
    the training core's ``fit``) without writing files, and with the choice of the returned weights:
    ``keep="last"`` (the final epoch: a fixed training budget, so the AGL and intervention
    terms, which start after a warm-up, are in effect) or ``"best"`` (the trainer's best
    validation epoch).
    """
    if keep not in ("last", "best"):
        raise ValueError(f"keep must be 'last' or 'best', got {keep!r}")
    model = seeded_model(config, train)  # the caller's RNG untouched
    if freeze_posterior is not None:
        freeze_posterior_from(model, freeze_posterior)
    last: dict[str, Any] = {}

    def remember_last(epoch: int, record: dict[str, Any]) -> None:
        if epoch + 1 == config.train.epochs:
            last["state"] = copy.deepcopy(model.state_dict())

    trainer = property_trainer(model, config, train, val)
    result = trainer.fit(callbacks=[remember_last] if keep == "last" else ())
    if keep == "last" and "state" in last:  # absent after an early stop: the best epoch is kept
        model.load_state_dict(last["state"])
    return model.eval(), result


# ====================================================================== one record
RECORD_KEYS: tuple[str, ...] = (
    # accuracy and calibration (target units, total predictive std)
    "rmse",
    "mae",
    "nll",
    "spearman",
    "miscalibration_area",
    "ence",
    "coverage_95",
    "crps",
    "sharpness",
    "mean_std",
    "mean_epistemic_std",
    "mean_aleatoric_std",
    # posterior and LPA (standardised units)
    "kl",
    "kl_per_n",
    "mean_u",
    "mean_norm2",
    "mean_s2",
    "mean_s",
    "mean_kappa",
    "median_alignment",
    "n_alignment",
    "rho_lpa",
    "low_variance_fraction",
    "effective_rank",
    "mean_log_norm2",
    "log_mean_s2",
    "mean_log_kappa",
    "log_y_scale2",
    "y_scale",
    # structural calibration
    "struct_cal_knn",
    "struct_cal_tanimoto",
)
"""Numeric keys of :func:`study_record` (besides ``n_train``, ``n_test``)."""


def _targets(graphs: Sequence[Data]) -> np.ndarray:
    return torch.cat([g[keys.TARGET] for g in graphs]).double().numpy()[:, 0]


def _mean_logs(z: torch.Tensor, s2: torch.Tensor) -> dict[str, float]:
    """Per-point means of the logs of the three-factor split (points with z = 0 dropped)."""
    names = ("mean_log_norm2", "log_mean_s2", "mean_log_kappa")
    return dict(
        zip(names, alignment.mean_log_factors(alignment.three_factor_split(z, s2)), strict=False)
    )


@torch.no_grad()
def study_record(
    model: StandardisedModel,
    train: Sequence[Data],
    test: Sequence[Data],
    *,
    min_abs_mean_rel: float = 0.1,
    knn_k: int = 10,
    keep_points: bool = False,
) -> dict[str, Any]:
    """Everything the study reports about one trained model with a Bayesian last layer.

    Keys (see :data:`RECORD_KEYS`): ``regression_metrics`` of the test set (total std),
    ``mean_std`` / ``mean_epistemic_std`` / ``mean_aleatoric_std``; ``kl`` (KL(q||p) of the
    head) and ``kl_per_n`` (divided by ``n_train``, the ELBO's term); ``lpa_summary`` of the
    test latents against the head's posterior (``median_alignment`` over the ``n_alignment``
    points with ``|m| > alignment_threshold``, ``m = mu^T z``, the threshold being
    ``min_abs_mean_rel`` times the root mean square of ``m`` over the test set);
    ``mean_log_norm2``, ``log_mean_s2``, ``mean_log_kappa`` and ``log_y_scale2`` (their sum is
    the mean log of the latent part of the epistemic variance in target units);
    ``struct_cal_knn`` = Spearman(epistemic std, latent kNN distance to the training latents,
    ``k = min(knn_k, n_train)``) and ``struct_cal_tanimoto`` = Spearman(epistemic std, 1 - max
    Morgan-Tanimoto similarity to the training molecules); positive = the std grows where the
    training data are sparse. With ``keep_points`` the per-point test arrays are added under
    ``points``.
    """
    head = model.bayes_head
    if head is None:
        raise ValueError("the study needs a model with a Bayesian last layer (bgnn/agl)")
    if head.weight_mu.shape[0] != 1:
        raise ValueError("the study handles one target")
    out = predict_graphs(model, test, latent=True)
    z_train = predict_graphs(model, train, latent=True)[keys.LATENT]
    z = out[keys.LATENT].double()
    mu, s2 = head.weight_mu[0].detach().double(), head.weight_var[0].detach().double()
    y = _targets(test)
    mean = out[keys.PREDICTION].double().numpy()[:, 0]
    std = out[keys.PREDICTION_VAR].double().clamp_min(0).sqrt().numpy()[:, 0]
    epi = out[keys.EPISTEMIC_VAR].double().clamp_min(0).sqrt().numpy()[:, 0]
    alea = out[keys.ALEATORIC_VAR].double().clamp_min(0).sqrt().numpy()[:, 0]

    rec: dict[str, Any] = {"n_train": len(train), "n_test": len(test)}
    rec.update(regression_metrics(mean, std, y, nan_policy="omit"))
    rec.update(
        mean_std=float(std.mean()),
        mean_epistemic_std=float(epi.mean()),
        mean_aleatoric_std=float(alea.mean()),
    )
    kl = float(model.kl())
    rec.update(kl=kl, kl_per_n=kl / len(train))
    m = z @ mu  # (n_test,)
    threshold = min_abs_mean_rel * float(m.pow(2).mean().sqrt())
    rec.update(alignment.lpa_summary(z, mu, s2, min_abs_mean=threshold))
    rec["n_alignment"] = int(torch.isfinite(alignment.alignment_index(z, mu, s2, threshold)).sum())
    rec["alignment_threshold"] = threshold
    rec.update(_mean_logs(z, s2))
    y_scale = float(model.y_std[0])
    rec.update(y_scale=y_scale, log_y_scale2=2.0 * math.log(y_scale))

    knn = density.latent_knn_distance(z, z_train.double(), k=min(knn_k, len(train)))
    tanimoto = density.tanimoto_max_similarity(
        [g[keys.SMILES] for g in test], [g[keys.SMILES] for g in train]
    )
    rec["struct_cal_knn"] = density.structural_calibration(epi, knn)
    rec["struct_cal_tanimoto"] = density.structural_calibration(epi, 1.0 - tanimoto)
    if keep_points:
        rec["points"] = {
            "y_true": y.tolist(),
            "mean": mean.tolist(),
            "std": std.tolist(),
            "epistemic_std": epi.tolist(),
            "knn_distance": knn.tolist(),
            "one_minus_tanimoto": (1.0 - tanimoto).tolist(),
        }
    return rec
