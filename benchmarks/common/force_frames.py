"""The potential suites' frames and the scoring of a row on them, shared by the suites that
put rows on the force-uncertainty frames (force_uncertainty, accuracy, posterior_fit, the
peers, paper.force_lpa): data splits and specs, resumable steps, training, per-frame values,
distance baselines, row metrics, the paired bootstrap against the committee, call timing."""

from __future__ import annotations

import argparse
import copy
import functools
import json
import logging
import os
import statistics
import time
import timeit
from pathlib import Path
from typing import Any

import ase.io
import numpy as np
import torch
import yaml
from scipy import stats
from torch_geometric.loader import DataLoader

from mlip_unc import keys
from mlip_unc.config import PotentialConfig, load_potential_config
from mlip_unc.data import StructureDataset, TypeMap
from mlip_unc.evaluation.evaluate import frame_table, predict
from mlip_unc.train.potential import run_training
from mlip_unc.train.text_files import json_safe
from mlip_unc.uncertainty import density
from mlip_unc.uncertainty import diagnostics as diag
from mlip_unc.uncertainty.calibration import spearman_corr

log = logging.getLogger("force_uncertainty")

REPO = Path(__file__).resolve().parents[2]


RESULTS = REPO / "benchmarks" / "results"


MODES = ("energy", "exact", "lowrank", "sketch", "sampled")


DISTANCES = (
    "latent_distance",
    "descriptor_distance",
)  # baseline rows: force_magnitude's frames, another score


KNN_K = 10  # nearest training atoms / frames of the distance baselines


ROW_KEYS = (
    "auroc_ood",
    "spearman_frame_in_domain",
    "spearman_frame_pooled",
    "auroc_sigma_over_force",
    "partial_spearman_given_force",
    "std_over_rmse",
    "cost_ratio",
    "force_mae_meV_A",
)


SETTINGS = ("quick", "seed", "budget_minutes", "overrides")  # a resumed run must match these


TARGETS = {  # the default row's targets: key -> (slack below committee5, lowest, highest)
    "spearman_frame_in_domain": (0.05, None, None),
    "partial_spearman_given_force": (0.05, 0.3, None),
    "auroc_ood": (0.03, None, None),
    "std_over_rmse": (None, 0.5, 2.0),
    "cost_ratio": (None, None, 2.0),
}


def parse_with_quick(
    p: argparse.ArgumentParser, argv: list[str] | None, quick_help: str
) -> argparse.Namespace:
    """Add ``--quick`` and ``--out``, parse, and resolve ``--out`` and ``--data-root`` (which ``p`` has)
    the same way in this script and in the ones built on it (--quick needs --out)."""
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--out", type=Path, default=None, help=f"results folder (default {RESULTS})")
    args = p.parse_args(argv)
    if args.quick and args.out is None:
        p.error("--quick writes to the folder given by --out")
    args.out = args.out or RESULTS
    args.data_root = args.data_root or Path(
        os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data"
    )
    return args


def _write(frames: list, path: Path) -> Path:
    ase.io.write(path, frames, format="extxyz")
    return path


def _molecules(path: Path) -> list:
    """Frames of ``path`` without the one-atom reference frames."""
    return [
        a
        for a in ase.io.read(path, index=":")
        if len(a) > 1 and a.info.get("config_type") != "IsolatedAtom"
    ]


