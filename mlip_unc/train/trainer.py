"""The training loop for property models: negative ELBO, early stopping, resumable checkpoints.

Per mini-batch (docs/method.md section 2 of this project)::

    loss = mean NLL + beta(epoch) * KL / N_train + lambda(epoch) * R(z, mu, S)

with N_train the number of training examples and R the optional latent regulariser
(``mlip_unc.train.regularizers``; issue 4's hook). Each epoch logs the NLL, the KL term, the
regulariser, validation RMSE/NLL (target units), lambda, the effective rank of the validation
latents and the mean posterior std of the Bayesian last layer; the history goes to
``DIR/history.json``.

Resuming: after every epoch ``DIR/checkpoint.pt`` holds the model, optimizer, scheduler,
early-stopping state (with the best weights), epoch, history and RNG states (torch's global
RNG, the shuffling and the weight-sampling generators), so a resumed run continues exactly.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.models.property import (
    CHECKPOINT_KIND,
    PropertyPredictor,
    StandardisedModel,
    build_model,
    feature_metadata,
    predict_graphs,
)
from mlip_unc.nn.bayesian import BayesianLinear, BayesianMLP
from mlip_unc.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from mlip_unc.train.config import PropertyConfig, Scheduler, StopMetric
from mlip_unc.train.losses import gaussian_nll, kl_weight, negative_elbo
from mlip_unc.train.regularizers import LambdaSchedule, regularizer_term
from mlip_unc.uncertainty.alignment import effective_rank
from mlip_unc.uncertainty.calibration import regression_metrics
from mlip_unc.uncertainty.recalibration import make_calibrator

__all__ = [
    "TrainResult",
    "Trainer",
    "train_property_model",
    "prediction_metrics",
    "target_statistics",
    "freeze_posterior_from",
    "model_payload",
    "write_json",
]

log = logging.getLogger(__name__)

RESUME_FILE = "checkpoint.pt"
HISTORY_FILE = "history.json"
EpochCallback = Callable[[int, dict[str, Any]], None]


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write JSON atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2, allow_nan=True)
            handle.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


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
    payload = load_checkpoint(path)
    state = payload.get("model_state", {})
    names = [n for n, _ in head.named_parameters()]
    try:
        values = {n: state[f"head.{n}"] for n in names}
        with torch.no_grad():
            for n, p in head.named_parameters():
                p.copy_(values[n].to(p.dtype))
    except (KeyError, RuntimeError) as err:
        raise CheckpointError(f"{path} holds no compatible Bayesian last layer ({err})") from None
    for p in head.parameters():
        p.requires_grad_(False)


@dataclass
class TrainResult:
    """What :meth:`Trainer.fit` returns."""

    history: list[dict[str, Any]]
    best_epoch: int
    best_metric: float
    epochs_run: int
    """Epochs completed in total (including those before a resume)."""
    finished: bool
    """False when the run stopped because of ``stop_after`` (resume to continue)."""
    stopped_early: bool = False
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Trainer:
    """Adam + LR schedule + early stopping on validation NLL or RMSE, resumable.

    Args:
        model: a property model (``mlip_unc.models.property.build_model``).
        config: the full config (training options in ``config.train``).
        out_dir: where ``checkpoint.pt`` and ``history.json`` go (None: nowhere).
        metadata: stored in the resume checkpoint (feature metadata, split, ...).
    """

    def __init__(
        self,
        model: StandardisedModel,
        config: PropertyConfig,
        *,
        out_dir: str | os.PathLike | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.model, self.config, self.cfg = model, config, config.train
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.metadata = dict(metadata or {})
        self.optimizer = torch.optim.Adam(self._param_groups(), lr=self.cfg.lr)
        self.scheduler = self._make_scheduler()
        self.loader_gen = torch.Generator().manual_seed(self.cfg.seed)
        self.noise_gen = torch.Generator().manual_seed(self.cfg.seed + 1)
        self.lam = LambdaSchedule(self.cfg.reg_warmup, self.cfg.reg_ramp, self.cfg.reg_lambda)
        self.reg_kind = self.cfg.regularizer_kind
        self.epoch = 0
        self.history: list[dict[str, Any]] = []
        self.best = {"metric": math.inf, "epoch": -1, "bad": 0, "state": None}

    # ------------------------------------------------------------------ setup
    def _param_groups(self) -> list[dict[str, Any]]:
        bayes, det = [], []
        for module in self.model.modules():
            target = bayes if isinstance(module, (BayesianLinear, BayesianMLP)) else det
            target.extend(p for p in module.parameters(recurse=False) if p.requires_grad)
        groups = [{"params": det, "weight_decay": self.cfg.weight_decay}]
        if bayes:
            groups.append({"params": bayes, "weight_decay": 0.0})
        return groups

    def _make_scheduler(self) -> Any:
        if self.cfg.scheduler is Scheduler.PLATEAU:
            return torch.optim.lr_scheduler.ReduceLROnPlateau(
                self.optimizer, factor=0.5, patience=10, min_lr=self.cfg.lr / 100
            )
        if self.cfg.scheduler is Scheduler.COSINE:
            return torch.optim.lr_scheduler.CosineAnnealingLR(
                self.optimizer, T_max=self.cfg.epochs, eta_min=self.cfg.lr / 100
            )
        return None

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        rng = {
            "torch": torch.get_rng_state(),
            "loader": self.loader_gen.get_state(),
            "noise": self.noise_gen.get_state(),
        }
        rotation = getattr(self.model, "rotation", None)
        if rotation is not None and getattr(rotation, "generator", None) is not None:
            rng["rotation"] = rotation.generator.get_state()
        return {
            "kind": "property_training",
            "config": self.config.to_dict(),
            "metadata": self.metadata,
            "normalization": {"mean": self.model.y_mean.tolist(), "std": self.model.y_std.tolist()},
            "model_state": self.model.state_dict(),
            "optimizer_state": self.optimizer.state_dict(),
            "scheduler_state": None if self.scheduler is None else self.scheduler.state_dict(),
            "early_stopping": {k: v for k, v in self.best.items() if k != "state"},
            "best_model_state": self.best["state"],
            "epoch": self.epoch,
            "history": self.history,
            "rng": rng,
        }

    def load_state_dict(self, payload: dict[str, Any]) -> None:
        """Restore everything written by :meth:`state_dict` (config must match)."""
        saved = payload.get("config")
        if _comparable(saved) != _comparable(self.config.to_dict()):
            diff = _config_diff(saved or {}, self.config.to_dict())
            raise CheckpointError(f"the checkpoint was written with a different config: {diff}")
        self.model.load_state_dict(payload["model_state"])
        self.optimizer.load_state_dict(payload["optimizer_state"])
        if self.scheduler is not None and payload.get("scheduler_state") is not None:
            self.scheduler.load_state_dict(payload["scheduler_state"])
        self.best = {**payload["early_stopping"], "state": payload.get("best_model_state")}
        self.epoch = int(payload["epoch"])
        self.history = list(payload.get("history", []))
        rng = payload["rng"]
        torch.set_rng_state(rng["torch"])
        self.loader_gen.set_state(rng["loader"])
        self.noise_gen.set_state(rng["noise"])
        rotation = getattr(self.model, "rotation", None)
        if "rotation" in rng and rotation is not None:
            rotation.generator.set_state(rng["rotation"])

    def resume(self, path: str | os.PathLike | None = None) -> bool:
        """Load ``path`` (default ``out_dir/checkpoint.pt``); False when there is none."""
        path = Path(path) if path is not None else (self.out_dir / RESUME_FILE if self.out_dir else None)
        if path is None or not path.exists():
            return False
        self.load_state_dict(load_checkpoint(path, kind="property_training"))
        log.info("resumed from %s at epoch %d", path, self.epoch)
        return True

    # ------------------------------------------------------------------ one epoch
    def _train_epoch(self, loader: DataLoader, n_train: int) -> dict[str, float]:
        model, cfg = self.model, self.cfg
        model.train()
        beta = kl_weight(self.epoch, beta=cfg.beta, anneal_epochs=cfg.kl_anneal_epochs)
        lam = self.lam(self.epoch) if self.reg_kind != "none" else 0.0
        head = model.bayes_head
        sums = {"nll": 0.0, "kl": 0.0, "reg": 0.0}
        seen = 0
        for batch in loader:
            out = model(batch, generator=self.noise_gen)
            y = model.standardise(batch[keys.TARGET])
            nll = gaussian_nll(out[keys.PREDICTION], out[keys.ALEATORIC_VAR], y)
            loss, kl_term = negative_elbo(nll, model.kl(), n_train=n_train, beta=beta)
            reg = loss.new_zeros(())
            if lam > 0.0:
                mu = head.weight_mu[0] if head is not None else None
                s2 = head.weight_var[0] if head is not None else None
                reg = regularizer_term(self.reg_kind, out[keys.LATENT], mu, s2)
                loss = loss + lam * reg
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip is not None:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            self.optimizer.step()
            n = batch.num_graphs
            seen += n
            sums["nll"] += nll.item() * n
            sums["kl"] += kl_term.item() * n
            sums["reg"] += reg.item() * n
        out = {f"train_{k}": v / max(seen, 1) for k, v in sums.items()}
        return {**out, "beta": beta, "lambda": lam, "kl_total": model.kl().item()}

    @torch.no_grad()
    def evaluate(self, graphs: Sequence[Data]) -> dict[str, float]:
        """Validation RMSE and Gaussian NLL in target units, effective rank of z, mean s."""
        out = predict_graphs(self.model, graphs, latent=True)
        y = torch.cat([g[keys.TARGET] for g in graphs]).to(out[keys.PREDICTION].dtype)
        mask = ~torch.isnan(y)
        err = (out[keys.PREDICTION] - y)[mask]
        result = {
            "val_rmse": float(err.pow(2).mean().sqrt()),
            "val_nll": float(gaussian_nll(out[keys.PREDICTION], out[keys.PREDICTION_VAR].clamp_min(1e-12), y)),
            "val_mean_std": float(out[keys.PREDICTION_VAR].sqrt().mean()),
            "val_mean_epistemic_std": float(out[keys.EPISTEMIC_VAR].clamp_min(0).sqrt().mean()),
            "effective_rank": effective_rank(out[keys.LATENT]) if len(graphs) > 1 else float("nan"),
        }
        head = self.model.bayes_head
        result["mean_s"] = float(head.weight_std.mean()) if head is not None else float("nan")
        return result

    # ------------------------------------------------------------------ the loop
    def fit(
        self,
        train_graphs: Sequence[Data],
        val_graphs: Sequence[Data],
        *,
        resume: bool | str | os.PathLike = False,
        stop_after: int | None = None,
        callbacks: Sequence[EpochCallback] = (),
    ) -> TrainResult:
        """Train until ``epochs``, early stopping, or ``stop_after`` epochs in this call.

        Args:
            resume: True (``out_dir/checkpoint.pt``) or a path; a missing file starts afresh.
            stop_after: stop after this many epochs of this call (``finished=False``), leaving a
                checkpoint to resume from (used to test interruption).
            callbacks: ``f(epoch, record)`` after each epoch's checkpoint (an exception raised
                there aborts the run like a kill).

        The best model (by ``stop_metric``) is loaded at the end and ``model.post_fit`` runs.
        """
        cfg = self.cfg
        if not train_graphs or not val_graphs:
            raise ValueError("training and validation sets must not be empty")
        if resume:
            self.resume(None if resume is True else resume)
        n_train = len(train_graphs)
        loader = DataLoader(list(train_graphs), batch_size=cfg.batch_size, shuffle=True, generator=self.loader_gen)
        start, t0 = time.perf_counter(), self.epoch
        finished, stopped_early = True, False
        show = cfg.progress and sys.stderr.isatty()
        bar = tqdm(total=cfg.epochs, initial=self.epoch, disable=not show, desc="train", unit="ep", leave=False)
        try:
            while self.epoch < cfg.epochs:
                if self.best["bad"] >= cfg.patience > 0:
                    stopped_early = True
                    break
                if stop_after is not None and self.epoch - t0 >= stop_after:
                    finished = False
                    break
                record = self._run_epoch(loader, val_graphs, n_train)
                bar.update(1)
                bar.set_postfix(nll=f"{record['train_nll']:.3f}", kl=f"{record['train_kl']:.3f}",
                                val_rmse=f"{record.get('val_rmse', float('nan')):.3f}")
                for callback in callbacks:
                    callback(self.epoch - 1, record)
        finally:
            bar.close()
        seconds = time.perf_counter() - start
        if finished:
            if self.best["state"] is not None:
                self.model.load_state_dict(self.best["state"])
            self.model.post_fit(train_graphs)
        return TrainResult(
            history=self.history, best_epoch=int(self.best["epoch"]), best_metric=float(self.best["metric"]),
            epochs_run=self.epoch, finished=finished, stopped_early=stopped_early, seconds=seconds,
        )

    def _run_epoch(self, loader: DataLoader, val_graphs: Sequence[Data], n_train: int) -> dict[str, Any]:
        t = time.perf_counter()
        record: dict[str, Any] = {"epoch": self.epoch, **self._train_epoch(loader, n_train)}
        record["lr"] = self.optimizer.param_groups[0]["lr"]
        evaluate = (self.epoch + 1) % self.cfg.eval_every == 0 or self.epoch + 1 == self.cfg.epochs
        if evaluate:
            record.update(self.evaluate(val_graphs))
            metric = record["val_nll" if self.cfg.stop_metric is StopMetric.NLL else "val_rmse"]
            if isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
                self.scheduler.step(metric)
            if metric < self.best["metric"]:
                self.best.update(metric=metric, epoch=self.epoch, bad=0,
                                 state=copy.deepcopy(self.model.state_dict()))
            else:
                self.best["bad"] += self.cfg.eval_every
        if self.scheduler is not None and not isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            self.scheduler.step()
        record["seconds"] = time.perf_counter() - t
        self.history.append(record)
        self.epoch += 1
        log.info(
            "epoch %d  nll %.4f  kl %.4f  reg %.4f  val_rmse %s  val_nll %s",
            record["epoch"], record["train_nll"], record["train_kl"], record["train_reg"],
            _fmt(record.get("val_rmse")), _fmt(record.get("val_nll")),
        )
        if self.out_dir is not None:
            save_checkpoint(self.out_dir / RESUME_FILE, self.state_dict())
            write_json(self.out_dir / HISTORY_FILE, self.history)
        return record


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


def _comparable(cfg: dict[str, Any] | None) -> Any:
    if cfg is None:
        return None
    return {s: {k: v for k, v in cfg.get(s, {}).items() if k != "progress"} for s in ("model", "train")}


def _config_diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    ca, cb = _comparable(a), _comparable(b)
    diffs = [
        f"{s}.{k}: {ca.get(s, {}).get(k)!r} (checkpoint) vs {cb[s].get(k)!r} (now)"
        for s in cb for k in cb[s] if ca.get(s, {}).get(k) != cb[s].get(k)
    ]
    return "; ".join(diffs) or "unknown sections"


# ====================================================================== the whole run
def target_statistics(graphs: Sequence[Data]) -> tuple[Tensor, Tensor]:
    """Per-target mean and std (population, NaN-ignoring) of the training targets."""
    y = torch.cat([g[keys.TARGET] for g in graphs]).double()  # (n, n_targets)
    mask = ~torch.isnan(y)
    count = mask.sum(0).clamp_min(1)
    mean = torch.where(mask, y, 0.0).sum(0) / count
    var = torch.where(mask, (y - mean) ** 2, 0.0).sum(0) / count
    std = var.sqrt()
    return mean, torch.where(std > 0, std, torch.ones_like(std))


def prediction_metrics(pred: dict[str, Any], y_true: Any, names: Sequence[str]) -> dict[str, Any]:
    """``regression_metrics`` plus mean std / epistemic / aleatoric std, per target.

    One target: a flat dict. Several: the mean over targets, flat, plus ``per_target``.
    """

    y_true = np.asarray(y_true, dtype=np.float64)
    per = {}
    for t, name in enumerate(names):
        m = regression_metrics(pred["mean"][:, t], pred["std"][:, t], y_true[:, t], nan_policy="omit")
        m["mean_std"] = float(np.mean(pred["std"][:, t]))
        m["mean_epistemic_std"] = float(np.mean(pred["epistemic_std"][:, t]))
        m["mean_aleatoric_std"] = float(np.mean(pred["aleatoric_std"][:, t]))
        per[name] = m
    if len(names) == 1:
        return per[names[0]]
    flat = {k: float(np.mean([m[k] for m in per.values()])) for k in next(iter(per.values()))}
    return {**flat, "per_target": per}


def train_property_model(
    config: PropertyConfig,
    train: Sequence[Data],
    val: Sequence[Data],
    test: Sequence[Data] | None = None,
    *,
    out_dir: str | os.PathLike,
    metadata: dict[str, Any] | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    freeze_posterior: str | os.PathLike | None = None,
    callbacks: Sequence[EpochCallback] = (),
) -> tuple[Any, dict[str, Any] | None]:
    """Standardise, build, train, calibrate on validation, evaluate on test, save.

    Writes ``out_dir/model.pt`` (weights-only: config, feature metadata, normalisation,
    calibration) and, when ``test`` is given, returns its metrics (also written by the caller).
    Returns ``(predictor, metrics)``; ``(None, None)`` when ``stop_after`` interrupted the run.
    """
    out_dir = Path(out_dir)
    names = list((metadata or {}).get("target_names") or [])
    n_targets = int(train[0][keys.TARGET].shape[-1])
    names = names if len(names) == n_targets else [f"target_{t}" for t in range(n_targets)]
    meta = {**feature_metadata(), **(metadata or {}), "n_targets": n_targets, "target_names": names,
            "n_train": len(train)}
    torch.manual_seed(config.train.seed)
    mean, std = target_statistics(train)
    model = build_model(config, n_targets=n_targets, y_mean=mean, y_std=std)
    if freeze_posterior is not None:
        freeze_posterior_from(model, freeze_posterior)
        meta["frozen_posterior_from"] = str(freeze_posterior)
    trainer = Trainer(model, config, out_dir=out_dir, metadata=meta)
    result = trainer.fit(train, val, resume=resume, stop_after=stop_after, callbacks=callbacks)
    if not result.finished:
        return None, None
    predictor = PropertyPredictor(model.eval(), config, meta)
    y_val = torch.cat([g[keys.TARGET] for g in val]).double().numpy()
    val_pred = predictor.predict(val)
    calibration = None
    if config.train.calibration != "none":
        calibrators = []
        for t in range(n_targets):
            ok = ~np.isnan(y_val[:, t])
            calibrators.append(make_calibrator(config.train.calibration).fit(
                val_pred["mean"][ok, t], val_pred["std"][ok, t], y_val[ok, t]))
        predictor.calibrators = calibrators
        calibration = [c.state_dict() for c in calibrators]
    meta.update(best_epoch=result.best_epoch, epochs_run=result.epochs_run,
                stopped_early=result.stopped_early, train_seconds=result.seconds)
    save_checkpoint(out_dir / "model.pt", model_payload(model, config, meta, calibration=calibration))
    if not test:
        return predictor, None
    y_test = torch.cat([g[keys.TARGET] for g in test]).double().numpy()
    metrics = prediction_metrics(predictor.predict(test), y_test, names)
    if calibration is not None:
        raw = PropertyPredictor(model, config, meta).predict(test)
        metrics["uncalibrated"] = prediction_metrics(raw, y_test, names)
    metrics["val"] = prediction_metrics(predictor.predict(val), y_val, names)
    metrics.update(
        method=config.model.method.value, seed=config.train.seed, train_seconds=result.seconds,
        epochs_run=result.epochs_run, best_epoch=result.best_epoch, stopped_early=result.stopped_early,
        n_train=len(train), n_val=len(val), n_test=len(test),
    )
    return predictor, metrics
