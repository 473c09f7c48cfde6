"""Are the mlearn Surface labels consistent with the bulk labels? (issue 12, Si / Ge / Li).

A slab of n atoms with two free faces of area A each has, if its label comes from the same
calculation settings as the bulk frames, the energy E = n e_b + 2 A gamma: bulk energy per
atom e_b plus the surface energy gamma (J/m^2), which depends on the facet but not on the
slab's thickness. A per-atom offset delta between the surface labels and the bulk labels
(other settings, another reference) adds n delta instead. Dividing by 2A,

    (E - n e_b) / (2A) = gamma + delta * n / (2A),

so over slabs of several thicknesses a least-squares line gives gamma (intercept) and delta
(slope). Why: every local model of this project leaves the training Surface frames of Ge
with a mean signed error of one sign (mlearn_groups.md); a local energy cannot fit an offset
that also sits on the slab's bulk-like interior atoms. Only the labels are read here, no model.

e_b is the lowest energy per atom of the training set's Elastic frames (strained bulk; its
minimum is the nearest to equilibrium); another e_b moves delta by the same amount and leaves
gamma unchanged. The vacuum direction of a slab is the cell vector with the widest empty gap
in its fractional coordinates (at least ``--min-gap`` A; otherwise the frame is named in an
error); A is the area spanned by the other two vectors. Surface frames of training.json and
test.json are fitted together; delta's spread is the std over bootstrap resamples of frames.
If ``mlearn_groups.json`` is beside the output, its mean signed training-Surface errors
(prediction - label) are set beside -delta, the error a model would make that gets the
surface energy right and the labels' offset wrong.

    python benchmarks/mlearn_surfaces.py        # writes benchmarks/results/mlearn_surfaces.{md,json,png}
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import ase
import ase.units
import numpy as np

from mlip_unc.atomic import atomic_write_text
from mlip_unc.data.json_reader import read_json_structures

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SETS = ("Si", "Ge", "Li")
EV_PER_A2_TO_J_PER_M2 = ase.units._e * 1e20  # 1 eV/A^2 = 16.02 J/m^2 (ASE's elementary charge)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--sets", default=",".join(SETS), help="comma-separated mlearn sets")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument(
        "--min-gap", type=float, default=5.0, help="smallest vacuum gap (A) that makes a slab"
    )
    p.add_argument("--bootstrap", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    args.data_root = args.data_root or Path(
        os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data"
    )
    args.sets = [s for s in args.sets.split(",") if s]
    return args


def slab_geometry(atoms: ase.Atoms, min_gap: float, where: str) -> tuple[int, float, float]:
    """(vacuum axis, face area A in A^2, vacuum gap in A) of a periodic slab."""
    cell = np.asarray(atoms.cell)  # (3, 3)
    volume = abs(np.linalg.det(cell))
    frac = atoms.get_scaled_positions(wrap=True)  # (n, 3)
    best: tuple[float, int] = (-1.0, -1)
    for axis in range(3):
        s = np.sort(frac[:, axis])
        gaps = np.diff(np.concatenate([s, [s[0] + 1.0]]))  # (n,) including the wrap-around
        i, j = [k for k in range(3) if k != axis]
        height = volume / np.linalg.norm(
            np.cross(cell[i], cell[j])
        )  # spacing of the planes normal to the face
        best = max(best, (float(gaps.max()) * height, axis))
    gap, axis = best
    if gap < min_gap:
        raise ValueError(
            f"{where}: no vacuum gap of {min_gap} A along any cell vector (widest {gap:.2f} A); "
            "not a slab"
        )
    i, j = [k for k in range(3) if k != axis]
    return axis, float(np.linalg.norm(np.cross(cell[i], cell[j]))), gap


def fit_offset(n: np.ndarray, area: np.ndarray, excess: np.ndarray) -> tuple[float, float]:
    """Least squares of excess / (2A) = gamma + delta * n / (2A); excess = E - n e_b (eV).
    Returns (gamma in eV/A^2, delta in eV/atom)."""
    x = n / (2.0 * area)  # (k,) atoms per A^2 of face
    y = excess / (2.0 * area)  # (k,) eV/A^2
    design = np.stack([np.ones_like(x), x], axis=1)  # (k, 2)
    (gamma, delta), *_ = np.linalg.lstsq(design, y, rcond=None)
    return float(gamma), float(delta)


def analyse(folder: Path, min_gap: float, bootstrap: int, seed: int) -> dict[str, Any]:
    """Surface frames of ``folder``/{training,test}.json against its Elastic training frames."""
    training = read_json_structures(folder / "training.json")
    elastic = [
        a.get_potential_energy() / len(a) for a in training if a.info.get("group") == "Elastic"
    ]
    if not elastic:
        raise ValueError(
            f"{folder / 'training.json'}: no frame of group 'Elastic' for the bulk reference"
        )
    e_b = float(min(elastic))
    frames = []
    for part in ("training", "test"):
        path = folder / f"{part}.json"
        for k, atoms in enumerate(training if part == "training" else read_json_structures(path)):
            if atoms.info.get("group") != "Surface":
                continue
            axis, area, gap = slab_geometry(atoms, min_gap, f"{path} entry {k}")
            excess = atoms.get_potential_energy() - len(atoms) * e_b
            frames.append(
                {
                    "part": part,
                    "index": k,
                    "description": str(atoms.info.get("description", "")),
                    "atoms": len(atoms),
                    "area_A2": area,
                    "vacuum_axis": axis,
                    "gap_A": gap,
                    "excess_meV_atom": 1000.0 * excess / len(atoms),
                    "gamma_if_no_offset_J_m2": EV_PER_A2_TO_J_PER_M2 * excess / (2.0 * area),
                }
            )
    if len(frames) < 3:
        raise ValueError(f"{folder}: {len(frames)} Surface frames; the fit needs at least 3")
    n = np.array([f["atoms"] for f in frames], dtype=float)
    area = np.array([f["area_A2"] for f in frames])
    excess = np.array([f["excess_meV_atom"] for f in frames]) * n / 1000.0
    gamma, delta = fit_offset(n, area, excess)
    rng = np.random.default_rng(seed)
    boot = []
    for _ in range(bootstrap):
        pick = rng.integers(0, len(frames), len(frames))
        if np.unique(n[pick] / area[pick]).size > 1:  # a line needs two distinct thicknesses
            boot.append(fit_offset(n[pick], area[pick], excess[pick])[1])
    x, y = n / (2 * area), excess / (2 * area)
    resid = y - (gamma + delta * x)
    for f, r in zip(frames, resid, strict=False):
        f["residual_J_m2"] = EV_PER_A2_TO_J_PER_M2 * float(r)
    return {
        "bulk_energy_eV_atom": e_b,
        "elastic_frames": len(elastic),
        "surface_frames": len(frames),
        "gamma_J_m2": EV_PER_A2_TO_J_PER_M2 * gamma,
        "delta_meV_atom": 1000.0 * delta,
        "delta_bootstrap_std_meV_atom": 1000.0 * float(np.std(boot, ddof=1))
        if len(boot) > 1
        else None,
        "corr_gamma_thickness": float(np.corrcoef(x, y)[0, 1]),
        "residual_std_J_m2": EV_PER_A2_TO_J_PER_M2
        * float(np.std(resid, ddof=2)),  # >= 3 frames (checked)
        "frames": frames,
    }


def model_biases(path: Path) -> dict[str, dict[str, float]]:
    """{set: {run: mean signed training-Surface error (meV/atom)}} from mlearn_groups.json, if there."""
    if not path.is_file():
        return {}
    groups = json.loads(path.read_text())
    return {
        name: {
            run: e["training"]["Surface"]["energy_mean_error_meV_atom"]
            for run, e in groups.get(name, {}).items()
            if "Surface" in e.get("training", {})
        }
        for name in SETS
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    results: dict[str, Any] = {
        "meta": {
            "command": "python benchmarks/mlearn_surfaces.py "
            + shlex.join(argv if argv is not None else sys.argv[1:]),
            "time": time.strftime("%Y-%m-%d %H:%M"),
            "seed": args.seed,
            "bootstrap": args.bootstrap,
            "min_gap_A": args.min_gap,
        }
    }
    biases = model_biases(args.out / "mlearn_groups.json")
    for name in args.sets:
        entry = analyse(
            args.data_root / "structures" / "mlearn" / name, args.min_gap, args.bootstrap, args.seed
        )
        entry["model_training_surface_bias_meV_atom"] = biases.get(name, {})
        results[name] = entry
        print(
            f"{name}: gamma {entry['gamma_J_m2']:.2f} J/m^2, delta {entry['delta_meV_atom']:+.1f} meV/atom "
            f"(bootstrap std {entry['delta_bootstrap_std_meV_atom']:.1f}), {entry['surface_frames']} slabs",
            flush=True,
        )
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "mlearn_surfaces.json", json.dumps(results, indent=1) + "\n")
    atomic_write_text(args.out / "mlearn_surfaces.md", markdown(results))
    plot(results, args.out / "mlearn_surfaces.png")
    return results


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    sets = [s for s in results if s != "meta"]
    lines = [
        "# mlearn Surface labels against the bulk labels",
        "",
        f"Command: `{meta['command']}` ({meta['time']}; "
        f"bootstrap {meta['bootstrap']} resamples, seed {meta['seed']})",
        "",
        " ".join(__doc__.split("\n\n")[1:4]).replace("\n", " "),
        "",
        "| set | slabs | gamma (J/m^2) | delta (meV/atom) | delta bootstrap std | corr(gamma_if_no_offset, n/2A) | "
        "residual std (J/m^2) | -delta | models' mean signed training-Surface error (meV/atom): min, mean, max (runs) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in sets:
        r = results[name]
        b = list(r["model_training_surface_bias_meV_atom"].values())
        bias = (
            f"{min(b):+.1f}, {np.mean(b):+.1f}, {max(b):+.1f} ({len(b)})"
            if b
            else "n/a (no mlearn_groups.json)"
        )
        lines.append(
            f"| {name} | {r['surface_frames']} | {r['gamma_J_m2']:.2f} | {r['delta_meV_atom']:+.1f} | "
            f"{r['delta_bootstrap_std_meV_atom']:.1f} | {r['corr_gamma_thickness']:+.2f} | "
            f"{r['residual_std_J_m2']:.3f} | {-r['delta_meV_atom']:+.1f} | {bias} |"
        )
    for name in sets:
        r = results[name]
        lines += [
            "",
            f"## {name}: the slabs (bulk e_b = {r['bulk_energy_eV_atom']:.4f} eV/atom, lowest of "
            f"{r['elastic_frames']} Elastic training frames)",
            "",
            "| part | entry | description | atoms | face area (A^2) | gap (A) | (E - n e_b)/n (meV/atom) | "
            "gamma if delta = 0 (J/m^2) | residual of the fit (J/m^2) |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for f in r["frames"]:
            lines.append(
                f"| {f['part']} | {f['index']} | {f['description'][-32:]} | {f['atoms']} | {f['area_A2']:.1f} | "
                f"{f['gap_A']:.1f} | {f['excess_meV_atom']:.1f} | {f['gamma_if_no_offset_J_m2']:.2f} | "
                f"{f['residual_J_m2']:+.3f} |"
            )
        runs = r["model_training_surface_bias_meV_atom"]
        if runs:
            lines += [
                "",
                "Models' mean signed error on the training Surface frames (mlearn_groups.json): "
                + "; ".join(f"{k} {v:+.1f}" for k, v in runs.items()),
            ]
    return "\n".join(lines) + "\n"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sets = [s for s in results if s != "meta"]
    fig, axes = plt.subplots(1, len(sets), figsize=(3.6 * len(sets), 3.3), squeeze=False)
    for ax, name in zip(axes[0], sets, strict=False):
        r = results[name]
        x = np.array(
            [f["atoms"] / (2 * f["area_A2"]) for f in r["frames"]]
        )  # atoms per A^2 of face
        y = np.array([f["gamma_if_no_offset_J_m2"] for f in r["frames"]])
        test = np.array([f["part"] == "test" for f in r["frames"]])
        ax.plot(x[~test], y[~test], "o", ms=4, label="training slabs")
        ax.plot(x[test], y[test], "s", ms=5, label="test slabs")
        grid = np.linspace(0, x.max() * 1.05, 20)
        ax.plot(
            grid,
            r["gamma_J_m2"] + r["delta_meV_atom"] / 1000.0 * grid * EV_PER_A2_TO_J_PER_M2,
            "k-",
            lw=1,
            label=f"gamma {r['gamma_J_m2']:.2f} J/m², delta {r['delta_meV_atom']:+.0f} meV/atom",
        )
        ax.set(title=name, xlabel="n / 2A (atoms per Å² of face)", ylabel="(E − n e_b) / 2A (J/m²)")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