def dataset_split(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``{config, overrides, train, test, ood (or None), energy_key, forces_key}``. 3BPA: 400 of
    train_300K (results/checkpoints/3bpa_split.json if its seed matches) -> the other 100, OOD =
    train_mixedT less repeats of train_300K; ethanol: train -> test_MD, OOD = methanol frames of
    test_eth_meth; solvent_xtb: train_50 -> test (one-atom frames dropped), no OOD."""
    s = args.data_root / "structures"
    cfg = REPO / "configs" / f"{name}_equivariant.yaml"
    split: dict[str, Any] = {
        "config": cfg,
        "overrides": [],
        "energy_key": "energy",
        "forces_key": "forces",
    }
    if name == "cu_emt":
        from ase.build import bulk
        from ase.calculators.emt import EMT

        frames = [
            bulk("Cu", "fcc", a=3.6 * (1.04 if k >= 16 else 1.0), cubic=True).repeat((2, 1, 1))
            for k in range(22)
        ]
        for k, atoms in enumerate(
            frames
        ):  # 16 in-domain (rattle 0.05 A), 6 OOD (0.2 A, 4 % stretched)
            atoms.rattle(0.2 if k >= 16 else 0.05, seed=k)
            atoms.calc = EMT()
            atoms.get_stress()
        split.update(
            config=REPO / "configs" / "tiny_emt.yaml",
            train=_write(frames[:10], work / "train.xyz"),
            test=_write(frames[10:16], work / "test.xyz"),
            ood=_write(frames[16:], work / "ood.xyz"),
        )
    elif name == "3bpa":
        frames = ase.io.read(s / "3BPA" / "train_300K.xyz", index=":")
        saved = RESULTS / "checkpoints" / "3bpa_split.json"
        idx = json.loads(saved.read_text()) if saved.is_file() else {}
        if idx.get("seed") != args.seed or (
            len(idx.get("train", [])),
            len(idx.get("test", [])),
        ) != (400, 100):
            perm = np.random.default_rng(args.seed).permutation(
                len(frames)
            )  # as benchmarks/potential.py
            idx = {"train": sorted(perm[:400].tolist()), "test": sorted(perm[400:500].tolist())}
        seen = {round(a.get_potential_energy(), 6) for a in frames}
        mixed = [
            a
            for a in ase.io.read(s / "3BPA" / "train_mixedT.xyz", index=":")
            if round(a.get_potential_energy(), 6) not in seen
        ]
        split.update(
            train=_write([frames[k] for k in idx["train"]], work / "3bpa_train.xyz"),
            test=_write([frames[k] for k in idx["test"]], work / "3bpa_test.xyz"),
            ood=_write(mixed, work / "3bpa_ood.xyz"),
        )
    elif name == "ethanol":
        methanol = [
            a
            for a in _molecules(s / "ethanol" / "test_eth_meth.xyz")
            if a.info.get("config_type") == "methanol"
        ]
        split.update(
            train=s / "ethanol" / "train.xyz",
            test=s / "ethanol" / "test_MD.xyz",
            ood=_write(methanol, work / "methanol.xyz"),
        )
    else:  # solvent_xtb: configs/solvent_xtb_equivariant.yaml; without it, the 3BPA architecture on its files
        root = s / "solvent_xtb"
        if not cfg.is_file():
            cfg = REPO / "configs" / "3bpa_equivariant.yaml"
            split["overrides"] = [
                "data.isolated_atoms=null",
                "data.energy_key=energy_xtb",
                "data.forces_key=forces_xtb",
            ]
        split.update(
            config=cfg,
            train=root / "solvent_xtb_train_50.xyz",
            ood=None,
            energy_key="energy_xtb",
            forces_key="forces_xtb",
            test=_write(_molecules(root / "solvent_xtb_test.xyz"), work / "solv.xyz"),
        )
    return split


class Steps:
    """Finished steps, one JSON object per line of ``path``; ``get`` returns a step's record."""

    def __init__(self, path: Path, settings: dict[str, Any]) -> None:
        self.path, lines = path, (path.read_text().splitlines() if path.is_file() else [])
        parsed = [json.loads(x) for x in lines if x.strip()]
        self.records = {r["step"]: {**r, "line": k} for k, r in enumerate(parsed)}
        self.commands = list(
            dict.fromkeys(
                r["command"]
                for r in parsed
                if r["step"] == "settings" or r["step"].startswith("invocation:")
            )
        )  # every command, in file order
        self.lines = len(parsed)  # records in the file; the next one gets this "line"
        self.get = self.records.get  # step -> its record, or None
        old = self.records.get("settings")
        if old is not None and {k: old[k] for k in SETTINGS} != {k: settings[k] for k in SETTINGS}:
            raise SystemExit(
                f"{path} was made with {old}; use another --out or delete it to start over"
            )
        if old is None:
            self.add("settings", settings)
            self.commands.append(settings["command"])

    def note_command(self, command: str) -> None:
        """Record an invocation whose command line is not yet in the file (a resume, a --refit)."""
        if command not in self.commands:
            self.add(f"invocation:{len(self.commands)}", {"command": command})
            self.commands.append(command)

    def add(self, step: str, record: dict[str, Any]) -> None:
        self.records[step] = json_safe(
            {"step": step, "time": time.strftime("%Y-%m-%d %H:%M:%S"), **record}
        )
        with self.path.open("a") as handle:
            handle.write(json.dumps(self.records[step]) + "\n")
        self.records[step]["line"], self.lines = (
            self.lines,
            self.lines + 1,
        )  # order in the file: later = newer


def train(
    name: str,
    split: dict[str, Any],
    args: argparse.Namespace,
    steps: Steps,
    ensemble: int,
    folder: str = "force_uncertainty",
) -> Path:
    """Train the single model (``ensemble=1``) or the MAP committee once into
    ``OUT/checkpoints/<folder>/<name>_<tag>``; the step records it."""
    tag = "single" if ensemble == 1 else f"committee{ensemble}"
    out = args.out / "checkpoints" / folder / f"{name}_{tag}"
    if steps.get(f"train:{name}:{tag}"):
        return out
    log.info("[train] %s %s: %.3g min per model", name, tag, args.budget_minutes)
    results = run_training(train_config(split, args, out, ensemble))
    for last in out.rglob("last.pt"):
        last.unlink()
    steps.add(f"train:{name}:{tag}", {"train_minutes": [r.train_minutes for r in results]})
    return out


def train_config(
    split: dict[str, Any], args: argparse.Namespace, out: Path, ensemble: int
) -> PotentialConfig:
    """The config a model of this benchmark is trained with (the committee: ``ensemble`` MAP members)."""
    overrides = [
        f"data_root={args.data_root}",
        f"data.train={split['train']}",
        "data.test=null",
        f"out={out}",
        f"seed={args.seed}",
        f"train.max_minutes={args.budget_minutes}",
        "train.schedule_clock=wall",  # equal wall time: the schedule follows the clock
        "train.progress=false",
        "train.resume=false",
        *split["overrides"],
        *args.overrides,
    ]
    if ensemble > 1:
        overrides += [f"train.ensemble={ensemble}", "model.head=map"]
    return load_potential_config(split["config"], overrides)


def load_frames(
    path: Path | None, model: Any, split: dict[str, Any], limit: int | None
) -> StructureDataset | None:
    m = model.members[0] if hasattr(model, "members") else model
    return (
        None
        if path is None
        else StructureDataset.from_files(
            path,
            m.r_max,
            TypeMap.from_list(m.type_map),
            index=f":{limit or ''}",
            energy_key=split["energy_key"],
            forces_key=split["forces_key"],
            dtype=m.dtype,
        )
    )


def frame_values(
    model: Any, data: StructureDataset, mode: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Per-frame score, error and max |F_pred|; std/RMSE (per component) and force MAE."""
    unc = {"force_magnitude": "none", "committee5": "exact"}.get(mode, mode)
    return prediction_values(
        predict(
            model, data, uncertainty=unc, n_samples=args.n_samples, batch_size=8, seed=args.seed
        ),
        mode,
    )


def prediction_values(pred: Any, mode: str) -> dict[str, Any]:
    """:func:`frame_values` of predictions already made (``mode``: the row, which picks the score)."""
    table = frame_table(pred)
    score = {"force_magnitude": "forces_pred_max_norm", "energy": "energy_epistemic_std"}.get(
        mode, "forces_max_std"
    )
    err, var = pred.forces_pred - pred.forces_true, pred.forces_epistemic_var  # (n_atoms, 3) each
    return {
        "score": table[score],
        "error": table["forces_mean_error"],
        "force": table["forces_pred_max_norm"],
        "std_over_rmse": None
        if var is None or mode == "force_magnitude"
        else diag.std_over_rmse(var, err),
        "force_mae_meV_A": 1e3 * float(np.mean(np.abs(err))),
    }


@torch.no_grad()
def node_latents(model: Any, data: StructureDataset) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """The single model's per-atom latents under its head (n_atoms, d), atom types and frame
    of each atom (n_atoms,), frames in ``data``'s order."""
    z, types, frame, seen = [], [], [], 0
    for batch in DataLoader(data.graphs, batch_size=16, shuffle=False):
        z.append(model(batch, compute_forces=False)[keys.NODE_LATENT].double())
        types.append(model.atom_types(batch).numpy())
        frame.append(batch.batch.numpy() + seen)
        seen += batch.num_graphs
    return torch.cat(z), np.concatenate(types), np.concatenate(frame)


def descriptors(data: StructureDataset) -> np.ndarray:
    """Interatomic-distance histogram of each frame (n_frames, bins; periodic images counted)."""
    return density.structure_descriptor(
        [
            ase.Atoms(
                positions=g[keys.POSITIONS].double().numpy(),
                cell=(g[keys.CELL].reshape(3, 3).double().numpy() if keys.CELL in g else None),
                pbc=(g[keys.PBC].reshape(3).numpy() if keys.PBC in g else False),
            )
            for g in data.graphs
        ]
    )


def distance_scores(
    model: Any, train: StructureDataset, sets: dict[str, StructureDataset]
) -> dict[str, Any]:
    """Frame scores from the distance to the training set (every frame of ``data.train``):
    latent_distance = max over atoms of the mean distance to the KNN_K nearest training atoms of
    the same element in the single model's per-atom latents (standardised per element);
    descriptor_distance = mean distance to the KNN_K nearest training frames in the
    interatomic-distance histogram (both: mlip_unc.uncertainty.density). ``{row: {part: (n,)}}``."""
    z_train, t_train, _ = node_latents(model, train)
    d_train = descriptors(train)
    out: dict[str, Any] = {row: {} for row in DISTANCES}
    for part, data in sets.items():
        z, types, frame = node_latents(model, data)
        atom = density.atom_latent_knn_distance(z, types, z_train, t_train, k=KNN_K)  # (n_atoms,)
        out["latent_distance"][part] = np.full(len(data), -np.inf)
        np.maximum.at(out["latent_distance"][part], frame, atom)
        out["descriptor_distance"][part] = density.descriptor_knn_distance(
            descriptors(data), d_train, k=min(KNN_K, len(d_train))
        )
    return out


def row_metrics(
    ind: dict[str, Any], ood: dict[str, Any] | None, cost_ratio: float | None
) -> dict[str, Any]:
    """One result row (ROW_KEYS) from in-domain and OOD frame values (None: no OOD set)."""
    args = [ind[k] for k in ("score", "error", "force")] + (
        [ood[k] for k in ("score", "error", "force")] if ood else []
    )
    row = {
        **diag.frame_ranking(*args),
        "std_over_rmse": ind["std_over_rmse"],
        "cost_ratio": cost_ratio,
        "force_mae_meV_A": ind["force_mae_meV_A"],
    }
    return json_safe({k: row[k] for k in ROW_KEYS})


def _row_rank_corr(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row pair of ``x, y (r, n)``: Pearson of the average ranks
    (as scipy.stats.spearmanr); NaN for a constant row."""
    rx, ry = (stats.rankdata(v, axis=1) for v in (x, y))
    rx, ry = rx - rx.mean(1, keepdims=True), ry - ry.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(1) / np.sqrt((rx**2).sum(1) * (ry**2).sum(1))


def paired_gap(
    single: dict[str, Any], committee: dict[str, Any], *, resamples: int = 1000, seed: int = 0
) -> dict[str, dict[str, float]]:
    """How far the single model's in-domain Spearmans sit from the committee's, with the frames' noise.

    Both rows are resampled with the same frame indices (paired bootstrap over the in-domain frames;
    each row ranks its own errors). Per key: ``gap`` = single - committee on all frames, ``std`` of
    the resampled gaps, ``p_within_slack`` = fraction of resamples with gap >= -slack (the slack
    of that key in TARGETS). The resamples are ranked all at once (one matrix per row and
    quantity).
    """
    rng = np.random.default_rng(seed)
    rows = [
        {k: np.asarray(v[k], float) for k in ("score", "error", "force")}
        for v in (single, committee)
    ]
    draws = rng.integers(
        0, rows[0]["score"].size, (resamples, rows[0]["score"].size)
    )  # (resamples, n)
    full = [
        (
            spearman_corr(v["score"], v["error"], nan_policy="omit"),
            diag.partial_spearman(v["score"], v["error"], v["force"]),
        )
        for v in rows
    ]
    boot = []
    for v in rows:
        s, e, f = (v[k][draws] for k in ("score", "error", "force"))  # (resamples, n) each
        r_se, r_sf, r_ef = _row_rank_corr(s, e), _row_rank_corr(s, f), _row_rank_corr(e, f)
        denom = (1.0 - r_sf**2) * (1.0 - r_ef**2)
        with np.errstate(invalid="ignore", divide="ignore"):
            partial = np.where(
                denom > 1e-12, np.clip((r_se - r_sf * r_ef) / np.sqrt(denom), -1.0, 1.0), np.nan
            )
        boot.append((r_se, partial))
    out = {}
    for j, key in enumerate(("spearman_frame_in_domain", "partial_spearman_given_force")):
        gaps = boot[0][j] - boot[1][j]
        gaps = gaps[np.isfinite(gaps)]
        out[key] = {
            "gap": float(full[0][j] - full[1][j]),
            "std": float(gaps.std()),
            "p_within_slack": float(np.mean(gaps >= -TARGETS[key][0])),
        }
    return out


def offered_modes(
    model: Any, graph: Any, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    """Modes the model runs on one frame, and why the others were skipped."""
    ok, skipped = [], {}
    for mode in MODES:
        try:
            model(graph, compute_forces=True, uncertainty=mode, n_samples=args.n_samples)
            ok.append(mode)
        except Exception as err:  # noqa: BLE001  a mode the model does not offer (yet)
            skipped[mode] = f"{type(err).__name__}: {err}"
    return ok, skipped


def time_calls(calls: dict[str, Any], graphs: list, repeats: int = 3) -> dict[str, float]:
    """Median over frames of the best of ``repeats`` single-frame calls (ms), calls interleaved."""
    for call in calls.values():
        call(graphs[0])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in calls}
    for graph in graphs:
        for name, call in calls.items():
            timed = functools.partial(call, graph)
            times[name].append(1e3 * min(timeit.repeat(timed, number=1, repeat=repeats)))
    return {name: statistics.median(v) for name, v in times.items()}


CONFIGS = REPO / "configs"


QUICK_MODELS = {  # --quick: model sections small enough for 10 s
    "native": {
        "backbone": "equivariant",
        "latent_dim": 8,
        "backbone_kwargs": {
            "channels": 8,
            "l_max": 1,
            "num_layers": 1,
            "num_basis": 4,
            "radial_hidden": 8,
            "readout_hidden": [8],
        },
    },
    "mace_backbone": {
        "backbone": "mace",
        "latent_dim": 8,
        "backbone_kwargs": {
            "channels": 8,
            "max_L": 0,
            "l_max": 1,
            "num_layers": 2,
            "correlation": 2,
            "num_basis": 4,
            "radial_mlp": [8],
            "readout_hidden": [8],
        },
    },
}


def dataset_spec(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """``{set, train, tests {label: path} (first = the dataset's own), energy_key, forces_key,
    stress_key, overrides}``: files and label keys of one dataset (3BPA and cu_emt files are
    written to ``work`` by :func:`dataset_split`)."""
    s = args.data_root / "structures"
    spec: dict[str, Any] = {
        "set": name.lower(),
        "energy_key": "energy",
        "forces_key": "forces",
        "stress_key": None,
        "overrides": [],
    }
    if name in ("cu_emt", "3BPA"):
        split = dataset_split(
            name.lower(), argparse.Namespace(data_root=args.data_root, seed=args.split_seed), work
        )
        tests = (
            {"test": split["test"]}
            if name == "cu_emt"
            else {"test_300K": split["test"], "mixedT": split["ood"]}
        )
        spec.update(
            train=split["train"], tests=tests, stress_key="stress" if name == "cu_emt" else None
        )
    elif name == "ethanol":
        spec.update(
            train=s / "ethanol" / "train.xyz", tests={"test_MD": s / "ethanol" / "test_MD.xyz"}
        )
    elif name == "solvent_xtb":
        root = s / "solvent_xtb"
        spec.update(
            train=root / "solvent_xtb_train_200.xyz",
            tests={"test": root / "solvent_xtb_test.xyz"},
            energy_key="energy_xtb",
            forces_key="forces_xtb",
        )
    else:  # mlearn: the JSON files themselves (stress converted by mlip_unc.data.json_reader)
        root = s / "mlearn" / name
        spec.update(
            set="mlearn",
            train=root / "training.json",
            tests={"test": root / "test.json"},
            stress_key="stress",
        )
    keys = {
        "energy_key": spec["energy_key"],
        "forces_key": spec["forces_key"],
        "stress_key": spec["stress_key"],
    }
    spec["overrides"] = [
        f"data.train={spec['train']}",
        "data.test=null",
        *(f"data.{k}={v}" for k, v in keys.items() if v is not None),
    ]
    return spec


def row_config(
    spec: dict[str, Any], row: str, args: argparse.Namespace
) -> tuple[dict[str, Any], str]:
    """The raw config of ``row`` on this dataset and a note of where it came from."""
    if args.quick:
        raw = yaml.safe_load((CONFIGS / "tiny_emt.yaml").read_text())
        if row in QUICK_MODELS:
            raw["model"] = copy.deepcopy(QUICK_MODELS[row])
        return (
            raw,
            f"configs/tiny_emt.yaml{' + quick model of ' + row if row in QUICK_MODELS else ''}",
        )
    suffix = {
        "native": "equivariant",
        "gin": "gin",
        "mace_backbone": "mace",
        "mace_torch": "equivariant",
    }[row]
    own = CONFIGS / f"{spec['set']}_{suffix}.yaml"
    if own.is_file():
        return yaml.safe_load(own.read_text()), str(own.relative_to(REPO))
    native = CONFIGS / f"{spec['set']}_equivariant.yaml"
    raw = yaml.safe_load(native.read_text())
    raw["model"] = yaml.safe_load((CONFIGS / f"ethanol_{suffix}.yaml").read_text())["model"]
    return raw, f"{native.relative_to(REPO)} + model section of configs/ethanol_{suffix}.yaml"
