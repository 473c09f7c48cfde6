"""What makes an active-learning run resumable: a committed state file and a label cache.

``out/state.json`` is rewritten atomically after every finished stage (initial data, initial
model, each round's labels and model): the config, the model of each round, the data files and
the rows of the report. ``out/labels/<hash>.json`` holds every oracle result, keyed by a hash
of the structure (atomic numbers, positions, cell, pbc), written as soon as the oracle returns,
so a killed run never labels the same structure twice: on ``--resume`` the rounds already
committed are skipped, the interrupted one is replayed (its MD is seeded, so it reaches the
same frames) and its labels come from the cache. The oracle MD that makes the round-0 data goes
through the same cache (:meth:`CachedLabels.calculator`): a replayed bootstrap trajectory is
read back step by step instead of recomputed.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from ase import Atoms
from ase.calculators.calculator import Calculator, all_changes
from ase.calculators.singlepoint import SinglePointCalculator

from mlip_unc.atomic_write import atomic_write_text

__all__ = ["RunState", "structure_hash", "CachedLabels"]

log = logging.getLogger(__name__)
STATE_FILE = "state.json"


def structure_hash(atoms: Atoms) -> str:
    """SHA-256 of the atomic numbers, positions (to 1e-8 A), cell and pbc of ``atoms``."""
    digest = hashlib.sha256()
    digest.update(np.asarray(atoms.numbers, dtype=np.int64).tobytes())
    digest.update(np.round(np.asarray(atoms.positions, dtype=np.float64), 8).tobytes())
    digest.update(np.round(np.asarray(atoms.cell.array, dtype=np.float64), 8).tobytes())
    digest.update(np.asarray(atoms.pbc, dtype=bool).tobytes())
    return digest.hexdigest()


class CachedLabels:
    """Oracle results on disk, one JSON file per structure hash (``folder/<hash>.json``)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.calls = 0  # oracle calls made through this cache (not served from disk)

    def lookup(self, atoms: Atoms) -> dict[str, Any] | None:
        """The stored results of ``atoms`` (arrays as numpy), or None."""
        path = self.folder / f"{structure_hash(atoms)}.json"
        if not path.is_file():
            return None
        return {
            k: np.asarray(v) if isinstance(v, list) else v
            for k, v in json.loads(path.read_text()).items()
        }

    def store(self, atoms: Atoms, results: dict[str, Any]) -> None:
        """Write the oracle ``results`` of ``atoms`` (atomically, as soon as they exist)."""
        plain = {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in results.items()}
        atomic_write_text(self.folder / f"{structure_hash(atoms)}.json", json.dumps(plain))

    def label(self, atoms: Atoms, oracle: Calculator, compute: Any) -> Atoms:
        """``atoms`` labelled: from the cache, or by ``compute(atoms, oracle) -> Atoms`` (stored)."""
        results = self.lookup(atoms)
        if results is not None:
            out = atoms.copy()
            out.calc = SinglePointCalculator(out, **results)
            return out
        out = compute(atoms, oracle)
        self.calls += 1
        self.store(atoms, out.calc.results)
        return out

    def calculator(self, oracle: Calculator) -> Calculator:
        """``oracle`` behind this cache, as an ASE calculator (for oracle-driven MD)."""
        return _CachedOracle(self, oracle)

    def label_all(
        self, structures: Iterable[Atoms], oracle: Calculator, compute: Any
    ) -> list[Atoms]:
        return [self.label(a, oracle, compute) for a in structures]


class _CachedOracle(Calculator):
    """Energy, forces and (fully periodic, when the oracle has it) stress of each structure from
    the cache, else from the oracle (then stored): what a replayed oracle MD reads back."""

    def __init__(self, cache: CachedLabels, oracle: Calculator) -> None:
        super().__init__()
        self.cache, self.oracle = cache, oracle
        self.implemented_properties = list(
            getattr(oracle, "implemented_properties", ("energy", "forces"))
        )

    def calculate(
        self, atoms: Atoms | None = None, properties: Any = None, system_changes: Any = all_changes
    ) -> None:
        Calculator.calculate(self, atoms, properties, system_changes)
        structure = self.atoms
        if structure is None:
            raise ValueError("_CachedOracle.calculate: no structure given")
        results = self.cache.lookup(structure)
        if results is None or any(p not in results for p in properties or ()):
            work = structure.copy()
            work.calc = self.oracle
            results = {
                "energy": float(work.get_potential_energy()),
                "forces": np.asarray(work.get_forces()),
            }
            if work.pbc.all() and "stress" in self.implemented_properties:
                results["stress"] = np.asarray(work.get_stress())
            self.cache.calls += 1
            self.cache.store(structure, results)
        self.results = {**results, "free_energy": results["energy"]}


class RunState:
    """``out/state.json``: the committed stages of an active-learning run.

    Keys: ``config`` (the run's config dict, compared on resume), ``initial_model``, ``rounds``
    (one dict per finished round: ``round``, ``row``, ``model``, ``n_labelled``),
    ``final_row``, ``rng`` (the numpy generator state of the train/valid split).
    """

    def __init__(self, out: str | Path, config: dict[str, Any]) -> None:
        self.path = Path(out) / STATE_FILE
        self.data: dict[str, Any] = {
            "config": config,
            "initial_model": None,
            "rounds": [],
            "rng": None,
        }

    @classmethod
    def start(
        cls, out: str | Path, config: dict[str, Any], *, resume: bool, overwrite: bool
    ) -> RunState:
        """A new state, or the committed one when resuming.

        Raises:
            FileExistsError: ``out`` holds a run and neither ``resume`` nor ``overwrite`` is given.
            ValueError: resuming with a different config (the differing keys are named).
        """
        state = cls(out, config)
        if not state.path.is_file():
            return state
        if overwrite:
            log.warning("overwriting the active-learning run in %s", state.path.parent)
            return state
        if not resume:
            raise FileExistsError(
                f"{state.path.parent} already holds an active-learning run; continue it with --resume "
                "or replace it with --overwrite"
            )
        saved = json.loads(state.path.read_text())
        changed = sorted(
            k
            for k in set(saved["config"]) | set(config)
            if k != "out" and saved["config"].get(k) != config.get(k)
        )
        if changed:
            raise ValueError(f"cannot resume {state.path.parent}: the config differs in {changed}")
        state.data = saved
        log.info("resuming %s: %d round(s) committed", state.path.parent, len(saved["rounds"]))
        return state

    def commit(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=1))
