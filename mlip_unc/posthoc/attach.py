"""Uncertainty for a MACE model someone already trained (``mlip-unc attach``), post hoc.

The MACE model's predictions are kept as they are; only the uncertainty is fitted, in minutes
on a CPU and without touching a MACE weight:

1. the saved model (mace-torch's ``.model``: a pickled module, loaded with
   ``weights_only=False`` here and nowhere else: only files from a trusted source) is rebuilt
   from plain data (:mod:`mlip_unc.nn.mace_config`) as the frozen ``mace_model`` backbone of a
   :class:`~mlip_unc.models.potential.BayesianPotential` with zero offsets and a zero head mean,
   so energies, forces and stress are the MACE model's own (its per-atom energies enter as the
   backbone's base energies, :mod:`mlip_unc.models.backbones`);
2. the head's latents are MACE's last-layer features (the inputs of its readouts' final linear
   maps), and the full-covariance last-layer posterior (LLPR,
   :func:`mlip_unc.posthoc.posterior.fit_full_posterior`) is accumulated over (at most
   ``max_train``, 200 by default) training structures with the energy and force noises set to
   the MACE model's residuals there, its ``lambda`` fitted on (at most ``max_valid``, 100)
   validation structures by NLL and its calibration scalars by moment matching there
   (``calibration="rmse"``: the mean epistemic variance equals the mean squared error of the
   MACE model's own predictions, in the exact and low-rank modes and for the energy; a model
   whose features cannot carry a calibrated posterior is refused with the measured reason,
   docs/guides/attach-calibration.md). Its cost is ``d + 1`` backward passes per
   structure (``d`` = 48 for a 32-channel two-layer MACE), hence the caps (attach's times:
   benchmarks/results/force_uncertainty_mace_rows.md); the domain guard sees every training
   structure;
3. the domain guard and the validation uncertainty levels are fitted as after training, and the
   result is written as an ordinary weights-only checkpoint that
   :class:`~mlip_unc.calculator.UncertaintyCalculator` loads like any other.

Before writing, a few validation structures are run through both the attached potential and
mace-torch's own ``MACECalculator``: a difference in energy or forces beyond rounding stops the
command (see :data:`AGREEMENT_TOL`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import ase
import numpy as np
import torch
from torch import nn
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.data import (
    DataError,
    StructureDataset,
    TypeMap,
    atoms_to_graph,
    random_split,
    read_structures,
)
from mlip_unc.data.domain import DomainGuard
from mlip_unc.evaluation.predictions import predict
from mlip_unc.models.backbones import build_backbone
from mlip_unc.models.checkpoint import save_checkpoint
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.nn.mace_backbone import MACEModelFeatures, import_mace
from mlip_unc.nn.mace_config import plain_mace_config
from mlip_unc.posthoc.levels import uncertainty_levels
from mlip_unc.posthoc.posterior import (
    PosteriorCalibrationError,
    fit_full_posterior,
    random_subset,
)

__all__ = [
    "AGREEMENT_TOL",
    "AttachResult",
    "attach_uncertainty",
    "load_mace_model",
    "potential_from_mace",
]

log = logging.getLogger(__name__)

AGREEMENT_TOL = {torch.float64: 1e-8, torch.float32: 1e-3}
"""Largest accepted difference (eV for the energy, eV/A for the forces, relative to
``max(1, |value|)``) between the attached potential and mace-torch's calculator. The two agree to
rounding, not bit for bit: the neighbour lists (vesin here, matscipy in mace-torch) order the
edges differently and the total energy is summed per atom instead of per contribution."""


@dataclass
class AttachResult:
    """What ``attach`` wrote: the checkpoint, the posterior fit and the MACE model's errors."""

    path: Path
    posterior: dict[str, Any]
    mace_errors: dict[str, float]
    agreement: dict[str, float]
    n_train: int
    """Training structures (all of them feed the domain guard)."""
    n_fit: int
    """Training structures the posterior was accumulated over (``max_train``)."""
    n_valid: int


