"""Training of a :class:`~mlip_unc.models.potential.BayesianPotential`: the batch -> loss step
on the training core (docs/method.md sections 2-3, 5-6).

Data flow: files -> :func:`~mlip_unc.train.potential_data.prepare_data` -> :func:`build_model`
-> :func:`train_potential` (the core's epochs of one posterior weight draw per batch and one
backward pass; validation at the posterior mean).

Outputs in ``config.out`` (``out/member_k`` for committee members):

* ``model.pt``: the best model on validation (``BayesianPotential.from_checkpoint`` loads it;
  ``metadata`` holds the training config, epoch, reference energies and the validation
  uncertainty levels for relative flagging thresholds), written once, after
  :func:`finalize_checkpoint`: an interrupted run has none (the loaders refuse a ``model.pt``
  that was written before its posterior, domain guard and levels,
  :func:`~mlip_unc.models.potential_checkpoint.incomplete_reason`);
* ``last.pt``: the core's resume state; ``history.json``: per-epoch losses and metrics;
* ``config.yaml``: the resolved config (written once the resume check has passed).

A ``map`` head trains the posterior mean only (its std frozen at ~0, no KL): a deterministic
model, e.g. one member of the committee baseline (``train.ensemble: M``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mlip_unc import keys
from mlip_unc.config import (
    ConfigError,
    EnergyCount,
    HeadKind,
    PosteriorKind,
    PotentialConfig,
    RegularizerKind,
)
from mlip_unc.data.domain import DomainGuard
from mlip_unc.evaluation.evaluate import evaluate_potential, predict
from mlip_unc.models.backbones import backbone_gradient_method, build_backbone
from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.posthoc.levels import uncertainty_levels
from mlip_unc.posthoc.posterior import fit_full_posterior, random_subset
from mlip_unc.train import distributed
from mlip_unc.train.core import Step, Trainer, TrainingInterrupted
from mlip_unc.train.device import resolve_device
from mlip_unc.train.losses import (
    energy_nll,
    forces_nll,
    kl_weight,
    likelihood_terms,
    potential_loss,
)
from mlip_unc.train.offsets import refit_energy_offsets
from mlip_unc.train.potential_data import PreparedData, data_fingerprint, prepare_data
from mlip_unc.train.regularizers import LambdaSchedule, regularizer_term
from mlip_unc.train.text_files import write_json, write_yaml

__all__ = [
    "PotentialTask",
    "TrainResult",
    "build_model",
    "finalize_checkpoint",
    "train_potential",
    "train_ensemble",
    "run_training",
]

log = logging.getLogger(__name__)
_MAP_STD = 1e-8  # posterior std of a MAP head: the weight draw is the mean to ~1e-8


# ================================================================ model
def build_model(
    config: PotentialConfig, data: PreparedData, *, seed: int | None = None
) -> BayesianPotential:
    """The potential of ``config`` with offsets, noise and neighbour statistics from ``data``.

    With ``model.standardise`` the per-element offsets are E0(Z) + the mean per-atom
    residual, and the initial noise stds are the per-atom residual std and the force RMS (the
    errors of a constant predictor), so the first NLL values are of order one. Parameters are
    drawn from ``seed`` (default ``config.seed``) with torch's global RNG forked, not reseeded.
    """
    model_cfg = config.model
    kwargs = {
        "num_types": len(data.type_map),
        "r_max": config.data.r_max,
        "latent_dim": model_cfg.latent_dim,
        "avg_num_neighbors": data.avg_num_neighbors,
        **model_cfg.backbone_kwargs.kwargs(),  # typed per backbone (config.backbones)
    }
    offsets = torch.tensor(
        [data.reference_energies[z] for z in data.type_map.atomic_numbers], dtype=torch.float64
    )
    noise: dict[str, Any] = {}  # energy_noise, force_noise: the constructor's defaults unless set
    if model_cfg.standardise:
        offsets = offsets + data.energy_shift
        noise = {
            "energy_noise": max(data.energy_std, 1e-3),
            "force_noise": max(data.force_rms, 1e-3),
        }
    init_std = _MAP_STD if model_cfg.head is HeadKind.MAP else model_cfg.init_std
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed if seed is None else seed)
        try:
            backbone = build_backbone(model_cfg.backbone_name, **kwargs)
        except (TypeError, ValueError) as err:  # e.g. latent_dim wider than the readout
            raise ConfigError(f"model.backbone_kwargs: {err}") from None
        model = BayesianPotential(
            backbone,
            data.type_map.to_list(),
            config.data.r_max,
            offsets,
            prior_std=model_cfg.prior_std,
            init_std=init_std,
            learn_noise=model_cfg.learn_noise,
            **noise,
            # the registered backbone's (loop for MACE: docs/what-we-tried.md)
            gradient_method=backbone_gradient_method(model_cfg.backbone_name),
        )
    if model_cfg.head is HeadKind.MAP:
        model.head.weight_rho.requires_grad_(False)
    return model.to(config.dtype.torch)


def _init_from(config: PotentialConfig, data: PreparedData) -> BayesianPotential:
    """The model of checkpoint ``train.init_from`` (architecture, offsets and weights), for
    fine-tuning; its elements must cover the data and its cutoff must not exceed data.r_max."""
    path = config.train.init_from
    assert path is not None  # only called with train.init_from set
    model = BayesianPotential.from_checkpoint(path, allow_incomplete=True)
    model.clear_full_posterior()  # training uses the learned noises; the posterior is refitted after
    missing = [z for z in data.type_map.atomic_numbers if z not in model.type_map]
    if missing:
        raise ConfigError(
            f"train.init_from: {path} has no element(s) {missing} of the training data"
        )
    if model.r_max > config.data.r_max + 1e-12:
        raise ConfigError(
            f"train.init_from: {path} has r_max {model.r_max} > data.r_max {config.data.r_max}"
        )
    if config.model.head is HeadKind.MAP:
        model.head.weight_rho.requires_grad_(False)
    return model.to(config.dtype.torch)


# ================================================================ the task
def _mae_rmse(err: np.ndarray) -> tuple[float, float]:
    if not err.size:
        return float("nan"), float("nan")
    return 1e3 * float(np.mean(np.abs(err))), 1e3 * float(np.sqrt(np.mean(err**2)))


SIZE_RATIO_PER_ATOM = 2.0  # auto: per-atom energy counting above this largest/smallest size


def energy_per_atom(count: EnergyCount, graphs: list) -> bool:
    """Resolve ``loss.energy_count``: ``auto`` counts per atom when a training graph is periodic
    or the structures' sizes spread widely (largest > 2x smallest, one-atom reference frames
    aside). Why: counted once per structure, a large cluster's energy weighs as much as a small
    one's against many more force components, and training lets it go (see
    :class:`~mlip_unc.config.potential.LossConfig`)."""
    if count is EnergyCount.AUTO:
        if any(bool(torch.as_tensor(g[keys.PBC]).any()) for g in graphs):
            return True
        sizes = [n for n in (int(g.num_nodes) for g in graphs) if n > 1]
        return bool(sizes) and max(sizes) > SIZE_RATIO_PER_ATOM * min(sizes)
    return count is EnergyCount.ATOM


class PotentialTask:
    """The potential's step, validation and best-model checkpoint for the training core."""

    metric_key = "valid_loss"

    def __init__(self, config: PotentialConfig, data: PreparedData, out: Path) -> None:
        self.config, self.data, self.out = config, data, out
        self.model = (
            build_model(config, data)
            if config.train.init_from is None
            else _init_from(config, data)
        )
        reg = config.regularizer
        self.lam = LambdaSchedule(reg.warmup_epochs, reg.ramp_epochs, reg.lambda_max)
        self.bayesian = config.model.head is HeadKind.BAYESIAN
        loss = config.loss
        self.stage, self.weights = loss.weights(
            0.0
        )  # (loss.stage_two_start: the weights change mid-run)
        self.energy_per_atom = energy_per_atom(loss.energy_count, data.train.graphs)
        self.epoch = 0

    def train_data(self) -> list:
        return self.data.train.graphs

    def loss(self, batch: Any, step: Step) -> tuple[Tensor, dict[str, float]]:
        config, model = self.config, self.model
        self.stage, self.weights = config.loss.weights(step.progress)
        use_stress = config.loss.stress_weight > 0
        out = model(batch, training=True, compute_stress=use_stress, generator=step.generator)
        noise = model.noise_variances(batch)
        if use_stress:
            noise[keys.STRESS] = out[keys.STRESS].new_tensor(config.loss.stress_noise**2)
        nll = likelihood_terms(
            out, batch, noise, use_stress=use_stress, energy_per_atom=self.energy_per_atom
        )
        lam = self.lam(step.epoch)
        reg = None
        if config.regularizer.kind is not RegularizerKind.NONE and lam > 0:
            mu, s2 = model.posterior()
            reg = regularizer_term(config.regularizer.kind, out[keys.NODE_LATENT], mu, s2)
        beta = kl_weight(
            step.epoch, beta=config.loss.beta, warmup_epochs=config.loss.kl_warmup_epochs
        )
        parts = potential_loss(
            nll,
            self.weights,
            kl=model.kl() if self.bayesian else None,
            beta=beta,
            n_train=len(self.data.train),
            regularizer=reg,
            lam=lam,
        )
        terms = {name: float(value.detach()) for name, value in parts.items() if name != "loss"}
        terms.update({f"{name}_nll": float(value.detach()) for name, value in nll.items()})
        terms.update(beta=beta if self.bayesian else 0.0, **{"lambda": lam})
        return parts["loss"], terms

    def validate(self) -> dict[str, float]:
        """Valid loss (weighted NLL at the posterior mean, noise variances only) and MAEs."""
        dataset = self.data.valid if self.data.valid is not None else self.data.train
        pred = predict(self.model, dataset, batch_size=self.config.train.valid_batch_size)
        t = torch.as_tensor
        e_mask, w = pred.has_energy, self.weights
        loss = 0.0
        if e_mask.any() and w["energy"] > 0:
            loss += w["energy"] * float(
                energy_nll(
                    t(pred.energy_pred[e_mask]),
                    t(pred.energy_true[e_mask]),
                    t(pred.num_atoms[e_mask]),
                    t(pred.energy_noise_var[e_mask]),
                    per_atom=self.energy_per_atom,
                )
            )
        if pred.has_forces.any() and w["forces"] > 0:
            loss += w["forces"] * float(
                forces_nll(
                    t(pred.forces_pred),
                    t(pred.forces_true),
                    t(pred.forces_noise_var),
                    t(pred.atom_frame),
                    t(pred.has_forces),
                    pred.n_frames,
                )
            )
        e_mae, e_rmse = _mae_rmse(
            (pred.energy_pred - pred.energy_true)[e_mask] / pred.num_atoms[e_mask]
        )
        f_mae, f_rmse = _mae_rmse((pred.forces_pred - pred.forces_true)[pred.atom_has_forces])
        _, s2 = self.model.posterior()
        return {
            "valid_loss": loss,
            "valid_energy_mae_meV_atom": e_mae,
            "valid_energy_rmse_meV_atom": e_rmse,
            "valid_forces_mae_meV_A": f_mae,
            "valid_forces_rmse_meV_A": f_rmse,
            "sigma_e_meV_atom": 1e3 * float(self.model.energy_noise.detach()),
            "sigma_f_meV_A": 1e3 * float(self.model.force_noise.detach()),
            "posterior_std_mean": float(s2.detach().sqrt().mean()),
            "kl": float(self.model.kl().detach()),
            "phase": self.stage,  # the core keeps the best model of each stage (loss.stage_two_start)
        }

    # -------------------------------------------------------------- core hooks
    def signature(self) -> dict[str, Any]:
        """Architecture, loss, regulariser, seed and dtype; epochs and budget may change."""
        cfg = self.config.to_dict()
        return {
            "kind": "potential",
            "architecture": self.model.config(),
            **{k: cfg[k] for k in ("loss", "regularizer", "seed", "dtype")},
        }

    def on_start(self) -> None:
        write_yaml(self.out / "config.yaml", self.config.to_dict())

    def metadata(self) -> dict[str, Any]:
        return {
            "training_config": self.config.to_dict(),
            "reference_energies": {str(z): e for z, e in self.data.reference_energies.items()},
            "energy_shift": self.data.energy_shift,
            "n_train": len(self.data.train),
        }

    def best_payload(self, epoch: int) -> dict[str, Any]:
        """The checkpoint of the model's current weights (the best ones, after the core's
        ``fit``) before :func:`finalize_checkpoint`: not to be used as it is."""
        return {**self.model.to_checkpoint(), "metadata": self.metadata(), "epoch": epoch}

    def extra_state(self) -> dict[str, Any]:
        return {"data_fingerprint": data_fingerprint(self.data)}

    def load_extra_state(self, state: dict[str, Any]) -> bool:
        """False when the data differ from the checkpoint's (best tracking restarts)."""
        return state.get("data_fingerprint") == data_fingerprint(self.data)

    def history_extra(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "n_train": len(self.data.train),
            "n_valid": 0 if self.data.valid is None else len(self.data.valid),
            "reference_energies": {str(z): e for z, e in self.data.reference_energies.items()},
            "energy_shift_eV_atom": self.data.energy_shift,
        }


