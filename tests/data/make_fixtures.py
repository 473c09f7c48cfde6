"""Regenerate the committed test checkpoints under ``tests/data/fixtures/`` (seconds, CPU).

Two tiny potentials (backbones ``gin`` and ``equivariant``) and a two-member ``gin`` committee,
trained on EMT-labelled rattled copper cells, plus ``reference.json``: each model's energy,
forces and force variance on a fixed probe cell. ``tests/models/test_committed_checkpoints.py``
loads the committed files with the current code and compares against ``reference.json``, so a
change to parameter names or to the forward pass that alters a saved model's numbers fails.

Run from the repository root after such a change is intended::

    OMP_NUM_THREADS=1 python tests/data/make_fixtures.py

Only ``model.pt`` files (and ``ensemble.json``) are kept; histories and configs are not.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ase.io
import numpy as np
import torch
from ase import Atoms
from ase.build import bulk
from ase.calculators.emt import EMT

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SINGLES = {
    "tiny_gin": {"backbone": "gin", "backbone_kwargs": {"hidden": 16, "num_layers": 2}},
    "tiny_equivariant": {
        "backbone": "equivariant",
        "backbone_kwargs": {"channels": 8, "l_max": 1, "num_layers": 2},
    },
}
COMMITTEE = "tiny_gin_committee2"  # two members of the tiny_gin settings, seeds 1 and 2


def copper_frames(n: int, offset: int = 0) -> list[Atoms]:
    """``n`` rattled two-cell copper supercells labelled by EMT (energy, forces, stress)."""
    frames = []
    for k in range(offset, offset + n):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
        atoms.rattle(0.1, seed=k)
        atoms.calc = EMT()
        atoms.get_stress()
        frames.append(atoms)
    return frames


def probe_cell() -> Atoms:
    """The fixed cell the reference numbers are computed on (not in the training set)."""
    atoms = bulk("Cu", "fcc", a=3.65, cubic=True).repeat((2, 1, 1))
    atoms.rattle(0.15, seed=1000)
    return atoms


def config(train_file: Path, out: Path, model: dict[str, Any], seed: int) -> Any:
    """The training settings of every fixture (20 epochs, float64, seconds on one core)."""
    from mlip_unc.config.potential import potential_config_from_dict

    return potential_config_from_dict(
        {
            "seed": seed,
            "out": str(out),
            "data": {
                "train": str(train_file),
                "valid_fraction": 0.25,
                "stress_key": "stress",
                "r_max": 4.0,
            },
            "model": {**model, "latent_dim": 8},
            "loss": {"stress_weight": 1.0},
            "train": {"epochs": 20, "batch_size": 2, "lr": 0.01},
        }
    )


def predict(path: Path) -> dict[str, Any]:
    """Energy (eV), forces (eV/A, per atom) and summed epistemic force variance on the probe."""
    from torch_geometric.data import Batch

    from mlip_unc import keys
    from mlip_unc.data import TypeMap, atoms_to_graph
    from mlip_unc.models.potential import BayesianPotential

    model = BayesianPotential.from_checkpoint(path).eval()
    graph = atoms_to_graph(
        probe_cell(), model.r_max, TypeMap.from_list(model.type_map), dtype=model.dtype
    )
    out = model(Batch.from_data_list([graph]), uncertainty="exact")
    return {
        "energy": float(out[keys.ENERGY].item()),
        "forces": out[keys.FORCES].detach().tolist(),
        "forces_var_sum": float(out[keys.FORCES_VAR].sum().item()),
    }


def train_one(train_file: Path, work: Path, name: str, model: dict[str, Any], seed: int) -> Path:
    """Train in ``work`` and copy only ``model.pt`` to ``FIXTURES/name``."""
    from mlip_unc.train.potential import train_potential

    result = train_potential(config(train_file, work / name, model, seed))
    target = FIXTURES / name / "model.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result.model_path, target)
    return target


def main() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    torch.set_num_threads(1)
    if FIXTURES.exists():
        shutil.rmtree(FIXTURES)
    FIXTURES.mkdir(parents=True)
    reference: dict[str, Any] = {"probe": "probe_cell() of tests/data/make_fixtures.py"}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        train_file = work / "train.xyz"
        ase.io.write(train_file, copper_frames(8))
        for name, model in SINGLES.items():
            reference[name] = predict(train_one(train_file, work, name, model, seed=0))
        members = []
        for k in range(2):
            path = train_one(
                train_file, work, f"{COMMITTEE}/member_{k}", SINGLES["tiny_gin"], k + 1
            )
            members.append(str(path.relative_to(FIXTURES / COMMITTEE)))
        (FIXTURES / COMMITTEE / "ensemble.json").write_text(
            json.dumps({"members": members}, indent=1) + "\n"
        )
    (FIXTURES / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    size = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    print(f"wrote {FIXTURES} ({size / 1e3:.0f} kB)")


if __name__ == "__main__":
    main()
