"""Training inside active learning: in-memory labelled frames -> ``model.pt`` with levels.

:func:`train_model` writes the frames to extxyz files, completes a ``mlip-unc train``
mapping with them and calls :func:`mlip_unc.train.potential.train_potential`. The trainer
stores the validation-set uncertainty levels in the checkpoint (what relative flagging
thresholds multiply); when it stores none (no validation structures, a MAP head), they are
computed once by the same function, :func:`mlip_unc.posthoc.levels.uncertainty_levels`, on
the validation structures or, without any, on the training structures.

:func:`refit_energy_offsets` shifts the per-element energy offsets after training (for runs
whose energy weight is small).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ase import Atoms

from mlip_unc.active.data import write_frames

__all__ = [
    "train_model",
    "train_members",
    "committee_model",
    "refit_energy_offsets",
    "ensure_uncertainty_levels",
]

log = logging.getLogger(__name__)


def _training_config(
    train_file: Path,
    valid_file: Path | None,
    training: Mapping[str, Any],
    out_dir: Path,
    *,
    init_from: str | Path | None,
    epochs: int | None,
    seed: int,
    lr: float | None = None,
) -> Any:
    """The :class:`~mlip_unc.config.PotentialConfig` of ``training`` with the files, ``out``,
    ``seed`` (unless set), ``train.progress`` off (unless set), ``epochs`` (whose learning-rate
    schedule then follows the epochs, not a wall-clock budget) and ``init_from``."""
    from mlip_unc.config import potential_config_from_dict

    raw = copy.deepcopy(dict(training))
    data = dict(raw.get("data") or {})
    data["train"] = str(train_file)
    if valid_file is not None:
        data["valid"] = str(valid_file)
    raw["data"] = data
    raw["out"] = str(out_dir)
    raw.setdefault("seed", seed)
    train_section = dict(raw.get("train") or {})
    train_section.setdefault("progress", False)
    if epochs is not None:  # a fine-tune of this many epochs: its schedule spans them
        train_section["epochs"] = int(epochs)
        train_section["schedule_clock"] = "epochs"
    if lr is not None:
        train_section["lr"] = float(lr)
    if init_from is not None:
        train_section["init_from"] = str(init_from)
    raw["train"] = train_section
    return potential_config_from_dict(raw)


def train_model(
    train: Sequence[Atoms],
    valid: Sequence[Atoms],
    training: Mapping[str, Any],
    out_dir: str | Path,
    *,
    init_from: str | Path | None = None,
    epochs: int | None = None,
    seed: int = 0,
    refit_offsets: bool = False,
    resume: bool = False,
    lr: float | None = None,
) -> Path:
    """Train a potential on in-memory labelled structures; returns ``out_dir/model.pt``.

    The structures are written to ``out_dir/train.xyz`` and ``valid.xyz`` (when ``valid`` is
    not empty; otherwise the trainer holds out its ``data.valid_fraction``) and the training
    config ``training`` (a ``mlip-unc train`` mapping) is completed with them. The
    checkpoint has uncertainty levels afterwards (:func:`ensure_uncertainty_levels`), so
    relative thresholds work with it.

    ``refit_offsets``: the trainer refits the per-element energy offsets on the training
    structures (``model.refit_offsets``, the default of a potential config) whatever
    ``training`` says.

    ``resume``: continue an interrupted training in ``out_dir`` (its ``last.pt``).

    ``init_from``: fine-tune from this checkpoint (the trainer's ``train.init_from``: its
    architecture, offsets and weights, a fresh optimiser) for ``epochs`` epochs; the
    checkpoint's ``metadata["training_config"]["train"]["init_from"]`` records it.
    """
    from mlip_unc.train.potential import train_potential

    out_dir = Path(out_dir)
    train_file = write_frames(out_dir / "train.xyz", train)
    valid_file = write_frames(out_dir / "valid.xyz", valid) if valid else None
    config = _training_config(
        train_file,
        valid_file,
        training,
        out_dir,
        init_from=init_from,
        epochs=epochs,
        seed=seed,
        lr=lr,
    )
    # the run's own state guards the folder: a round's training resumes, or starts over
    config = config.updated(train=config.train.updated(resume=resume, overwrite=not resume))
    if (
        refit_offsets
    ):  # done by the trainer's finalisation, before the posterior fit that reads the energy errors
        config = config.updated(model=config.model.updated(refit_offsets=True))
    log.info(
        "training on %d + %d validation structures%s -> %s",
        len(train),
        len(valid),
        f" (fine-tuning {init_from})" if init_from is not None else "",
        out_dir,
    )
    result = train_potential(config)
    ensure_uncertainty_levels(
        result.model_path, list(valid) or list(train), batch_size=config.train.valid_batch_size
    )
    return result.model_path


def train_members(
    train: Sequence[Atoms],
    valid: Sequence[Atoms],
    training: Mapping[str, Any],
    out_dir: str | Path,
    *,
    members: int = 1,
    init_from: Sequence[str | Path] | None = None,
    epochs: int | None = None,
    seed: int = 0,
    refit_offsets: bool = False,
    resume: bool = False,
    lr: float | None = None,
) -> list[Path]:
    """:func:`train_model` for each of ``members`` models on the same data: one model in
    ``out_dir`` (seed ``seed``), or ``out_dir/member_m`` with seed ``seed + 1000 m``, member
    ``m`` fine-tuned from ``init_from[m]`` when given (peak learning rate ``lr``, when given)."""
    out_dir = Path(out_dir)
    paths = []
    for m in range(members):
        paths.append(
            train_model(
                train,
                valid,
                training,
                out_dir if members == 1 else out_dir / f"member_{m}",
                init_from=None if init_from is None else init_from[m],
                epochs=epochs,
                seed=seed + 1000 * m,
                refit_offsets=refit_offsets,
                resume=resume,
                lr=lr,
            )
        )
    return paths


def committee_model(paths: Sequence[str | Path], structures: Sequence[Atoms]) -> Any:
    """The :class:`~mlip_unc.models.committee.Committee` of the checkpoints ``paths`` with
    ``metadata["uncertainty_levels"]`` of the committee itself (its force std across members)
    on ``structures`` (the validation frames), so relative thresholds mean the same as for one
    model."""
    from mlip_unc.calculator import LEVELS_KEY
    from mlip_unc.data.graphs import StructureDataset
    from mlip_unc.data.typemap import TypeMap
    from mlip_unc.models.loading import load_potential
    from mlip_unc.posthoc.levels import uncertainty_levels

    committee = load_potential([Path(p) for p in paths])
    r_max, type_map = committee.r_max, committee.type_map
    if r_max is None or type_map is None:
        raise ValueError(f"checkpoints {list(paths)} lack r_max or the type map")
    dataset = StructureDataset.from_atoms(
        list(structures),
        r_max,
        TypeMap.from_list(type_map),
        dtype=next(committee.parameters()).dtype,
    )
    # read by UncertaintyCalculator as a model's metadata
    object.__setattr__(committee, "metadata", {LEVELS_KEY: uncertainty_levels(committee, dataset)})
    return committee


def ensure_uncertainty_levels(
    checkpoint: str | Path, structures: Sequence[Atoms], *, batch_size: int = 16
) -> dict[str, float]:
    """The checkpoint's ``metadata["uncertainty_levels"]``; when absent, computed on
    ``structures`` by :func:`mlip_unc.posthoc.levels.uncertainty_levels` and stored."""
    from mlip_unc.calculator import LEVELS_KEY
    from mlip_unc.data.graphs import StructureDataset
    from mlip_unc.data.typemap import TypeMap
    from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint
    from mlip_unc.models.potential import BayesianPotential
    from mlip_unc.posthoc.levels import uncertainty_levels

    payload = load_checkpoint(checkpoint, kind="potential")
    metadata = dict(payload.get("metadata") or {})
    if metadata.get(LEVELS_KEY):
        return dict(metadata[LEVELS_KEY])
    model = BayesianPotential.from_checkpoint(payload)
    dataset = StructureDataset.from_atoms(
        list(structures), model.r_max, TypeMap.from_list(model.type_map), dtype=model.dtype
    )
    levels = uncertainty_levels(model, dataset, batch_size=batch_size)
    log.info(
        "uncertainty levels on %d structures (the trainer stored none): %s", len(dataset), levels
    )
    payload["metadata"] = {**metadata, LEVELS_KEY: levels}
    save_checkpoint(checkpoint, payload)
    return levels


def refit_energy_offsets(checkpoint: str | Path, structures: Sequence[Atoms]) -> dict[int, float]:
    """Shift the per-element energy offsets so the training energies are fit on average.

    Least squares of the residuals ``E_ref - E_pred`` on element counts; forces, stress and
    every uncertainty are unchanged (the offsets are deterministic constants per element).
    A post-training correction for runs whose energy weight is small; returns the shifts (eV).
    """
    from mlip_unc.data.graphs import atoms_to_graph
    from mlip_unc.data.typemap import TypeMap
    from mlip_unc.models.checkpoint import load_checkpoint, save_checkpoint
    from mlip_unc.models.potential import BayesianPotential
    from mlip_unc.train.offsets import refit_energy_offsets as refit

    payload = load_checkpoint(checkpoint, kind="potential")
    model = BayesianPotential.from_checkpoint(payload).eval()
    type_map = TypeMap.from_list(model.type_map)
    graphs = [
        atoms_to_graph(a, model.r_max, type_map, energy_key="energy", dtype=model.dtype)
        for a in structures
    ]
    delta = refit(model, graphs, batch_size=32)
    if delta is None:
        raise ValueError("refit_energy_offsets: none of the structures has an energy")
    state = payload["model_state"]
    state["atomic_energies"] = (
        model.atomic_energies.detach().cpu().to(state["atomic_energies"].dtype)
    )
    payload["config"]["atomic_energies"] = state["atomic_energies"].tolist()
    shifts = {int(z): float(d) for z, d in zip(model.type_map, delta, strict=False)}
    record = {str(z): d for z, d in shifts.items()}
    payload["metadata"] = {**dict(payload.get("metadata") or {}), "energy_offset_refit": record}
    save_checkpoint(checkpoint, payload)
    log.info("energy offsets refit: %s eV", {z: round(d, 6) for z, d in shifts.items()})
    return shifts
