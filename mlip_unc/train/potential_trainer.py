"""Training of a :class:`~mlip_unc.models.potential.BayesianPotential` (docs/method.md s. 2-3, 5-6).

Data flow: files -> :func:`prepare_data` (reference energies, split, graphs built once,
statistics) -> :func:`build_model` -> :func:`train_potential` (epochs of one posterior weight
draw per batch and one backward pass; validation at the posterior mean; atomic checkpoints).

Outputs in ``config.out`` (``out/member_k`` for ensemble members):

* ``model.pt``: the best model on validation (``BayesianPotential.from_checkpoint`` loads it;
  ``metadata`` holds the training config, epoch and reference energies);
* ``last.pt``: model, optimiser, scheduler, EMA and generator states for ``train.resume``;
* ``history.json``: per-epoch losses and validation metrics, rewritten after every epoch;
* ``config.yaml``: the resolved config.

The loss is :mod:`mlip_unc.train.potential_losses`: weighted NLL + beta KL / N_train with
N_train the number of training structures, plus lambda(epoch) times an optional latent term
of :mod:`mlip_unc.train.regularizers` on the per-atom latents z_a (``NODE_LATENT``).
A ``map`` head trains the posterior mean only (its std frozen at ~0, no KL): a deterministic
model, e.g. one member of the committee baseline (``train.ensemble: M``).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import ase
import numpy as np
import torch
import yaml
from torch import nn
from torch_geometric.loader import DataLoader
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.data.errors import DataError
from mlip_unc.data.splits import random_split
from mlip_unc.data.structures import (
    StructureDataset,
    TypeMap,
    fit_reference_energies,
    frame_energy,
    read_structures,
)
from mlip_unc.models.potential import BayesianPotential, build_backbone
from mlip_unc.train.checkpoint import load_checkpoint, save_checkpoint
from mlip_unc.train.evaluate import evaluate_potential, predict, uncertainty_levels
from mlip_unc.train.potential_config import (
    ConfigError,
    HeadKind,
    LRSchedule,
    PotentialConfig,
    ReferenceEnergies,
    config_to_dict,
)
from mlip_unc.train.potential_losses import (
    energy_nll,
    forces_nll,
    likelihood_terms,
    potential_loss,
)
from mlip_unc.train.regularizers import LambdaSchedule, RegularizerKind, regularizer_term

__all__ = [
    "PreparedData",
    "TrainResult",
    "prepare_data",
    "build_model",
    "train_potential",
    "train_ensemble",
    "run_training",
]

Log = Callable[[str], None]
_MAP_STD = 1e-8  # posterior std of a MAP head: the weight draw is the mean to ~1e-8


# ================================================================ data
@dataclass
class PreparedData:
    """Everything read from the files, built once and shared by ensemble members.

    Attributes:
        train, valid, test: graph datasets (valid/test may be None).
        type_map: elements of the training and validation structures.
        reference_energies: E0(Z), eV, atomic number -> energy.
        energy_shift: mean of (E - sum E0) / n over the training set, eV/atom.
        energy_std: std of the same per-atom residuals, eV/atom.
        force_rms: RMS of the training force components, eV/A.
        avg_num_neighbors: mean number of neighbours within r_max in the training set.
    """

    train: StructureDataset
    valid: StructureDataset | None
    test: StructureDataset | None
    type_map: TypeMap
    reference_energies: dict[int, float]
    energy_shift: float
    energy_std: float
    force_rms: float
    avg_num_neighbors: float


def _read(path: str, config: PotentialConfig, *, forces: bool = True) -> list[ase.Atoms]:
    data = config.data
    return read_structures(
        path, index=data.index, energy_key=data.energy_key, forces_key=data.forces_key,
        stress_key=data.stress_key, require_forces=forces,
        require_stress=config.loss.stress_weight > 0,
    )  # fmt: skip


def _is_isolated(atoms: ase.Atoms) -> bool:
    return len(atoms) == 1


def _reference_energies(
    kind: ReferenceEnergies, isolated: list[ase.Atoms], frames: list[ase.Atoms], elements: Sequence[int],
    energy_key: str,
) -> dict[int, float]:
    if kind is ReferenceEnergies.ZERO:
        return {int(z): 0.0 for z in elements}
    if kind is ReferenceEnergies.LEAST_SQUARES:
        refs = fit_reference_energies(frames, energy_key)
    elif kind is ReferenceEnergies.ISOLATED:
        if not isolated:
            raise ConfigError("model.reference_energies: 'isolated' needs data.isolated_atoms or one-atom frames")
        refs = fit_reference_energies(isolated, energy_key)
    else:
        refs = fit_reference_energies(isolated + frames, energy_key)
    missing = [int(z) for z in elements if int(z) not in refs]
    if missing:
        raise ConfigError(f"model.reference_energies: no reference energy for elements {missing}")
    return {int(z): float(refs[int(z)]) for z in elements}


def _split(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    if fraction <= 0:
        return list(range(n)), []
    split = random_split(n, (1.0 - fraction, fraction, 0.0), seed=seed)
    if not split.train or not split.val:
        raise ConfigError(f"data.valid_fraction: {fraction} of {n} frames leaves an empty part")
    return list(split.train), list(split.val) + list(split.test)


def _dataset(atoms: list[ase.Atoms], config: PotentialConfig, type_map: TypeMap, source: str,
             frames: Sequence[int] | None = None) -> StructureDataset:
    data = config.data
    return StructureDataset.from_atoms(
        atoms, data.r_max, type_map, energy_key=data.energy_key, forces_key=data.forces_key,
        stress_key=data.stress_key, frame_indices=frames, source=source,
        dtype=getattr(torch, config.dtype.value),
    )  # fmt: skip


def _statistics(train: list[ase.Atoms], refs: dict[int, float], energy_key: str) -> tuple[float, float]:
    residuals = []
    for atoms in train:
        energy = frame_energy(atoms, energy_key)
        if energy is not None:
            residuals.append((energy - sum(refs[int(z)] for z in atoms.numbers)) / len(atoms))
    if not residuals:
        return 0.0, 1.0
    return float(np.mean(residuals)), float(np.std(residuals))


def prepare_data(config: PotentialConfig) -> PreparedData:
    """Read, split and convert the data of ``config``; fit reference energies and statistics.

    One-atom frames in the training file go to the reference energies, not the training set.
    """
    data = config.data
    frames = _read(data.train, config)
    isolated = [a for a in frames if _is_isolated(a)]
    frames_idx = [k for k, a in enumerate(frames) if not _is_isolated(a)]
    if data.isolated_atoms:
        isolated += read_structures(data.isolated_atoms, energy_key=data.energy_key, require_forces=False)
    if data.valid:
        train_idx, valid_atoms = frames_idx, [a for a in _read(data.valid, config) if not _is_isolated(a)]
        valid_idx: list[int] = []
    else:
        pos_train, pos_valid = _split(len(frames_idx), data.valid_fraction, config.seed)
        train_idx, valid_idx = [frames_idx[k] for k in pos_train], [frames_idx[k] for k in pos_valid]
        valid_atoms = [frames[k] for k in valid_idx]
    if data.max_train is not None and data.max_train < len(train_idx):
        keep = np.random.default_rng(config.seed).permutation(len(train_idx))[: data.max_train]
        train_idx = [train_idx[k] for k in sorted(keep)]
    if not train_idx:
        raise DataError(f"'{data.train}': no multi-atom training frames")
    train_atoms = [frames[k] for k in train_idx]
    type_map = TypeMap.from_atoms_list([*train_atoms, *valid_atoms])
    refs = _reference_energies(
        config.model.reference_energies, isolated, train_atoms, type_map.atomic_numbers, data.energy_key
    )
    train = _dataset(train_atoms, config, type_map, data.train, train_idx)
    valid = None
    if valid_atoms:
        valid_source = data.valid or data.train
        valid = _dataset(valid_atoms, config, type_map, valid_source, valid_idx or None)
    test = None
    if data.test:
        test_atoms = [a for a in _read(data.test, config, forces=False) if not _is_isolated(a)]
        test = _dataset(test_atoms, config, type_map, data.test)
    shift, std = _statistics(train_atoms, refs, data.energy_key)
    forces = torch.cat([g[keys.FORCES] for g in train.graphs if bool(g[keys.HAS_FORCES])] or [torch.zeros(1, 3)])
    n_edges = sum(g[keys.EDGE_INDEX].shape[1] for g in train.graphs)
    n_atoms = sum(g.num_nodes for g in train.graphs)
    return PreparedData(
        train=train, valid=valid, test=test, type_map=type_map, reference_energies=refs,
        energy_shift=shift, energy_std=std, force_rms=float(forces.pow(2).mean().sqrt()),
        avg_num_neighbors=max(n_edges / max(n_atoms, 1), 1.0),
    )  # fmt: skip


# ================================================================ model
_RESERVED_BACKBONE_KWARGS = {"num_types": "the type map", "latent_dim": "model.latent_dim"}


def build_model(config: PotentialConfig, data: PreparedData, *, seed: int | None = None) -> BayesianPotential:
    """The potential of ``config`` with offsets, noise and neighbour statistics from ``data``.

    With ``model.standardise`` the per-element offsets are E0(Z) + the mean per-atom
    residual, and the initial noise stds are the per-atom residual std and the force RMS (the
    errors of a constant predictor), so the first NLL values are of order one. Parameters are
    initialised from ``seed`` (default ``config.seed``) without touching the global RNG.
    """
    model_cfg = config.model
    for key, instead in _RESERVED_BACKBONE_KWARGS.items():
        if key in model_cfg.backbone_kwargs:
            raise ConfigError(f"model.backbone_kwargs.{key}: set by {instead}, remove it here")
    kwargs = {
        "num_types": len(data.type_map), "r_max": config.data.r_max,
        "latent_dim": model_cfg.latent_dim, "avg_num_neighbors": data.avg_num_neighbors,
        **model_cfg.backbone_kwargs,
    }  # fmt: skip
    offsets = torch.tensor([data.reference_energies[z] for z in data.type_map.atomic_numbers], dtype=torch.float64)
    noise = {}
    if model_cfg.standardise:
        offsets = offsets + data.energy_shift
        noise = {"energy_noise": max(data.energy_std, 1e-3), "force_noise": max(data.force_rms, 1e-3)}
    init_std = _MAP_STD if model_cfg.head is HeadKind.MAP else model_cfg.init_std
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed if seed is None else seed)
        try:
            backbone = build_backbone(model_cfg.backbone.value, **kwargs)
        except TypeError as err:
            raise ConfigError(f"model.backbone_kwargs: {err}") from None
        model = BayesianPotential(
            backbone, data.type_map.to_list(), config.data.r_max, offsets,
            prior_std=model_cfg.prior_std, init_std=init_std, **noise,
        )  # fmt: skip
    if model_cfg.head is HeadKind.MAP:
        model.head.weight_rho.requires_grad_(False)
    return model.to(getattr(torch, config.dtype.value))


def _init_from(config: PotentialConfig, data: PreparedData) -> BayesianPotential:
    """The model of checkpoint ``train.init_from`` (architecture, offsets and weights), for
    fine-tuning; its elements must cover the data and its cutoff must not exceed data.r_max."""
    path = config.train.init_from
    model = BayesianPotential.from_checkpoint(path)
    missing = [z for z in data.type_map.atomic_numbers if z not in model.type_map]
    if missing:
        raise ConfigError(f"train.init_from: {path} has no element(s) {missing} of the training data")
    if model.r_max > config.data.r_max + 1e-12:
        raise ConfigError(f"train.init_from: {path} has r_max {model.r_max} > data.r_max {config.data.r_max}")
    if config.model.head is HeadKind.MAP:
        model.head.weight_rho.requires_grad_(False)
    return model.to(getattr(torch, config.dtype.value))


# ================================================================ training helpers
class EMA:
    """Exponential moving average of the trainable parameters (``swap`` to use it)."""

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.decay = decay
        self.shadow = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        for name, param in model.named_parameters():
            if name in self.shadow:
                self.shadow[name].lerp_(param.detach(), 1.0 - self.decay)

    @torch.no_grad()
    def swap(self, model: nn.Module) -> None:
        """Exchange the model's parameters with the averages (call twice to undo)."""
        for name, param in model.named_parameters():
            if name in self.shadow:
                tmp = param.detach().clone()
                param.copy_(self.shadow[name])
                self.shadow[name] = tmp

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "shadow": dict(self.shadow)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.decay = float(state["decay"])
        self.shadow = {k: v.clone() for k, v in state["shadow"].items()}