# ================================================================ entry points
@dataclass
class TrainResult:
    """Summary of one training run (one committee member)."""

    out: Path
    model_path: Path
    history: list[dict[str, Any]]
    best_epoch: int
    best_valid_loss: float | None
    stop_reason: str
    train_minutes: float
    n_train: int
    test_metrics: dict[str, float] | None = None


def finalize_checkpoint(
    model_path: Path,
    config: PotentialConfig,
    data: PreparedData,
    *,
    payload: dict[str, Any] | None = None,
) -> BayesianPotential:
    """Post-training steps on the model in ``model_path`` (or on ``payload``, the trained
    model's :meth:`PotentialTask.best_payload`), written to ``model_path``: the energy
    offsets refitted (``model.refit_offsets``, :mod:`mlip_unc.train.offsets`), the full
    posterior (``model.posterior: full``, Bayesian heads), the domain guard, the uncertainty
    levels for relative flagging thresholds (validation set, else training set). Run again
    after anything that changes the model's predictions (e.g. refitted energy offsets).
    The passes over the data run on ``train.device``; the model returned is there too."""
    if payload is None:
        payload = load_checkpoint(model_path, kind="potential")
    best = BayesianPotential.from_checkpoint(payload, allow_incomplete=True)
    best = best.to(resolve_device(config.train.device))
    batch_size = config.train.valid_batch_size
    bayesian = config.model.head is HeadKind.BAYESIAN
    metadata = dict(payload.get("metadata") or {})
    # the offsets before the posterior: its energy calibration reads the energy errors
    if config.model.refit_offsets:
        delta = refit_energy_offsets(best, data.train.graphs, batch_size=batch_size)
        if delta is not None:
            metadata["energy_offset_refit"] = {
                str(z): float(d) for z, d in zip(best.type_map, delta, strict=False)
            }
            log.info(
                "energy offsets refit (eV): %s",
                {z: round(float(d), 6) for z, d in zip(best.type_map, delta, strict=False)},
            )
    if bayesian and config.model.posterior is PosteriorKind.FULL:
        best.posterior_rank = config.model.posterior_rank
        best.posterior_basis = config.model.posterior_basis.value
        fit_on = random_subset(data.train.graphs, config.model.posterior_max_frames, config.seed)
        fit_start = time.perf_counter()
        metadata["posterior"] = fit_full_posterior(
            best,
            fit_on,
            data.valid,
            valid_force_frames=config.model.posterior_valid_frames,
            batch_size=batch_size,
            probes=config.model.posterior_probes,
            seed=config.seed,
        )
        metadata["posterior"]["fit_seconds"] = time.perf_counter() - fit_start  # wall, this process
    metadata["domain"] = DomainGuard.fit(data.train).to_dict()
    levels_data = data.valid if data.valid is not None and len(data.valid) else data.train
    if bayesian:
        metadata["uncertainty_levels"] = uncertainty_levels(
            best, levels_data, batch_size=batch_size
        )
    extra = {  # the model's own entries (format_version: its contents are written anew)
        k: v
        for k, v in payload.items()
        if k not in ("kind", "config", "model_state", "format", "version", "format_version")
    }
    save_checkpoint(model_path, {**best.to_checkpoint(), **extra, "metadata": metadata})
    return best


