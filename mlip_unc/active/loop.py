"""Active learning: MD -> flag -> label with an oracle -> add to the training set -> retrain.

``mlip-unc active-learn --config AL.yaml`` runs :func:`run_active_learning` on an
:class:`ActiveLearningConfig` (see ``configs/al_emt.yaml``)::

    out: runs/al_emt
    oracle: emt                      # emt | pyscf | xtb | package.module:factory | {name: ..., ...}
    structures: {bulk: Cu, crystalstructure: fcc, a: 3.61, cubic: true, repeat: [2, 2, 2]}
    bootstrap: {temperature: 300, frames: 40, valid_frames: 10}   # or train_data: file.xyz
    test: {temperature: 1200, frames: 20}                          # or test_data: file.xyz
    training: {...}                  # a `mlip-unc train` config without data.train/out
    rounds: 2
    md: {ensemble: langevin, temperature: 1200, steps: 400, timestep: 1.0, interval: 10}
    thresholds: {energy_std_per_atom: 2.0, relative: true}
    selection: {top_k: 10, diverse: true}

Round k: the current model drives MD from each starting structure under an
:class:`~mlip_unc.active.monitor.UncertaintyMonitor`; frames over the thresholds are
flagged; the most uncertain ``top_k`` (optionally diversified) are labelled by the oracle;
80 % go to the training set, 20 % to the validation set; the model is retrained
(:func:`train_model`). The report (``out/report.md``, ``out/rounds.png``) lists per round the
data size, the held-out errors, the uncertainty levels and the flagged count.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ase.io
import numpy as np
from ase import Atoms

from mlip_unc.active.monitor import MDSettings, run_md
from mlip_unc.active.oracles import label_structures, make_oracle
from mlip_unc.active.selection import distance_histograms, score_structures, select

__all__ = [
    "ActiveLearningConfig",
    "SelectionSettings",
    "GenerateSettings",
    "load_al_config",
    "al_config_from_dict",
    "build_structure",
    "oracle_md",
    "evaluate_structures",
    "uncertainty_levels",
    "store_uncertainty_levels",
    "refit_energy_offsets",
    "train_model",
    "label_selected",
    "select_flagged",
    "split_labelled",
    "run_active_learning",
]

Log = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


# ====================================================================== config
@dataclass(frozen=True)
class SelectionSettings:
    """Which flagged frames go to the oracle.

    Attributes:
        metric: ``max_force_std`` or ``energy_std_per_atom`` (ranking score).
        top_k: label at most this many per round.
        diverse: farthest-point sampling among the ``4 * top_k`` most uncertain flagged frames
            (in the distance-histogram descriptor), so one excursion is not labelled k times.
        valid_fraction: share of the labelled frames added to the validation set.
        max_label_force: drop labelled frames whose largest reference force component exceeds
            this (eV/A): MD with a poor model can squeeze atoms together, and such frames teach
            nothing about the region of interest while dominating the loss (``None``: keep all).
    """

    metric: str = "max_force_std"
    top_k: int = 10
    diverse: bool = True
    valid_fraction: float = 0.2
    max_label_force: float | None = None

    def __post_init__(self) -> None:
        if self.metric not in ("max_force_std", "energy_std_per_atom"):
            raise ValueError(f"selection.metric must be max_force_std or energy_std_per_atom, got {self.metric!r}")
        if self.top_k < 1:
            raise ValueError(f"selection.top_k must be >= 1, got {self.top_k}")
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ValueError(f"selection.valid_fraction must be in [0, 1), got {self.valid_fraction}")


@dataclass(frozen=True)
class GenerateSettings:
    """Reference data made by running oracle MD (Langevin) from the starting structure.

    Attributes:
        temperature: K.
        frames: number of frames kept.
        valid_frames: extra frames from an independent trajectory (validation); 0 = none.
        interval: MD steps between kept frames.
        timestep: fs.
        equilibration: steps before the first kept frame.
        seed: velocities and thermostat noise.
    """

    temperature: float = 300.0
    frames: int = 40
    valid_frames: int = 0
    interval: int = 10
    timestep: float = 2.0
    equilibration: int = 100
    seed: int = 0


@dataclass(frozen=True)
class ActiveLearningConfig:
    """The whole active-learning run (module docstring); YAML enters through :func:`load_al_config`.

    Attributes:
        out: output folder.
        oracle: oracle spec (:func:`~mlip_unc.active.oracles.make_oracle`).
        structures: MD starting structures: a file, or ``{bulk: El, ..., repeat: [n, n, n]}``.
        training: a training config mapping (``mlip-unc train``); ``data.train``,
            ``data.valid`` and ``out`` are set per round.
        train_data, valid_data, test_data: labelled files (extxyz); or generated by
            ``bootstrap`` (train/valid) and ``test`` (held-out).
        model: start from this checkpoint instead of training on the initial data.
        rounds: number of MD -> label -> retrain rounds.
        retrain_epochs: epochs of each retraining (``None``: the training config's).
        uncertainty: calculator mode during MD (``exact`` or ``sampled``).
        thresholds: :class:`~mlip_unc.calculator.Thresholds` fields.
        refit_offsets: refit the per-element energy offsets after each training
            (:func:`refit_energy_offsets`), for small energy weights.
        seed: seed of the MD and of the calculator.
    """

    out: str = "runs/active_learning"
    oracle: Any = "emt"
    structures: Any = None
    training: dict[str, Any] = field(default_factory=dict)
    train_data: str | None = None
    valid_data: str | None = None
    test_data: str | None = None
    bootstrap: GenerateSettings | None = None
    test: GenerateSettings | None = None
    model: str | None = None
    rounds: int = 1
    retrain_epochs: int | None = None
    uncertainty: str = "exact"
    md: MDSettings = field(default_factory=MDSettings)
    thresholds: dict[str, Any] = field(default_factory=lambda: {"max_force_std": 2.0, "relative": True})
    selection: SelectionSettings = field(default_factory=SelectionSettings)
    refit_offsets: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {self.rounds}")
        if self.train_data is None and self.bootstrap is None and self.model is None:
            raise ValueError("give train_data, bootstrap or model: there is nothing to start from")
        if self.structures is None and self.train_data is None:
            raise ValueError("give structures (MD starting points)")
        if self.uncertainty not in ("exact", "sampled"):
            raise ValueError(f"uncertainty must be 'exact' or 'sampled' for flagging, got {self.uncertainty!r}")


_NESTED = {"md": MDSettings, "selection": SelectionSettings, "bootstrap": GenerateSettings, "test": GenerateSettings}


def _build(cls: type, raw: Mapping[str, Any], prefix: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ValueError(f"{prefix}: unknown keys {unknown}; known: {sorted(names)}")
    try:
        return cls(**raw)
    except TypeError as err:
        raise ValueError(f"{prefix}: {err}") from None


def al_config_from_dict(raw: Mapping[str, Any]) -> ActiveLearningConfig:
    """Validate a mapping (parsed YAML) into an :class:`ActiveLearningConfig`."""
    raw = dict(raw)
    for key, cls in _NESTED.items():
        if raw.get(key) is not None:
            if not isinstance(raw[key], Mapping):
                raise ValueError(f"{key}: expected a mapping, got {raw[key]!r}")
            raw[key] = _build(cls, raw[key], key)
    from mlip_unc.calculator import Thresholds

    Thresholds.coerce(raw.get("thresholds"))  # validate early
    return _build(ActiveLearningConfig, raw, "config")


def load_al_config(path: str | Path, overrides: Sequence[str] = ()) -> ActiveLearningConfig:
    """Read a YAML file, apply ``key.sub=value`` overrides, validate."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"active-learning config not found: '{path}'")
    raw = yaml.safe_load(path.read_text()) or {}
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep:
            raise ValueError(f"{item}: an override must look like key=value")
        node = raw
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(text)
    return al_config_from_dict(raw)


# ====================================================================== structures and data
def build_structure(spec: Any) -> list[Atoms]:
    """Starting structures from a file path or ``{bulk: El, ..., repeat: [a, b, c]}``
    (the other keys go to ``ase.build.bulk``); ``{surface: ...}`` is not built in: use a file."""
    if isinstance(spec, Atoms):
        return [spec.copy()]
    if isinstance(spec, (str, Path)):
        from mlip_unc.data.structures import read_structures

        return read_structures(spec, require_energy=False, require_forces=False)
    if isinstance(spec, Mapping) and "bulk" in spec:
        from ase.build import bulk

        kwargs = dict(spec)
        name = kwargs.pop("bulk")
        repeat = tuple(kwargs.pop("repeat", (1, 1, 1)))
        return [bulk(name, **kwargs) * repeat]
    raise ValueError(f"structures: expected a file or {{bulk: ..., repeat: [...]}}, got {spec!r}")


def oracle_md(start: Atoms, oracle: Any, settings: GenerateSettings, *, n_frames: int | None = None,
              seed: int | None = None) -> list[Atoms]:  # fmt: skip
    """Labelled frames from Langevin MD driven by the oracle itself (cheap oracles: EMT, xTB)."""
    from ase import units
    from ase.calculators.singlepoint import SinglePointCalculator
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import Stationary, thermalize_momenta

    n_frames = settings.frames if n_frames is None else n_frames
    rng = np.random.default_rng(settings.seed if seed is None else seed)
    atoms = start.copy()
    atoms.calc = oracle
    thermalize_momenta(atoms, temperature_K=settings.temperature, rng=rng)
    Stationary(atoms)
    dyn = Langevin(atoms, settings.timestep * units.fs, temperature_K=settings.temperature,
                   friction=0.02 / units.fs, fixcm=False, rng=rng)  # fmt: skip
    frames: list[Atoms] = []

    def keep() -> None:
        frame = atoms.copy()
        results = {"energy": atoms.get_potential_energy(), "forces": atoms.get_forces()}
        if atoms.pbc.all() and "stress" in getattr(oracle, "implemented_properties", ()):
            results["stress"] = atoms.get_stress()
        frame.calc = SinglePointCalculator(frame, **results)
        frames.append(frame)

    if settings.equilibration:
        dyn.run(settings.equilibration)
    keep()
    while len(frames) < n_frames:
        dyn.run(settings.interval)
        keep()
    return frames


# ====================================================================== metrics and levels
def evaluate_structures(calc: Any, labelled: Sequence[Atoms]) -> dict[str, float]:
    """Errors and uncertainties of ``calc`` on labelled structures (the calculator's own numbers).

    Returns ``force_rmse`` (eV/A, over components), ``energy_mae_per_atom`` (eV/atom),
    ``mean_max_force_std`` (eV/A), ``mean_energy_std_per_atom`` (epistemic, eV/atom),
    ``relative_force_std`` (mean over frames of max force std / max predicted |F_i|: a
    constant value across data sets means the force std only follows the force magnitude),
    ``flagged_fraction`` and ``n``.
    """
    sq, n_comp, e_abs = 0.0, 0, []
    mfs, esa, flags, rel = [], [], [], []
    props = ["energy", "forces", "max_force_std", "energy_std"]
    for atoms in labelled:
        ref_e, ref_f = atoms.get_potential_energy(), atoms.get_forces()
        frame = atoms.copy()
        calc.calculate(frame, props + (["flag"] if "flag" in calc.implemented_properties else []))
        res = calc.results
        sq += float(((res["forces"] - ref_f) ** 2).sum())
        n_comp += ref_f.size
        e_abs.append(abs(res["energy"] - ref_e) / len(atoms))
        mfs.append(res["max_force_std"])
        rel.append(res["max_force_std"] / max(float(np.linalg.norm(res["forces"], axis=1).max()), 1e-12))
        esa.append(calc.energy_std_per_atom(res))
        flags.append(bool(res.get("flag", False)))
    if not labelled:
        return {"n": 0}
    return {
        "n": len(labelled),
        "force_rmse": math.sqrt(sq / n_comp),
        "energy_mae_per_atom": float(np.mean(e_abs)),
        "mean_max_force_std": float(np.mean(mfs)),
        "mean_energy_std_per_atom": float(np.mean(esa)),
        "relative_force_std": float(np.mean(rel)),
        "flagged_fraction": float(np.mean(flags)),
    }


def uncertainty_levels(calc: Any, structures: Sequence[Atoms]) -> dict[str, float]:
    """Calibrated levels for relative thresholds: the mean over ``structures`` (the validation
    set) of ``max_force_std`` and ``energy_std_per_atom``, definitions as in the calculator."""
    scores = score_structures(calc, structures)
    return {
        "max_force_std": float(np.mean(scores["max_force_std"])),
        "energy_std_per_atom": float(np.mean(scores["energy_std_per_atom"])),
        "n_structures": len(structures),
    }


def store_uncertainty_levels(checkpoint: str | Path, levels: Mapping[str, float]) -> None:
    """Write ``levels`` into ``payload["metadata"]["uncertainty_levels"]`` of a checkpoint."""
    from mlip_unc.calculator import LEVELS_KEY
    from mlip_unc.train.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(checkpoint, kind="potential")
    metadata = dict(payload.get("metadata") or {})
    metadata[LEVELS_KEY] = dict(levels)
    payload["metadata"] = metadata
    save_checkpoint(checkpoint, payload)


# ====================================================================== training
def refit_energy_offsets(checkpoint: str | Path, structures: Sequence[Atoms]) -> dict[int, float]:
    """Shift the per-element energy offsets so the training energies are fit on average.

    Least squares of the residuals ``E_ref - E_pred`` on element counts; forces, stress and
    every uncertainty are unchanged (the offsets are deterministic constants per element).
    A post-training correction for runs whose energy weight is small; returns the shifts (eV).
    """
    import torch
    from torch_geometric.data import Batch

    from mlip_unc import keys
    from mlip_unc.data.structures import TypeMap, atoms_to_graph
    from mlip_unc.models.potential import BayesianPotential
    from mlip_unc.train.checkpoint import load_checkpoint, save_checkpoint

    payload = load_checkpoint(checkpoint, kind="potential")
    model = BayesianPotential.from_checkpoint(payload).eval()
    type_map = TypeMap.from_list(model.type_map)
    graphs = [atoms_to_graph(a, model.r_max, type_map, dtype=model.dtype) for a in structures]
    with torch.no_grad():
        pred = np.concatenate([
            model(Batch.from_data_list(graphs[k : k + 32]), compute_forces=False)[keys.ENERGY].double().numpy()
            for k in range(0, len(graphs), 32)
        ])  # fmt: skip
    residual = np.asarray([a.get_potential_energy() for a in structures]) - pred  # (n,)
    counts = np.stack([np.bincount([model.type_map.index(int(z)) for z in a.numbers],
                                   minlength=len(model.type_map)) for a in structures]).astype(float)  # fmt: skip
    delta = np.linalg.lstsq(counts, residual, rcond=None)[0]  # (n_types,)
    state = payload["model_state"]
    state["atomic_energies"] = state["atomic_energies"] + torch.as_tensor(delta, dtype=state["atomic_energies"].dtype)
    payload["config"]["atomic_energies"] = state["atomic_energies"].tolist()
    shifts = {int(z): float(d) for z, d in zip(model.type_map, delta)}
    payload["metadata"] = {**dict(payload.get("metadata") or {}), "energy_offset_refit": {str(z): d for z, d in shifts.items()}}
    save_checkpoint(checkpoint, payload)
    return shifts


def _write(path: Path, frames: Sequence[Atoms]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    ase.io.write(path, list(frames), format="extxyz")
    return path


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
    log: Log | None = None,
) -> Path:
    """Train a potential on in-memory labelled structures; returns ``out_dir/model.pt``.

    The structures are written to ``out_dir/train.xyz`` and ``valid.xyz`` and the training
    config ``training`` (a ``mlip-unc train`` mapping) is completed with them. After training
    the validation-set uncertainty levels are stored in the checkpoint metadata
    (:func:`store_uncertainty_levels`), so relative thresholds work with it.

    ``refit_offsets``: afterwards, :func:`refit_energy_offsets` on the training structures.

    ``init_from``: fine-tune from this checkpoint (the trainer's ``train.init_from``: its
    architecture, offsets and weights, a fresh optimiser) for ``epochs`` epochs.
    """
    from mlip_unc.calculator import UncertaintyCalculator
    from mlip_unc.train.potential_config import config_from_dict
    from mlip_unc.train.potential_trainer import train_potential

    out_dir = Path(out_dir)
    raw = copy.deepcopy(dict(training))
    data = dict(raw.get("data") or {})
    data["train"] = str(_write(out_dir / "train.xyz", train))
    if valid:
        data["valid"] = str(_write(out_dir / "valid.xyz", valid))
    raw["data"] = data
    raw["out"] = str(out_dir)
    raw.setdefault("seed", seed)
    train_section = dict(raw.get("train") or {})
    train_section.setdefault("progress", False)
    if epochs is not None:
        train_section["epochs"] = int(epochs)
    if init_from is not None:
        train_section["init_from"] = str(init_from)
    raw["train"] = train_section
    config = config_from_dict(raw)
    result = train_potential(config, log=log)
    if refit_offsets:
        refit_energy_offsets(result.model_path, train)
    levels = uncertainty_levels(UncertaintyCalculator(result.model_path), list(valid) or list(train))
    if init_from is not None:
        levels["fine_tuned_from"] = str(init_from)
    store_uncertainty_levels(result.model_path, levels)
    return result.model_path


# ====================================================================== the loop
def split_labelled(frames: list[Atoms], fraction: float, rng: np.random.Generator) -> tuple[list[Atoms], list[Atoms]]:
    """(train, valid): a random ``fraction`` of ``frames`` for validation (none if < 3 frames)."""
    n_valid = int(round(fraction * len(frames))) if len(frames) >= 3 else 0
    order = rng.permutation(len(frames))
    return [frames[k] for k in order[n_valid:]], [frames[k] for k in order[:n_valid]]


def select_flagged(flagged: list[Atoms], selection: SelectionSettings) -> list[Atoms]:
    """The ``top_k`` flagged frames by ``selection.metric`` (from their info), FPS-diversified."""
    if not flagged:
        return []
    scores = np.asarray([a.info.get(selection.metric, np.nan) for a in flagged], dtype=float)
    scores = np.nan_to_num(scores, nan=-np.inf)
    features = distance_histograms(flagged) if selection.diverse else None
    return [flagged[k] for k in select(scores, top_k=selection.top_k, features=features)]


def label_selected(chosen: list[Atoms], oracle: Any, selection: SelectionSettings) -> tuple[list[Atoms], int]:
    """Label ``chosen`` with ``oracle``; returns (kept frames, number dropped by ``max_label_force``)."""
    labelled = label_structures(chosen, oracle)
    if selection.max_label_force is None:
        return labelled, 0
    kept = [a for a in labelled if np.abs(a.get_forces()).max() <= selection.max_label_force]
    return kept, len(labelled) - len(kept)


def _initial_data(config: ActiveLearningConfig, oracle: Any, starts: list[Atoms]) -> tuple[list, list, list]:
    from mlip_unc.data.structures import read_structures

    train = read_structures(config.train_data) if config.train_data else []
    valid = read_structures(config.valid_data) if config.valid_data else []
    if not train and config.bootstrap is not None:
        boot = config.bootstrap
        train = oracle_md(starts[0], oracle, boot)
        if boot.valid_frames:
            valid = oracle_md(starts[0], oracle, boot, n_frames=boot.valid_frames, seed=boot.seed + 1)
    test = read_structures(config.test_data) if config.test_data else []
    if not test and config.test is not None:
        test = oracle_md(starts[0], oracle, config.test, seed=config.test.seed + 2)
    return train, valid, test


def _model_row(calc: Any, r: int, model: Path, train: list, valid: list, test: list) -> dict[str, Any]:
    """Report row of one model: data sizes, levels, thresholds, held-out metrics."""
    levels = calc.uncertainty_levels or {}
    row: dict[str, Any] = {
        "round": r, "model": str(model), "n_train": len(train), "n_valid": len(valid),
        "level_max_force_std": levels.get("max_force_std"),
        "level_energy_std_per_atom": levels.get("energy_std_per_atom"),
        "threshold_max_force_std": calc.thresholds.max_force_std,
        "threshold_energy_std_per_atom": calc.thresholds.energy_std_per_atom,
    }  # fmt: skip
    if test:
        metrics = evaluate_structures(calc, test)
        row.update({f"test_{k}": metrics[k] for k in (
            "force_rmse", "energy_mae_per_atom", "mean_max_force_std", "mean_energy_std_per_atom")})  # fmt: skip
    return row


def _explore(config: ActiveLearningConfig, calc: Any, starts: list[Atoms], rdir: Path, r: int,
             level: float | None) -> tuple[list[Atoms], int]:  # fmt: skip
    """MD from every starting structure; returns (flagged frames, number of logged frames)."""
    flagged: list[Atoms] = []
    n_frames = 0
    for k, start in enumerate(starts):
        settings = dataclasses.replace(config.md, seed=config.md.seed + 1000 * r + k)
        md = run_md(start, calc, settings, rdir / f"md_{k}", reference_level=level, title=f"round {r}, structure {k}")
        flagged.extend(md.flagged)
        n_frames += len(md.log["step"])
    return flagged, n_frames


def run_active_learning(config: ActiveLearningConfig, *, log: Log | None = None) -> list[dict[str, Any]]:
    """Run ``config.rounds`` rounds; returns one row per model (row k: the model after k rounds)."""
    from mlip_unc.active.report import write_rounds_report
    from mlip_unc.calculator import UncertaintyCalculator

    log = log or _quiet
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    oracle = make_oracle(config.oracle)
    starts = build_structure(config.structures) if config.structures is not None else []
    train, valid, test = _initial_data(config, oracle, starts)
    starts = starts or [train[0].copy()]
    if test:
        _write(out / "data" / "test.xyz", test)
    rng = np.random.default_rng(config.seed)
    model = Path(config.model) if config.model else None
    if model is None:
        log(f"training the initial model on {len(train)} structures")
        model = train_model(train, valid, config.training, out / "initial", seed=config.seed,
                            refit_offsets=config.refit_offsets, log=log)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for r in range(config.rounds + 1):
        t0 = time.monotonic()
        calc = UncertaintyCalculator(model, uncertainty=config.uncertainty, thresholds=config.thresholds,
                                     seed=config.seed)  # fmt: skip
        row = _model_row(calc, r, model, train, valid, test)
        rows.append(row)
        if r == config.rounds:  # the final model: evaluated, no more MD
            break
        rdir = out / f"round_{r}"
        flagged, n_frames = _explore(config, calc, starts, rdir, r, row["level_max_force_std"])
        labelled, n_dropped = label_selected(select_flagged(flagged, config.selection), oracle, config.selection)
        row.update({"n_md_frames": n_frames, "n_flagged": len(flagged), "n_labelled": len(labelled),
                    "n_dropped": n_dropped})  # fmt: skip
        log(f"round {r}: {len(flagged)} of {n_frames} MD frames flagged, {len(labelled)} labelled"
            + (f", {n_dropped} dropped (max_label_force)" if n_dropped else ""))  # fmt: skip
        if not labelled:
            row["minutes"] = (time.monotonic() - t0) / 60
            log("nothing to label: the model stayed under the thresholds along the MD; stopping")
            break
        _write(rdir / "labelled.xyz", labelled)
        new_train, new_valid = split_labelled(labelled, config.selection.valid_fraction, rng)
        train, valid = train + new_train, valid + new_valid
        model = train_model(train, valid, config.training, rdir / "retrained", init_from=model,
                            epochs=config.retrain_epochs, seed=config.seed + r + 1,
                            refit_offsets=config.refit_offsets, log=log)  # fmt: skip
        row["minutes"] = (time.monotonic() - t0) / 60
        write_rounds_report(rows, out)
    report = write_rounds_report(rows, out)
    log(f"report: {report}")
    return rows