def _scheduler(optimizer: torch.optim.Optimizer, config: PotentialConfig):
    train = config.train
    if train.lr_schedule is LRSchedule.PLATEAU:
        return torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, factor=train.lr_factor, patience=train.lr_patience, min_lr=train.min_lr
        )
    return None  # constant, or cosine set per step by _Run.cosine_lr


def _progress_enabled(flag: bool | None) -> bool:
    return bool(sys.stderr.isatty()) if flag is None else flag


def _beta(config: PotentialConfig, epoch: float) -> float:
    warm = config.loss.kl_warmup_epochs
    return config.loss.beta if warm == 0 else config.loss.beta * min(1.0, epoch / warm)


def _weights(config: PotentialConfig) -> dict[str, float]:
    loss = config.loss
    return {"energy": loss.energy_weight, "forces": loss.forces_weight, "stress": loss.stress_weight}


def _write_json(path: Path, payload: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=_json_default))
    os.replace(tmp, path)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def data_fingerprint(data: PreparedData) -> list[float]:
    """Counts and energy sums of the training and validation sets (detects changed data)."""
    out = []
    for dataset in (data.train, data.valid):
        graphs = [] if dataset is None else dataset.graphs
        out += [float(len(graphs)), round(float(sum(float(g[keys.ENERGY].sum()) for g in graphs)), 6)]
    return out


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