def _test_metrics(
    model: BayesianPotential, config: PotentialConfig, data: PreparedData
) -> dict[str, float] | None:
    if data.test is None:
        return None
    test = evaluate_potential(
        model, data.test, uncertainty="energy", batch_size=config.train.valid_batch_size
    ).metrics
    log.info(
        "test: E_mae=%.2f meV/atom F_mae=%.1f meV/A",
        test.get("energy_mae_meV_atom", float("nan")),
        test.get("forces_mae_meV_A", float("nan")),
    )
    return test


def train_potential(config: PotentialConfig, *, data: PreparedData | None = None) -> TrainResult:
    """Train one model (``train.ensemble`` is ignored here; see :func:`run_training`)."""
    data = prepare_data(config) if data is None else data
    out = Path(config.out)
    log.info(
        "%d training / %d validation structures, elements %s, out %s",
        len(data.train),
        0 if data.valid is None else len(data.valid),
        data.type_map.symbols,
        out,
    )
    task = PotentialTask(config, data, out)
    trainer = Trainer(
        task, config.train, seed=config.seed, out=out, history_extra=task.history_extra
    )
    result = trainer.fit(resume=config.train.resume, overwrite=config.train.overwrite)
    model_path = out / "model.pt"
    if not distributed.is_main():  # torchrun: rank 0 finalises and writes the model
        return TrainResult(
            out=out,
            model_path=model_path,
            history=result.history,
            best_epoch=result.best_epoch,
            best_valid_loss=None,
            stop_reason=result.stop_reason,
            train_minutes=result.minutes,
            n_train=len(data.train),
        )
    epoch = result.best_epoch if trainer.best["state"] is not None else trainer.epoch
    try:  # model.pt is written here, complete, or not at all
        final = finalize_checkpoint(model_path, config, data, payload=task.best_payload(epoch))
    except KeyboardInterrupt as err:
        raise TrainingInterrupted(out, trainer.saved_epoch) from err
    test = _test_metrics(final, config, data)
    if test is not None:
        history = {
            **task.history_extra(),
            "initial": result.initial,
            "epochs": result.history,
            "best_epoch": result.best_epoch,
            "stop_reason": result.stop_reason,
            "train_minutes": result.minutes,
            "test": test,
        }
        write_json(out / "history.json", history)
    best = None if not np.isfinite(result.best_metric) else result.best_metric
    return TrainResult(
        out=out,
        model_path=model_path,
        history=result.history,
        best_epoch=result.best_epoch,
        best_valid_loss=best,
        stop_reason=result.stop_reason,
        train_minutes=result.minutes,
        n_train=len(data.train),
        test_metrics=test,
    )


def train_ensemble(
    config: PotentialConfig, *, data: PreparedData | None = None
) -> list[TrainResult]:
    """Train ``train.ensemble`` members with seeds ``seed + k`` under ``out/member_k``.

    The data (and the validation split, from ``seed``) are shared; the members differ in
    their initialisation, batch order and posterior draws. ``out/ensemble.json`` lists them.
    """
    data = prepare_data(config) if data is None else data
    results = []
    for k in range(config.train.ensemble):
        member = config.updated(seed=config.seed + k, out=str(Path(config.out) / f"member_{k}"))
        log.info("ensemble member %d/%d (seed %d)", k + 1, config.train.ensemble, member.seed)
        results.append(train_potential(member, data=data))
    if distributed.is_main():
        write_json(
            Path(config.out) / "ensemble.json",
            {
                "members": [str(r.model_path.relative_to(config.out)) for r in results],
                "train_minutes": sum(r.train_minutes for r in results),
            },
        )
    return results


def run_training(config: PotentialConfig) -> list[TrainResult]:
    """One model, or a committee when ``train.ensemble > 1``; one result per model."""
    if config.train.ensemble > 1:
        return train_ensemble(config)
    return [train_potential(config)]
