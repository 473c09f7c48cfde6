"""Training of molecular property models: the batch -> loss step on the training core.

Per mini-batch (docs/method.md section 2 of this project)::

    loss = mean NLL + kl_weight(epoch) * KL / N_train + lambda(epoch) * R(z, mu, S)

with N_train the number of training molecules and R the optional latent regulariser
(``mlip_unc.train.regularizers``). Each epoch logs the NLL, the KL term, the regulariser,
validation RMSE/NLL (target units), lambda, the effective rank of the validation latents and
the mean posterior std of the Bayesian last layer. The loop, schedule, early stopping and
resume are :mod:`mlip_unc.train.core`'s (``out/last.pt``, ``out/history.json``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.config import PropertyConfig, RegularizerKind, StopMetric
from mlip_unc.models.checkpoint import (
    FORMAT_VERSION,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from mlip_unc.models.factory import (
    TRAIN_ELEMENTS_KEY,
    PropertyPredictor,
    build_model,
    molecule_elements,
)
from mlip_unc.models.property import (
    CHECKPOINT_KIND,
    StandardisedModel,
    feature_metadata,
    predict_graphs,
)
from mlip_unc.train import distributed
from mlip_unc.train.core import EpochCallback, FitResult, Step, Trainer
from mlip_unc.train.losses import gaussian_nll, kl_weight, negative_elbo
from mlip_unc.train.property_data import prepare_property_data
from mlip_unc.train.regularizers import LambdaSchedule, regularizer_term
from mlip_unc.uncertainty.alignment import effective_rank
from mlip_unc.uncertainty.calibration import regression_metrics
from mlip_unc.uncertainty.recalibration import (
    IdentityCalibrator,
    calibrator_from_state_dict,
    make_calibrator,
)
from mlip_unc.uncertainty.sample_size import MIN_CALIBRATION_SIZE, too_few

__all__ = [
    "PropertyTask",
    "seeded_model",
    "property_trainer",
    "train_property_model",
    "run_property_training",
    "prediction_metrics",
    "target_statistics",
    "freeze_posterior_from",
    "model_payload",
    "recalibration_summary",
]

log = logging.getLogger(__name__)


def model_payload(
    model: StandardisedModel,
    config: PropertyConfig,
    metadata: dict[str, Any],
    *,
    calibration: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The weights-only dict of a trained property model (``DIR/model.pt``)."""
    return {
        "kind": CHECKPOINT_KIND,
        "format_version": FORMAT_VERSION,
        "config": config.to_dict(),
        "metadata": metadata,
        "normalization": {"mean": model.y_mean.tolist(), "std": model.y_std.tolist()},
        "model_state": model.state_dict(),
        "calibration": calibration,
    }


def freeze_posterior_from(model: StandardisedModel, path: str | os.PathLike) -> None:
    """Copy the Bayesian last layer's posterior from a checkpoint and freeze it.

    Used by the intervention study: the latents are trained under a fixed (baseline) posterior.
    """
    head = model.bayes_head
    if head is None:
        raise ValueError("--freeze-posterior-from needs a Bayesian last layer (bgnn/agl)")
    state = load_checkpoint(path).get("model_state", {})
    try:
        with torch.no_grad():
            for n, p in head.named_parameters():
                p.copy_(state[f"head.{n}"].to(p.dtype))
    except (KeyError, RuntimeError) as err:
        raise CheckpointError(f"{path} holds no compatible Bayesian last layer ({err})") from None
    for p in head.parameters():
        p.requires_grad_(False)


def target_statistics(graphs: Sequence[Data]) -> tuple[Tensor, Tensor]:
    """Per-target mean and std (population, NaN-ignoring) of the training targets."""
    y = torch.cat([g[keys.TARGET] for g in graphs]).double()  # (n, n_targets)
    mask = ~torch.isnan(y)
    count = mask.sum(0).clamp_min(1)
    mean = torch.where(mask, y, 0.0).sum(0) / count
    var = torch.where(mask, (y - mean) ** 2, 0.0).sum(0) / count
    std = var.sqrt()
    return mean, torch.where(std > 0, std, torch.ones_like(std))