@dataclass
class TrainResult:
    """Summary of one training run (one ensemble member)."""

    out: Path
    model_path: Path
    history: list[dict[str, Any]]
    best_epoch: int
    best_valid_loss: float | None
    stop_reason: str
    train_minutes: float
    n_train: int
    test_metrics: dict[str, float] | None = None


# ================================================================ the run
class _Run:
    """State of one training run; :meth:`fit` is the loop."""

    def __init__(self, config: PotentialConfig, data: PreparedData, out: Path, log: Log | None) -> None:
        self.config, self.data, self.out, self.log = config, data, out, log or (lambda _: None)
        self.model = build_model(config, data) if config.train.init_from is None else _init_from(config, data)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.Adam(params, lr=config.train.lr, weight_decay=config.train.weight_decay)
        self.scheduler = _scheduler(self.optimizer, config)
        self.ema = EMA(self.model, config.train.ema_decay) if config.train.ema_decay else None
        self.loader_rng = torch.Generator().manual_seed(config.seed)
        self.sample_rng = torch.Generator().manual_seed(config.seed + 1_000_003)
        self.lam = LambdaSchedule(
            config.regularizer.warmup_epochs, config.regularizer.ramp_epochs, config.regularizer.lambda_max
        )
        self.epoch, self.history, self.initial = 0, [], None
        self.best_epoch, self.best_loss, self.bad_epochs = 0, math.inf, 0
        self.elapsed_before, self.start = 0.0, time.monotonic()
        self.bayesian = config.model.head is HeadKind.BAYESIAN

    # -------------------------------------------------------------- time and stopping
    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.start

    def over_budget(self) -> bool:
        minutes = self.config.train.max_minutes
        return minutes is not None and self.elapsed() >= 60.0 * minutes

    def stop_reason(self) -> str | None:
        train = self.config.train
        if self.epoch >= train.epochs:
            return "epochs"
        if self.over_budget() and self.epoch > 0:  # a fresh run trains at least one batch
            return "time"
        if train.patience is not None and self.bad_epochs >= train.patience:
            return "early_stopping"
        return None

    # -------------------------------------------------------------- one epoch
    def train_epoch(self) -> dict[str, float]:
        config, model = self.config, self.model
        loader = DataLoader(
            self.data.train.graphs, batch_size=config.train.batch_size, shuffle=True, generator=self.loader_rng
        )
        model.train()
        sums: dict[str, float] = {}
        n_batches = len(loader)
        bar = tqdm(loader, disable=not _progress_enabled(config.train.progress), leave=False,
                   desc=f"epoch {self.epoch + 1}")  # fmt: skip
        done = 0
        for step, batch in enumerate(bar):
            epoch_f = self.epoch + step / n_batches
            terms = self.step(batch, epoch_f)
            for name, value in terms.items():
                sums[name] = sums.get(name, 0.0) + value
            done += 1
            bar.set_postfix(loss=f"{terms['loss']:.4g}", refresh=False)
            if self.over_budget():
                break
        stats = {f"train_{k}": v / max(done, 1) for k, v in sums.items()}
        stats["partial"] = done < n_batches
        stats["lambda"] = self.lam(self.epoch)
        stats["beta"] = _beta(config, self.epoch) if self.bayesian else 0.0
        return stats

    def progress(self, epoch_f: float) -> float:
        """Fraction of training done: the larger of the epoch and the wall-time fractions."""
        train = self.config.train
        done = epoch_f / train.epochs
        if train.max_minutes is not None:
            done = max(done, self.elapsed() / (60.0 * train.max_minutes))
        return min(done, 1.0)

    def cosine_lr(self, epoch_f: float) -> None:
        train = self.config.train
        lr = train.min_lr + 0.5 * (train.lr - train.min_lr) * (1.0 + math.cos(math.pi * self.progress(epoch_f)))
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self, batch, epoch_f: float) -> dict[str, float]:
        config, model = self.config, self.model
        if config.train.lr_schedule is LRSchedule.COSINE:
            self.cosine_lr(epoch_f)
        use_stress = config.loss.stress_weight > 0
        out = model(batch, training=True, compute_stress=use_stress, generator=self.sample_rng)
        noise = model.noise_variances(batch)
        if use_stress:
            noise[keys.STRESS] = out[keys.STRESS].new_tensor(config.loss.stress_noise**2)
        nll = likelihood_terms(out, batch, noise, use_stress=use_stress)
        lam = self.lam(epoch_f)
        reg = None
        if config.regularizer.kind is not RegularizerKind.NONE and lam > 0:
            mu, s2 = model.posterior()
            reg = regularizer_term(config.regularizer.kind, out[keys.NODE_LATENT], mu, s2)
        parts = potential_loss(
            nll, _weights(config), kl=model.kl() if self.bayesian else None,
            beta=_beta(config, epoch_f), n_train=len(self.data.train), regularizer=reg, lam=lam,
        )  # fmt: skip
        self.optimizer.zero_grad(set_to_none=True)
        parts["loss"].backward()
        if config.train.grad_clip is not None:
            nn.utils.clip_grad_norm_(model.parameters(), config.train.grad_clip)
        self.optimizer.step()
        if self.ema is not None:
            self.ema.update(model)
        values = {name: float(value.detach()) for name, value in parts.items()}
        values.update({f"{name}_nll": float(value.detach()) for name, value in nll.items()})
        return values

    # -------------------------------------------------------------- validation
    def validate(self) -> dict[str, float]:
        """Valid loss (weighted NLL at the posterior mean, noise variances only) and MAEs."""
        dataset = self.data.valid if self.data.valid is not None else self.data.train
        if self.ema is not None:
            self.ema.swap(self.model)
        try:
            pred = predict(self.model, dataset, batch_size=self.config.train.valid_batch_size)
        finally:
            if self.ema is not None:
                self.ema.swap(self.model)
        as_t = torch.as_tensor
        e_mask, a_mask = pred.has_energy, pred.atom_has_forces
        w = _weights(self.config)
        loss = 0.0
        if e_mask.any() and w["energy"] > 0:
            loss += w["energy"] * float(energy_nll(
                as_t(pred.energy_pred[e_mask]), as_t(pred.energy_true[e_mask]),
                as_t(pred.num_atoms[e_mask]), as_t(pred.energy_noise_var[e_mask]),
            ))  # fmt: skip
        f_mask = pred.has_forces
        if f_mask.any() and w["forces"] > 0:
            loss += w["forces"] * float(forces_nll(
                as_t(pred.forces_pred), as_t(pred.forces_true), as_t(pred.forces_noise_var),
                as_t(pred.atom_frame), as_t(f_mask), pred.n_frames,
            ))  # fmt: skip
        e_err = (pred.energy_pred - pred.energy_true)[e_mask] / pred.num_atoms[e_mask]
        f_err = (pred.forces_pred - pred.forces_true)[a_mask]
        mu, s2 = self.model.posterior()
        return {
            "valid_loss": loss,
            "valid_energy_mae_meV_atom": 1e3 * float(np.mean(np.abs(e_err))) if e_err.size else float("nan"),
            "valid_energy_rmse_meV_atom": 1e3 * float(np.sqrt(np.mean(e_err**2))) if e_err.size else float("nan"),
            "valid_forces_mae_meV_A": 1e3 * float(np.mean(np.abs(f_err))) if f_err.size else float("nan"),
            "valid_forces_rmse_meV_A": 1e3 * float(np.sqrt(np.mean(f_err**2))) if f_err.size else float("nan"),
            "sigma_e_meV_atom": 1e3 * float(self.model.energy_noise.detach()),
            "sigma_f_meV_A": 1e3 * float(self.model.force_noise.detach()),
            "posterior_std_mean": float(s2.detach().sqrt().mean()),
            "kl": float(self.model.kl().detach()),
        }

    # -------------------------------------------------------------- checkpoints
    def metadata(self) -> dict[str, Any]:
        return {
            "training_config": config_to_dict(self.config),
            "reference_energies": {str(z): e for z, e in self.data.reference_energies.items()},
            "energy_shift": self.data.energy_shift,
            "n_train": len(self.data.train),
        }

    def save_best(self) -> None:
        if self.ema is not None:
            self.ema.swap(self.model)
        try:
            payload = {**self.model.to_checkpoint(), "metadata": self.metadata(), "epoch": self.epoch}
            save_checkpoint(self.out / "model.pt", payload)
        finally:
            if self.ema is not None:
                self.ema.swap(self.model)

    def save_last(self, stop_reason: str | None) -> None:
        payload = {
            "kind": "potential_training",
            "model": self.model.to_checkpoint(),
            "optimizer_state": self.optimizer.state_dict(),
            "scheduler_state": None if self.scheduler is None else self.scheduler.state_dict(),
            "ema_state": None if self.ema is None else self.ema.state_dict(),
            "epoch": self.epoch,
            "history": self.history,
            "initial": self.initial,
            "best": {"epoch": self.best_epoch, "loss": self.best_loss, "bad_epochs": self.bad_epochs},
            "loader_rng": self.loader_rng.get_state(),
            "sample_rng": self.sample_rng.get_state(),
            "elapsed_s": self.elapsed(),
            "stop_reason": stop_reason,
            "metadata": self.metadata(),
            "data_fingerprint": data_fingerprint(self.data),
        }
        save_checkpoint(self.out / "last.pt", payload)

    def restore(self, path: Path) -> None:
        state = load_checkpoint(path, kind="potential_training")
        self.model.load_state_dict(state["model"]["model_state"])
        self.optimizer.load_state_dict(state["optimizer_state"])
        if self.scheduler is not None and state["scheduler_state"] is not None:
            self.scheduler.load_state_dict(state["scheduler_state"])
        if self.ema is not None and state["ema_state"] is not None:
            self.ema.load_state_dict(state["ema_state"])
        self.epoch, self.history, self.initial = int(state["epoch"]), list(state["history"]), state["initial"]
        best = state["best"]
        self.best_epoch, self.best_loss, self.bad_epochs = int(best["epoch"]), float(best["loss"]), int(best["bad_epochs"])
        if state.get("data_fingerprint") != data_fingerprint(self.data):
            self.best_epoch, self.best_loss, self.bad_epochs = 0, math.inf, 0
            self.log("the data differ from the run in last.pt: best-on-validation tracking restarts")
        self.loader_rng.set_state(state["loader_rng"])
        self.sample_rng.set_state(state["sample_rng"])
        self.elapsed_before, self.start = float(state["elapsed_s"]), time.monotonic()
        self.log(f"resumed from {path} at epoch {self.epoch}")

    def write_history(self, stop_reason: str | None, test: dict | None = None) -> None:
        payload = {
            "config": config_to_dict(self.config),
            "n_train": len(self.data.train),
            "n_valid": 0 if self.data.valid is None else len(self.data.valid),
            "reference_energies": {str(z): e for z, e in self.data.reference_energies.items()},
            "energy_shift_eV_atom": self.data.energy_shift,
            "initial": self.initial,
            "epochs": self.history,
            "best_epoch": self.best_epoch,
            "best_valid_loss": _finite(self.best_loss),
            "stop_reason": stop_reason,
            "train_minutes": self.elapsed() / 60.0,
        }
        if test is not None:
            payload["test"] = test
        _write_json(self.out / "history.json", payload)

    # -------------------------------------------------------------- the loop
    def fit(self) -> TrainResult:
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "config.yaml").write_text(yaml.safe_dump(config_to_dict(self.config), sort_keys=False))
        last = self.out / "last.pt"
        if self.config.train.resume and last.is_file():
            self.restore(last)
        if self.initial is None:
            self.initial = self.validate()
            self.log(f"initial: {_describe(self.initial)}")
        reason = self.stop_reason()
        while reason is None:
            record = self.train_epoch()
            self.epoch += 1
            record.update(self.validate())
            record.update({"epoch": self.epoch, "lr": self.optimizer.param_groups[0]["lr"],
                           "elapsed_s": self.elapsed()})  # fmt: skip
            self.after_epoch(record)
            reason = self.stop_reason()
            self.save_last(reason)
            self.write_history(reason)
        self.log(f"stopped ({reason}) after {self.epoch} epochs, {self.elapsed() / 60:.2f} min; "
                 f"best epoch {self.best_epoch}")  # fmt: skip
        return self.finish(reason)

    def after_epoch(self, record: dict[str, Any]) -> None:
        loss = record["valid_loss"]
        if loss < self.best_loss or self.best_epoch == 0:
            self.best_loss, self.best_epoch, self.bad_epochs = loss, self.epoch, 0
            self.save_best()
        else:
            self.bad_epochs += 1
        if self.scheduler is not None:
            self.scheduler.step(loss)
        self.history.append(record)
        self.log(f"epoch {self.epoch}: {_describe(record)}")

    def _store_uncertainty_levels(self, model_path: Path) -> None:
        """Validation-set uncertainty levels into the best checkpoint (relative thresholds)."""
        if not len(self.data.valid) or self.config.model.head is not HeadKind.BAYESIAN:
            return
        payload = load_checkpoint(model_path, kind="potential")
        best = BayesianPotential.from_checkpoint(payload)
        levels = uncertainty_levels(best, self.data.valid, batch_size=self.config.train.valid_batch_size)
        payload["metadata"] = {**(payload.get("metadata") or {}), "uncertainty_levels": levels}
        save_checkpoint(model_path, payload)

    def finish(self, reason: str) -> TrainResult:
        model_path = self.out / "model.pt"
        if not model_path.is_file():  # e.g. resumed after the budget was already spent
            self.save_best()
        self._store_uncertainty_levels(model_path)
        test = None
        if self.data.test is not None:
            best = BayesianPotential.from_checkpoint(model_path)
            test = evaluate_potential(best, self.data.test, uncertainty="energy",
                                      batch_size=self.config.train.valid_batch_size).metrics  # fmt: skip
            self.log(f"test: {_describe(test)}")
        self.write_history(reason, test)
        return TrainResult(
            out=self.out, model_path=model_path, history=self.history, best_epoch=self.best_epoch,
            best_valid_loss=_finite(self.best_loss), stop_reason=reason,
            train_minutes=self.elapsed() / 60.0, n_train=len(self.data.train), test_metrics=test,
        )  # fmt: skip


