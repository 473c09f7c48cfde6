"""Data of potential training: files -> reference energies, split, graphs (built once),
statistics. :func:`prepare_data` is shared by the members of a committee.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import ase
import numpy as np
import torch

from mlip_unc import keys
from mlip_unc.config import ConfigError, PotentialConfig, ReferenceEnergies
from mlip_unc.data import (
    DataError,
    StructureDataset,
    TypeMap,
    fit_reference_energies,
    frame_energy,
    random_split,
    read_structures,
)
from mlip_unc.data.datasets import FrameSelection, select_frames
from mlip_unc.data.neighbours import crowded_cutoff
from mlip_unc.data.ondisk import is_store

log = logging.getLogger(__name__)

__all__ = ["PreparedData", "prepare_data", "data_fingerprint", "select_part", "overlap_warning"]


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


def select_part(
    config: PotentialConfig, path: str, *, forces: bool | None = None
) -> FrameSelection:
    """The frames ``data.index`` of a training, validation or test file or on-disk set, with the
    energy (and forces, by default when the loss uses them, and stress when the loss uses it)
    checked on every frame."""
    data = config.data
    if forces is None:  # energy-only data trains with loss.forces_weight 0
        loss = config.loss
        forces = loss.forces_weight > 0 or (loss.stage_two_forces_weight or 0.0) > 0
    return select_frames(
        path,
        r_max=data.r_max,
        index=data.index,
        label_keys={
            "energy": data.energy_key,
            "forces": data.forces_key,
            "stress": data.stress_key,
        },
        required={"energy": True, "forces": forces, "stress": config.loss.stress_weight > 0},
        accept_predicted=data.accept_predicted_labels,
    )


def _reference_energies(
    kind: ReferenceEnergies,
    isolated: list[ase.Atoms],
    frames: list[ase.Atoms],
    elements: Sequence[int],
    energy_key: str,
) -> dict[int, float]:
    if kind is ReferenceEnergies.ZERO:
        return {int(z): 0.0 for z in elements}
    if kind is ReferenceEnergies.LEAST_SQUARES:
        refs = fit_reference_energies(frames, energy_key)
    elif kind is ReferenceEnergies.ISOLATED:
        if not isolated:
            raise ConfigError(
                "model.reference_energies: 'isolated' needs data.isolated_atoms or one-atom frames"
            )
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


def _statistics(
    train: list[ase.Atoms], refs: dict[int, float], energy_key: str
) -> tuple[float, float]:
    residuals = []
    for atoms in train:
        energy = frame_energy(atoms, energy_key)
        if energy is not None:
            residuals.append((energy - sum(refs[int(z)] for z in atoms.numbers)) / len(atoms))
    if not residuals:
        return 0.0, 1.0
    return float(np.mean(residuals)), float(np.std(residuals))


def _frame_key(atoms: ase.Atoms) -> bytes:
    """The structure of a frame (atomic numbers, positions to 1e-8 A, cell, pbc) as bytes."""
    return b"".join(
        (
            np.asarray(atoms.numbers, dtype=np.int64).tobytes(),
            np.round(np.asarray(atoms.positions, dtype=np.float64), 8).tobytes(),
            np.round(np.asarray(atoms.cell.array, dtype=np.float64), 8).tobytes(),
            np.asarray(atoms.pbc, dtype=bool).tobytes(),
        )
    )


def overlap_warning(
    test: FrameSelection, fitted: Sequence[FrameSelection], path: str
) -> str | None:
    """The warning when frames of the test set are also training or validation frames (the
    same structure): test errors on them are not held-out errors. ``None`` when none are, or
    when a part is an on-disk set (not read back to compare)."""
    if test.atoms is None or any(part.atoms is None for part in fitted):
        return None
    seen = {_frame_key(atoms) for part in fitted for atoms in part.atoms or []}
    same = [k for k, atoms in enumerate(test.atoms) if _frame_key(atoms) in seen]
    if not same:
        return None
    first = ", ".join(str(int(test.indices[k])) for k in same[:5])
    return (
        f"{len(same)} of {len(test)} test frames in '{path}' are also training or validation "
        f"frames (frames {first}{', ...' if len(same) > 5 else ''}): their test errors are not "
        "held-out errors; test on structures the model was not fitted or selected on"
    )


def prepare_data(config: PotentialConfig) -> PreparedData:
    """Read, split and convert the data of ``config``; fit reference energies and statistics.

    One-atom frames in the training file go to the reference energies, not the training set.
    Every part may be a structure file or an on-disk set (:mod:`mlip_unc.data.datasets`); an
    on-disk training set is prepared by streaming (:mod:`mlip_unc.train.ondisk_data`).
    """
    data = config.data
    if is_store(data.train):  # an on-disk set (mlip-unc convert): graphs stay on disk
        from mlip_unc.train.ondisk_data import prepare_ondisk

        return prepare_ondisk(config)
    selected = select_part(config, data.train)
    atoms = selected.atoms or []
    isolated = [a for a in atoms if len(a) == 1]
    frames = np.flatnonzero(selected.sizes() != 1)  # positions in the selection
    if data.isolated_atoms:
        isolated += read_structures(
            data.isolated_atoms, energy_key=data.energy_key, require_forces=False
        )
    if data.valid:
        train_pos, valid = frames, select_part(config, data.valid).multi_atom()
    else:
        pos_train, pos_valid = _split(len(frames), data.valid_fraction, config.seed)
        train_pos, valid = frames[pos_train], selected.subset(frames[pos_valid])
    if data.max_train is not None and data.max_train < len(train_pos):
        keep = np.random.default_rng(config.seed).permutation(len(train_pos))[: data.max_train]
        train_pos = train_pos[np.sort(keep)]
    if not len(train_pos):
        raise DataError(f"'{data.train}': no multi-atom training frames")
    train_part = selected.subset(train_pos)
    train_atoms = train_part.structures()
    crowded = crowded_cutoff(train_atoms, data.r_max)  # before the graphs are built
    if crowded is not None:
        log.warning("%s", crowded)
    type_map = TypeMap(tuple(sorted(train_part.elements() | valid.elements())))
    refs = _reference_energies(
        config.model.reference_energies,
        isolated,
        train_atoms,
        type_map.atomic_numbers,
        data.energy_key,
    )
    dtype = config.dtype.torch
    train = train_part.dataset(type_map, dtype=dtype)
    valid_set = valid.dataset(type_map, dtype=dtype) if len(valid) else None
    test = None
    if data.test:
        test_part = select_part(config, data.test, forces=False).multi_atom()
        overlap = overlap_warning(test_part, [train_part, valid], data.test)
        if overlap is not None:
            log.warning("%s", overlap)
        test = test_part.dataset(type_map, dtype=dtype)
    shift, std = _statistics(train_atoms, refs, data.energy_key)
    forces = torch.cat(
        [g[keys.FORCES] for g in train.graphs if bool(g[keys.HAS_FORCES])] or [torch.zeros(1, 3)]
    )
    n_edges = sum(g[keys.EDGE_INDEX].shape[1] for g in train.graphs)
    n_atoms = sum(g.num_nodes for g in train.graphs)
    return PreparedData(
        train=train,
        valid=valid_set,
        test=test,
        type_map=type_map,
        reference_energies=refs,
        energy_shift=shift,
        energy_std=std,
        force_rms=float(forces.pow(2).mean().sqrt()),
        avg_num_neighbors=max(n_edges / max(n_atoms, 1), 1.0),
    )


def data_fingerprint(data: PreparedData) -> list[float]:
    """Counts and energy sums of the training and validation sets (detects changed data)."""
    out = []
    for dataset in (data.train, data.valid):
        graphs = [] if dataset is None else dataset.graphs
        out += [
            float(len(graphs)),
            round(float(sum(float(g[keys.ENERGY].sum()) for g in graphs)), 6),
        ]
    return out