def load_mace_model(path: str | os.PathLike) -> nn.Module:
    """A mace-torch model file (``torch.save`` of the module), unpickled on CPU.

    This is the one place where this package unpickles code (``weights_only=False``): a
    malicious file runs code at this point. Load only models from a source you trust.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MACE model {path} does not exist")
    import_mace("mace.modules")  # the pickled classes live there; a clear error if it is missing
    log.warning(
        "loading %s with pickle (weights_only=False): this runs code stored in the file; "
        "use only MACE models from a source you trust",
        path,
    )
    try:
        model = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 (truncated files, TorchScript archives, foreign pickles)
        raise ValueError(
            f"{path} is not a mace-torch model file ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"{path} holds a {type(model).__name__}, not a mace-torch model")
    return model


def potential_from_mace(
    mace_model: nn.Module,
    *,
    dtype: torch.dtype = torch.float64,
    energy_noise: float = 0.01,
    force_noise: float = 0.1,
    posterior_rank: int = 4,
    posterior_basis: str = "shared",
) -> BayesianPotential:
    """The MACE model as a frozen backbone under a zero-mean head: it predicts what MACE does
    (``posterior_basis``: the full posterior's weight space, as the config option)."""
    name, config = plain_mace_config(mace_model)
    backbone = cast(
        MACEModelFeatures, build_backbone("mace_model", mace_class=name, mace_config=config)
    )
    type_map = [int(z) for z in config["atomic_numbers"]]
    model = BayesianPotential(
        backbone,
        type_map,
        backbone.r_max,
        torch.zeros(len(type_map), dtype=torch.float64),
        energy_noise=energy_noise,
        force_noise=force_noise,
        learn_noise=False,
        posterior_rank=posterior_rank,
        posterior_basis=posterior_basis,
        gradient_method="loop",  # batched passes through MACE are slower (docs/what-we-tried.md)
    ).to(dtype)
    try:
        backbone.model.load_state_dict(mace_model.state_dict(), strict=True)  # copied into `dtype`
    except RuntimeError as err:
        raise ValueError(
            f"the MACE model's weights do not fit its rebuilt architecture: {err}"
        ) from None
    with torch.no_grad():
        model.head.weight_mu.zero_()
    return model.eval()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _residual_scales(
    model: BayesianPotential, data: StructureDataset, batch_size: int
) -> dict[str, float]:
    """The MACE model's errors on ``data``: per-atom energy and force-component MAE/RMSE."""
    pred = predict(model, data, batch_size=batch_size, stress=False)
    e_err = ((pred.energy_pred - pred.energy_true) / pred.num_atoms)[pred.has_energy.astype(bool)]
    f_err = (pred.forces_pred - pred.forces_true)[pred.atom_has_forces].reshape(-1)

    def stats(err: np.ndarray) -> tuple[float, float]:
        return (
            (float(np.mean(np.abs(err))), float(np.sqrt(np.mean(err**2))))
            if err.size
            else (math.nan, math.nan)
        )

    (e_mae, e_rmse), (f_mae, f_rmse) = stats(e_err), stats(f_err)
    return {
        "energy_mae_eV_atom": e_mae,
        "energy_rmse_eV_atom": e_rmse,
        "forces_mae_eV_A": f_mae,
        "forces_rmse_eV_A": f_rmse,
    }


def check_agreement(
    model: BayesianPotential,
    mace_model: nn.Module,
    structures: list[ase.Atoms],
    *,
    dtype: torch.dtype,
) -> dict[str, float]:
    """Max |energy| and |force| differences between ``model`` and mace-torch's ``MACECalculator``
    on ``structures``; ValueError beyond :data:`AGREEMENT_TOL`."""
    mace_calc = import_mace("mace.calculators").MACECalculator(
        models=mace_model, device="cpu", default_dtype=str(dtype).removeprefix("torch.")
    )
    type_map = TypeMap.from_list(model.type_map)
    de = df = 0.0
    for atoms in structures:
        batch = Batch.from_data_list([atoms_to_graph(atoms, model.r_max, type_map, dtype=dtype)])
        out = model(batch, compute_forces=True)
        e_a, f_a = (
            float(out[keys.ENERGY].detach().sum()),
            out[keys.FORCES].detach().double().numpy(),
        )
        mace_atoms = atoms.copy()
        mace_atoms.calc = mace_calc
        e_b, f_b = mace_atoms.get_potential_energy(), mace_atoms.get_forces()
        de = max(de, abs(e_a - e_b) / max(1.0, abs(e_b)))
        df = max(df, float(np.abs(f_a - f_b).max()) / max(1.0, float(np.abs(f_b).max())))
    tol = AGREEMENT_TOL[dtype]
    if not (de <= tol and df <= tol):
        raise ValueError(
            f"the attached model does not reproduce the MACE model (relative differences: energy "
            f"{de:.3g}, forces {df:.3g}; tolerance {tol:g}); the model is not supported"
        )
    return {"energy_rel_max": de, "forces_rel_max": df, "n_structures": len(structures)}


def _subset(idx: list[int], limit: int | None, seed: int) -> list[int]:
    """At most ``limit`` entries of ``idx`` (random, in order); all of them for ``limit`` None or 0."""
    return random_subset(idx, limit, seed)


def attach_uncertainty(
    model_path: str | os.PathLike,
    data_path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    valid_path: str | os.PathLike | None = None,
    valid_fraction: float = 0.1,
    energy_key: str | None = None,
    forces_key: str | None = None,
    index: str = ":",
    dtype: torch.dtype = torch.float64,
    posterior_rank: int = 4,
    posterior_basis: str = "shared",
    max_train: int | None = 200,
    max_valid: int | None = 100,
    batch_size: int = 8,
    seed: int = 0,
    posterior_probes: int = 0,
    overwrite: bool = False,
) -> AttachResult:
    """Fit the uncertainty of the MACE model in ``model_path`` on ``data_path`` and write ``out``
    (module docstring). ``valid_path``, else ``valid_fraction`` of the data (random, ``seed``),
    calibrates; ``valid_fraction=0`` calibrates in-sample on the training structures.
    ``max_train``/``max_valid`` cap the structures the posterior sees (random subsets; None or
    0: all). ``posterior_probes``: sketch the training structures' force precision with that many
    random sign probes per batch (forward-mode products, ``fit_full_posterior``; 0: exact).
    ``posterior_basis``: ``shared`` (MACE's ``d`` features) or ``per_element`` (``n_types * d``;
    exact, each structure costs ``min(n_types * d, 3 n_atoms)`` products instead of
    ``min(d, 3 n_atoms)``)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    model_path = Path(model_path)
    mace_model = load_mace_model(model_path)
    base = potential_from_mace(mace_model, dtype=dtype, posterior_rank=posterior_rank)
    type_map = TypeMap.from_list(base.type_map)

    def read(path: str | os.PathLike) -> list[ase.Atoms]:
        frames = read_structures(path, index=index, energy_key=energy_key, forces_key=forces_key)
        return [a for a in frames if len(a) > 1]  # one-atom frames carry no latent (z - z_iso = 0)

    def dataset(frames: list[ase.Atoms], source: Any, idx: list[int] | None) -> StructureDataset:
        return StructureDataset.from_atoms(
            frames,
            base.r_max,
            type_map,
            energy_key=energy_key,
            forces_key=forces_key,
            frame_indices=idx,
            source=source,
            dtype=dtype,
        )

    frames = read(data_path)
    if valid_path is not None:
        train_idx, valid_idx, valid_frames = list(range(len(frames))), [], read(valid_path)
        valid_frames = [
            valid_frames[k] for k in _subset(list(range(len(valid_frames))), max_valid, seed)
        ]
    elif valid_fraction > 0:
        split = random_split(len(frames), (1.0 - valid_fraction, valid_fraction, 0.0), seed=seed)
        train_idx = list(split.train)
        valid_idx = _subset(list(split.val) + list(split.test), max_valid, seed)
        valid_frames = [frames[k] for k in valid_idx]
    else:
        train_idx, valid_idx, valid_frames = list(range(len(frames))), [], []
    if not train_idx:
        raise DataError(f"'{data_path}': no multi-atom structures to fit the uncertainty on")
    fit_idx = _subset(train_idx, max_train, seed)
    train = dataset([frames[k] for k in fit_idx], str(data_path), fit_idx)
    valid = (
        dataset(valid_frames, str(valid_path or data_path), valid_idx or None)
        if valid_frames
        else None
    )
    agreement = check_agreement(base, mace_model, (valid_frames or frames)[:3], dtype=dtype)
    scales = _residual_scales(base, train, batch_size)
    noise_e = (
        max(scales["energy_rmse_eV_atom"], 1e-6)
        if math.isfinite(scales["energy_rmse_eV_atom"])
        else 0.01
    )
    noise_f = (
        max(scales["forces_rmse_eV_A"], 1e-6) if math.isfinite(scales["forces_rmse_eV_A"]) else 0.1
    )
    model = potential_from_mace(
        mace_model,
        dtype=dtype,
        energy_noise=noise_e,
        force_noise=noise_f,
        posterior_rank=posterior_rank,
        posterior_basis=posterior_basis,
    )
    try:
        posterior = fit_full_posterior(
            model,
            train,
            valid,
            batch_size=batch_size,
            calibration="rmse",
            probes=posterior_probes or None,
            seed=seed,
        )
    except PosteriorCalibrationError as err:
        raise PosteriorCalibrationError(
            f"cannot attach an uncertainty to {model_path}: {err}"
        ) from None
    levels_data = valid if valid is not None else train
    n_valid = 0 if valid is None else len(valid)
    mace_errors = _residual_scales(model, levels_data, batch_size)
    metadata = {
        "attach": {
            "mace_model": str(model_path),
            "mace_model_sha256": _sha256(model_path),
            "data": str(data_path),
            "valid": None if valid_path is None else str(valid_path),
            "valid_fraction": valid_fraction,
            "seed": seed,
            "n_train": len(train_idx),
            "n_fit": len(train),
            "n_valid": n_valid,
            "mace_errors_on": "valid" if valid is not None else "train",
            "mace_errors": mace_errors,
            "agreement_with_mace_calculator": agreement,
        },
        "posterior": posterior,
        "domain": DomainGuard.fit([frames[k] for k in train_idx], base.r_max).to_dict(),
        "uncertainty_levels": uncertainty_levels(model, levels_data, batch_size=batch_size),
    }
    path = save_checkpoint(out, {**model.to_checkpoint(), "metadata": metadata})
    log.info(
        "attached: %s (posterior on %d of %d training structures, calibrated on %d; MACE force MAE %.1f meV/A)",
        path,
        len(train),
        len(train_idx),
        n_valid,
        1e3 * mace_errors["forces_mae_eV_A"],
    )
    return AttachResult(
        path=Path(path),
        posterior=posterior,
        mace_errors=mace_errors,
        agreement=agreement,
        n_train=len(train_idx),
        n_fit=len(train),
        n_valid=n_valid,
    )