_SHOWN = (
    ("train_loss", "loss", "{:.4g}"), ("valid_loss", "valid", "{:.4g}"),
    ("valid_energy_mae_meV_atom", "E_mae", "{:.2f}"), ("valid_forces_mae_meV_A", "F_mae", "{:.1f}"),
    ("energy_mae_meV_atom", "E_mae", "{:.2f}"), ("forces_mae_meV_A", "F_mae", "{:.1f}"),
    ("lr", "lr", "{:.2g}"),
)


def _describe(record: dict[str, Any]) -> str:
    return " ".join(f"{label}={fmt.format(record[k])}" for k, label, fmt in _SHOWN if k in record)


# ================================================================ entry points
def train_potential(
    config: PotentialConfig, *, data: PreparedData | None = None, log: Log | None = None
) -> TrainResult:
    """Train one model (``train.ensemble`` is ignored here; see :func:`run_training`)."""
    data = prepare_data(config) if data is None else data
    if log is not None:
        log(f"{len(data.train)} training / {0 if data.valid is None else len(data.valid)} validation "
            f"structures, elements {data.type_map.symbols}, out {config.out}")  # fmt: skip
    return _Run(config, data, Path(config.out), log).fit()


def train_ensemble(config: PotentialConfig, *, data: PreparedData | None = None, log: Log | None = None
                   ) -> list[TrainResult]:  # fmt: skip
    """Train ``train.ensemble`` members with seeds ``seed + k`` under ``out/member_k``.

    The data (and the validation split, from ``seed``) are shared; the members differ in
    their initialisation, batch order and posterior draws. ``out/ensemble.json`` lists them.
    """
    data = prepare_data(config) if data is None else data
    results = []
    for k in range(config.train.ensemble):
        member = replace(config, seed=config.seed + k, out=str(Path(config.out) / f"member_{k}"))
        if log is not None:
            log(f"ensemble member {k + 1}/{config.train.ensemble} (seed {member.seed})")
        results.append(train_potential(member, data=data, log=log))
    Path(config.out).mkdir(parents=True, exist_ok=True)
    _write_json(Path(config.out) / "ensemble.json", {
        "members": [str(r.model_path.relative_to(config.out)) for r in results],
        "train_minutes": sum(r.train_minutes for r in results),
    })  # fmt: skip
    return results


def run_training(config: PotentialConfig, *, log: Log | None = None) -> list[TrainResult]:
    """One model, or an ensemble when ``train.ensemble > 1``; one result per model."""
    if config.train.ensemble > 1:
        return train_ensemble(config, log=log)
    return [train_potential(config, log=log)]