def seeded_model(config: PropertyConfig, train: Sequence[Data]) -> StandardisedModel:
    """``build_model`` with targets standardised on ``train`` and weights drawn from
    ``config.train.seed`` (torch's global RNG is forked, not reseeded)."""
    mean, std = target_statistics(train)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.train.seed)
        return build_model(
            config, n_targets=int(train[0][keys.TARGET].shape[-1]), y_mean=mean, y_std=std
        )


@dataclass
class PropertyTask:
    """The property model's step and validation for :class:`~mlip_unc.train.core.Trainer`."""

    model: StandardisedModel
    config: PropertyConfig
    train_graphs: Sequence[Data]
    val_graphs: Sequence[Data]

    def __post_init__(self) -> None:
        if not self.train_graphs or not self.val_graphs:
            raise ValueError("training and validation sets must not be empty")
        cfg = self.config.train
        self.metric_key = "val_nll" if cfg.stop_metric is StopMetric.NLL else "val_rmse"
        self.reg_kind = cfg.regularizer_kind
        self.lam = LambdaSchedule(cfg.reg_warmup, cfg.reg_ramp, cfg.reg_lambda)

    def train_data(self) -> Sequence[Data]:
        return self.train_graphs

    def loss(self, batch: Any, step: Step) -> tuple[Tensor, dict[str, float]]:
        cfg, model = self.config.train, self.model
        out = model(batch, generator=step.generator)
        y = model.standardise(batch[keys.TARGET])
        nll = gaussian_nll(out[keys.PREDICTION], out[keys.ALEATORIC_VAR], y)
        beta = kl_weight(step.epoch, beta=cfg.beta, warmup_epochs=cfg.kl_anneal_epochs)
        loss, kl_part = negative_elbo(nll, model.kl(), n_train=len(self.train_graphs), beta=beta)
        lam = self.lam(step.epoch) if self.reg_kind is not RegularizerKind.NONE else 0.0
        reg = loss.new_zeros(())
        if lam > 0.0:
            head = model.bayes_head
            mu = head.weight_mu[0] if head is not None else None
            s2 = head.weight_var[0] if head is not None else None
            reg = regularizer_term(self.reg_kind, out[keys.LATENT], mu, s2)
            loss = loss + lam * reg
        return loss, {
            "nll": float(nll.detach()),
            "kl": float(kl_part.detach()),
            "reg": float(reg.detach()),
            "beta": beta,
            "lambda": lam,
        }

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Validation RMSE and Gaussian NLL in target units, effective rank of z, mean s."""
        graphs = self.val_graphs
        out = predict_graphs(self.model, graphs, latent=True)
        y = torch.cat([g[keys.TARGET] for g in graphs]).to(out[keys.PREDICTION].dtype)
        mask = ~torch.isnan(y)
        err = (out[keys.PREDICTION] - y)[mask]
        head = self.model.bayes_head
        return {
            "val_rmse": float(err.pow(2).mean().sqrt()),
            "val_nll": float(
                gaussian_nll(out[keys.PREDICTION], out[keys.PREDICTION_VAR].clamp_min(1e-12), y)
            ),
            "val_mean_std": float(out[keys.PREDICTION_VAR].sqrt().mean()),
            "val_mean_epistemic_std": float(out[keys.EPISTEMIC_VAR].clamp_min(0).sqrt().mean()),
            "effective_rank": effective_rank(out[keys.LATENT]) if len(graphs) > 1 else float("nan"),
            "mean_s": float(head.weight_std.mean()) if head is not None else float("nan"),
            "kl_total": float(self.model.kl()),
        }

    def on_end(self) -> None:
        """After the best weights are loaded: post-hoc fits (the last-layer Laplace posterior)."""
        self.model.post_fit(self.train_graphs)

    def signature(self) -> dict[str, Any]:
        """The config without the progress flag, the device and the data's source (the data
        is checked by its size, as in runs from before the ``data`` section): a resumed run
        must use the same."""
        cfg = self.config.to_dict()
        cfg["train"].pop("progress", None)
        cfg["train"].pop("device", None)
        cfg.pop("data", None)
        cfg.pop("data_root", None)
        if cfg["train"].get("schedule_clock") == "epochs":  # the default: runs from before it match
            cfg["train"].pop("schedule_clock")
        return {"kind": CHECKPOINT_KIND, "config": cfg, "n_train": len(self.train_graphs)}


def property_trainer(
    model: StandardisedModel,
    config: PropertyConfig,
    train: Sequence[Data],
    val: Sequence[Data],
    *,
    out_dir: str | os.PathLike | None = None,
) -> Trainer:
    """The training core set up for a property model (``.fit(resume=, stop_after=, callbacks=)``)."""
    task = PropertyTask(model, config, train, val)
    out = None if out_dir is None else Path(out_dir)
    return Trainer(task, config.train, seed=config.train.seed, out=out)


def prediction_metrics(pred: dict[str, Any], y_true: Any, names: Sequence[str]) -> dict[str, Any]:
    """``regression_metrics`` plus mean std / epistemic / aleatoric std, per target.

    One target: a flat dict. Several: the mean over targets, flat, plus ``per_target``.
    """
    y_true = np.asarray(y_true, dtype=np.float64)
    per = {}
    for t, name in enumerate(names):
        m = regression_metrics(
            pred["mean"][:, t], pred["std"][:, t], y_true[:, t], nan_policy="omit"
        )
        m["mean_std"] = float(np.mean(pred["std"][:, t]))
        m["mean_epistemic_std"] = float(np.mean(pred["epistemic_std"][:, t]))
        m["mean_aleatoric_std"] = float(np.mean(pred["aleatoric_std"][:, t]))
        per[name] = m
    if len(names) == 1:
        return per[names[0]]
    flat = {k: float(np.mean([m[k] for m in per.values()])) for k in next(iter(per.values()))}
    return {**flat, "per_target": per}


def _targets(graphs: Sequence[Data]) -> np.ndarray:
    return torch.cat([g[keys.TARGET] for g in graphs]).double().numpy()


def _fit_calibration(
    predictor: PropertyPredictor, val: Sequence[Data], kind: str
) -> tuple[list[dict[str, Any]] | None, str | None]:
    """Calibrator states per target fitted on ``val`` (None when none was fitted), and the
    warning when a target has fewer labelled validation molecules than
    :data:`~mlip_unc.uncertainty.sample_size.MIN_CALIBRATION_SIZE`: that target keeps its
    raw std (an identity calibrator)."""
    y_val, pred = _targets(val), predictor.predict(val)
    calibrators: list[Any] = []
    counts = []
    for t in range(y_val.shape[1]):
        ok = ~np.isnan(y_val[:, t])
        counts.append(int(ok.sum()))
        if counts[-1] < MIN_CALIBRATION_SIZE:
            calibrators.append(IdentityCalibrator())
            continue
        calibrators.append(
            make_calibrator(kind).fit(pred["mean"][ok, t], pred["std"][ok, t], y_val[ok, t])
        )
    warning = too_few(
        min(counts),
        f"the {kind} recalibration",
        "not applied there; predictions keep the raw std (a factor fitted on so few is as "
        "likely to worsen the std as to correct it)",
        unit="validation molecules",
    )
    if all(isinstance(c, IdentityCalibrator) for c in calibrators):
        predictor.calibrators = None
        return None, warning
    predictor.calibrators = calibrators
    return [c.state_dict() for c in calibrators], warning


def recalibration_summary(calibration: list[dict[str, Any]] | None) -> dict[str, Any]:
    """``{"kind", "scale" (one std factor per target, or None), "fitted_on"}`` of a checkpoint's
    calibration entry; kind ``none`` when there is none."""
    if not calibration:
        return {"kind": "none", "scale": None, "fitted_on": None}
    kinds = sorted({str(c.get("kind")) for c in calibration})
    scales = [calibrator_from_state_dict(c).transform([1.0])[0] for c in calibration]
    return {"kind": "+".join(kinds), "scale": [float(v) for v in scales], "fitted_on": "val"}


def train_property_model(
    config: PropertyConfig,
    train: Sequence[Data],
    val: Sequence[Data],
    test: Sequence[Data] | None = None,
    *,
    out_dir: str | os.PathLike,
    metadata: dict[str, Any] | None = None,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    freeze_posterior: str | os.PathLike | None = None,
    callbacks: Sequence[EpochCallback] = (),
) -> tuple[PropertyPredictor | None, dict[str, Any] | None]:
    """Standardise, build, train, recalibrate on validation, evaluate on test, save.

    The recalibrator (``config.train.calibration``, default ``zscaling``: one std factor per
    target, fitted on the validation split; a target with fewer than
    :data:`~mlip_unc.uncertainty.sample_size.MIN_CALIBRATION_SIZE` labelled validation molecules
    keeps its raw std, with ``metadata["recalibration_warning"]``) is stored in
    ``out_dir/model.pt`` (weights-only:
    config, feature metadata, normalisation, calibration). The test metrics are those of the
    recalibrated predictor, with the raw model's under ``uncalibrated`` (and ``val`` /
    ``val_uncalibrated`` for the validation split) and ``recalibration`` = kind and factors.
    Returns ``(predictor, test metrics or None)``; ``(None, None)`` when ``stop_after``
    interrupted the run (``resume=True`` continues it), and on ranks other than 0 under torchrun.
    """
    out_dir = Path(out_dir)
    names = list((metadata or {}).get("target_names") or [])
    n_targets = int(train[0][keys.TARGET].shape[-1])
    names = names if len(names) == n_targets else [f"target_{t}" for t in range(n_targets)]
    meta = {
        **feature_metadata(),
        **(metadata or {}),
        "n_targets": n_targets,
        "target_names": names,
        "n_train": len(train),
        TRAIN_ELEMENTS_KEY: sorted(set().union(*molecule_elements(train))),
    }
    model = seeded_model(config, train)
    if freeze_posterior is not None:
        freeze_posterior_from(model, freeze_posterior)
        meta["frozen_posterior_from"] = str(freeze_posterior)
    result: FitResult = property_trainer(model, config, train, val, out_dir=out_dir).fit(
        resume=resume, overwrite=overwrite, stop_after=stop_after, callbacks=callbacks
    )
    if not result.finished or not distributed.is_main():  # torchrun: rank 0 calibrates and writes
        return None, None
    predictor = PropertyPredictor(model.eval(), config, meta)
    kind = config.train.calibration.value
    calibration, warning = (
        (None, None) if kind == "none" else _fit_calibration(predictor, val, kind)
    )
    if warning is not None:
        meta["recalibration_warning"] = warning
    meta.update(
        best_epoch=result.best_epoch,
        epochs_run=result.epochs_run,
        stopped_early=result.stopped_early,
        train_seconds=60.0 * result.minutes,
    )
    save_checkpoint(
        out_dir / "model.pt", model_payload(model, config, meta, calibration=calibration)
    )
    if not test:
        return predictor, None
    y_test, names_ = _targets(test), names
    metrics = prediction_metrics(predictor.predict(test), y_test, names_)
    metrics["val"] = prediction_metrics(predictor.predict(val), _targets(val), names_)
    metrics["recalibration"] = recalibration_summary(calibration)
    if warning is not None:
        metrics["recalibration"]["warning"] = warning
    if (
        calibration is not None
    ):  # top level: recalibrated (what `predict` gives); the raw model beside it
        raw = PropertyPredictor(model, config, meta)
        metrics["uncalibrated"] = prediction_metrics(raw.predict(test), y_test, names_)
        metrics["val_uncalibrated"] = prediction_metrics(raw.predict(val), _targets(val), names_)
    metrics.update(
        method=config.model.method.value,
        seed=config.train.seed,
        train_seconds=60.0 * result.minutes,
        epochs_run=result.epochs_run,
        best_epoch=result.best_epoch,
        stopped_early=result.stopped_early,
        n_train=len(train),
        n_val=len(val),
        n_test=len(test),
    )
    return predictor, metrics


def run_property_training(
    config: PropertyConfig,
    *,
    out_dir: str | os.PathLike,
    resume: bool = False,
    overwrite: bool = False,
    stop_after: int | None = None,
    freeze_posterior: str | os.PathLike | None = None,
) -> tuple[PropertyPredictor | None, dict[str, Any] | None]:
    """:func:`train_property_model` on the data that ``config.data`` names (read, split and
    subset by :func:`~mlip_unc.train.property_data.prepare_property_data`, recorded in the
    checkpoint's metadata): the run of ``mlip-unc property train``. Returns as that function."""
    data = prepare_property_data(config)
    return train_property_model(
        config,
        data.train,
        data.val,
        data.test,
        out_dir=out_dir,
        metadata=data.metadata,
        resume=resume,
        overwrite=overwrite,
        stop_after=stop_after,
        freeze_posterior=freeze_posterior,
    )
