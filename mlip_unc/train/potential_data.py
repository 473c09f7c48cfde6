"""Data of potential training: files -> reference energies, split, graphs (built once),
statistics. :func:`prepare_data` is shared by the members of a committee.
"""

from __future__ import annotations

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

__all__ = ["PreparedData", "prepare_data", "data_fingerprint"]


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
        path,
        index=data.index,
        energy_key=data.energy_key,
        forces_key=data.forces_key,
        stress_key=data.stress_key,
        require_forces=forces,
        require_stress=config.loss.stress_weight > 0,
    )


def _is_isolated(atoms: ase.Atoms) -> bool:
    return len(atoms) == 1


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


def _dataset(
    atoms: list[ase.Atoms],
    config: PotentialConfig,
    type_map: TypeMap,
    source: str,
    frames: Sequence[int] | None = None,
) -> StructureDataset:
    data = config.data
    return StructureDataset.from_atoms(
        atoms,
        data.r_max,
        type_map,
        energy_key=data.energy_key,
        forces_key=data.forces_key,
        stress_key=data.stress_key,
        frame_indices=frames,
        source=source,
        dtype=config.dtype.torch,
    )


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


def prepare_data(config: PotentialConfig) -> PreparedData:
    """Read, split and convert the data of ``config``; fit reference energies and statistics.

    One-atom frames in the training file go to the reference energies, not the training set.
    ``data.train`` may be an on-disk set (:mod:`mlip_unc.train.ondisk_data`).
    """
    from mlip_unc.data.ondisk import is_store

    data = config.data
    if is_store(data.train):  # an on-disk set (mlip-unc convert): graphs stay on disk
        from mlip_unc.train.ondisk_data import prepare_ondisk

        return prepare_ondisk(config)
    frames = _read(data.train, config)
    isolated = [a for a in frames if _is_isolated(a)]
    frames_idx = [k for k, a in enumerate(frames) if not _is_isolated(a)]
    if data.isolated_atoms:
        isolated += read_structures(
            data.isolated_atoms, energy_key=data.energy_key, require_forces=False
        )
    if data.valid:
        train_idx, valid_atoms = (
            frames_idx,
            [a for a in _read(data.valid, config) if not _is_isolated(a)],
        )
        valid_idx: list[int] = []
    else:
        pos_train, pos_valid = _split(len(frames_idx), data.valid_fraction, config.seed)
        train_idx, valid_idx = (
            [frames_idx[k] for k in pos_train],
            [frames_idx[k] for k in pos_valid],
        )
        valid_atoms = [frames[k] for k in valid_idx]
    if data.max_train is not None and data.max_train < len(train_idx):
        keep = np.random.default_rng(config.seed).permutation(len(train_idx))[: data.max_train]
        train_idx = [train_idx[k] for k in sorted(keep)]
    if not train_idx:
        raise DataError(f"'{data.train}': no multi-atom training frames")
    train_atoms = [frames[k] for k in train_idx]
    type_map = TypeMap.from_atoms_list([*train_atoms, *valid_atoms])
    refs = _reference_energies(
        config.model.reference_energies,
        isolated,
        train_atoms,
        type_map.atomic_numbers,
        data.energy_key,
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
    forces = torch.cat(
        [g[keys.FORCES] for g in train.graphs if bool(g[keys.HAS_FORCES])] or [torch.zeros(1, 3)]
    )
    n_edges = sum(g[keys.EDGE_INDEX].shape[1] for g in train.graphs)
    n_atoms = sum(g.num_nodes for g in train.graphs)
    return PreparedData(
        train=train,
        valid=valid,
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
