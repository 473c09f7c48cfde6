"""Does the energy weight of the learned-noise NLL hold back the forces? (issue 12)

The hypothesis: with learned noises the NLL weights each structure's energy against its force
components as ``1/sigma_E^2 : 1/sigma_F^2``, thousands of times more energy-heavy than MACE's
1 : 100 loss, so the forces learn slowly. The probe trains the native equivariant model
(``configs/ethanol_equivariant.yaml``) for a fixed number of epochs (immune to CPU contention,
unlike a wall-time budget) with ``loss.energy_weight`` = 1, 0.01 and 3e-4 (``--map-heads``: also
with a MAP head, no weight sampling during training) and the full posterior
skipped (``model.posterior=diagonal``: the means do not depend on it), then reads the test
metrics (ethanol test_MD, 1000 frames) from each run's history.json. Resumable: a weight whose
run has test metrics is not trained again.

    python benchmarks/energy_weight_probe.py --epochs 40 --work-dir runs/probe_ew
    python benchmarks/energy_weight_probe.py --quick --out /tmp/ewp   # tiny EMT data, 1 epoch
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from mlip_unc.atomic import atomic_write_text

REPO = Path(__file__).resolve().parents[1]
WEIGHTS = (1.0, 0.01, 0.0003)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--weights", type=float, nargs="+", default=list(WEIGHTS))
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument(
        "--map-heads",
        action="store_true",
        help="Also each weight with a MAP (point-estimate) head: does the Bayesian head's weight sampling "
        "during training cost force accuracy?",
    )
    p.add_argument("--config", type=Path, default=REPO / "configs" / "ethanol_equivariant.yaml")
    p.add_argument("--work-dir", type=Path, default=REPO / "runs" / "probe_ew")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--name", default="energy_weight_probe", help="Stem of the .md/.json written under --out."
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="Extra config override for every run (repeatable), e.g. loss.energy_count=atom.",
    )
    p.add_argument(
        "--note",
        default="",
        help="A sentence printed under the command (what differs from earlier probes).",
    )
    p.add_argument(
        "--quick", action="store_true", help="Tiny EMT Cu data (tests/CI), 1 epoch, 2 weights."
    )
    return p.parse_args(argv)


def quick_config(work: Path) -> Path:
    """A tiny GIN on rattled EMT Cu cells, with a test set."""
    import ase.io
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    frames = []
    for k in range(12):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.rattle(0.08, seed=k)
        atoms.calc = EMT()
        atoms.calc = SinglePointCalculator(
            atoms, energy=atoms.get_potential_energy(), forces=atoms.get_forces()
        )
        frames.append(atoms)
    ase.io.write(work / "train.xyz", frames[:9])
    ase.io.write(work / "test.xyz", frames[9:])
    cfg = work / "quick.yaml"
    cfg.write_text(f"""seed: 0
data: {{train: {work / "train.xyz"}, test: {work / "test.xyz"}, valid_fraction: 0.2, r_max: 4.0}}
model: {{backbone: gin, backbone_kwargs: {{hidden: 8, num_layers: 1}}, latent_dim: 4}}
train: {{batch_size: 4, lr: 0.01}}
""")
    return cfg


def run_one(args: argparse.Namespace, weight: float, head: str = "bayesian") -> dict[str, Any]:
    out = args.work_dir / (f"ew_{weight:g}" if head == "bayesian" else f"{head}_ew_{weight:g}")
    history = out / "history.json"
    if not (history.is_file() and "test" in json.loads(history.read_text())):
        cmd = [
            str(Path(sys.executable).parent / "mlip-unc"),
            "train",
            "-c",
            str(args.config),
            "--threads",
            "1",
            "--out",
            str(out),
            "--overwrite",
            "--set",
            f"train.epochs={args.epochs}",
            "--set",
            "train.max_minutes=null",
            "--set",
            "model.posterior=diagonal",
            "--set",
            f"loss.energy_weight={weight}",
            "--set",
            f"model.head={head}",
            "--set",
            "train.progress=false",
            *(x for o in args.overrides for x in ("--set", o)),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"training with energy_weight={weight} failed:\n{done.stderr[-3000:]}")
    h = json.loads(history.read_text())
    last = h["epochs"][-1]
    return {
        "head": head,
        "energy_weight": weight,
        "epochs": len(h["epochs"]),
        "train_minutes": h["train_minutes"],
        "energy_mae_meV_atom": h["test"]["energy_mae_meV_atom"],
        "forces_mae_meV_A": h["test"]["forces_mae_meV_A"],
        "sigma_e_meV_atom": last.get("sigma_e_meV_atom"),
        "sigma_f_meV_A": last.get("sigma_f_meV_A"),
        "n_test_frames": h["test"]["n_frames"],
    }


def markdown(r: dict[str, Any]) -> str:
    cols = (
        "head",
        "energy_weight",
        "epochs",
        "energy_mae_meV_atom",
        "forces_mae_meV_A",
        "sigma_e_meV_atom",
        "sigma_f_meV_A",
        "train_minutes",
    )
    rows = [
        f"| {' | '.join(format(row[c], '' if isinstance(row[c], str) else '.4g') for c in cols)} |"
        for row in r["runs"]
    ]
    first, best = r["runs"][0], min(r["runs"], key=lambda row: row["forces_mae_meV_A"])
    reading = (
        f"Lowest test force MAE: {best['head']} head, energy_weight {best['energy_weight']:g} "
        f"({best['forces_mae_meV_A']:.1f} meV/A; "
        f"{first['forces_mae_meV_A']:.1f} at weight {first['energy_weight']:g}). The spread of the force MAE "
        f"over the weights is {max(x['forces_mae_meV_A'] for x in r['runs']) - min(x['forces_mae_meV_A'] for x in r['runs']):.1f} meV/A "
        f"while the energy MAE goes from {min(x['energy_mae_meV_atom'] for x in r['runs']):.2f} to "
        f"{max(x['energy_mae_meV_atom'] for x in r['runs']):.2f} meV/atom."
    )
    return "\n".join(
        [
            "# Energy weight of the learned-noise NLL vs force accuracy (issue 12 probe)",
            "",
            f"Command: `{r['command']}`",
            "",
            *([r["note"], ""] if r.get("note") else []),
            *(["QUICK smoke run (EMT Cu, not ethanol).", ""] if r["quick"] else []),
            (
                f"Config `{r['config']}`{' with ' + ', '.join(r.get('overrides') or []) if r.get('overrides') else ''}, seed 0, {r['epochs']} epochs per run (the config's learning-rate schedule over those epochs), one torch "
                "thread, full posterior skipped (model.posterior=diagonal). One run per weight. Test metrics on "
                f"{r['runs'][0]['n_test_frames']} frames; sigma_e, sigma_f: the learned noises at the last epoch."
            ),
            "",
            f"| {' | '.join(cols)} |",
            "|" + "---|" * len(cols),
            *rows,
            "",
            reading,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    command = shlex.join(
        ["python", "benchmarks/energy_weight_probe.py", *(sys.argv[1:] if argv is None else argv)]
    )
    with tempfile.TemporaryDirectory(prefix="ewp_") as tmp:
        if args.quick:
            args.config, args.epochs, args.weights, args.work_dir = (
                quick_config(Path(tmp)),
                1,
                [1.0, 0.01],
                Path(tmp),
            )
        heads = ["bayesian", "map"] if args.map_heads else ["bayesian"]
        runs = [run_one(args, w, head) for head in heads for w in args.weights]
    config = (
        str(args.config.relative_to(REPO)) if args.config.is_relative_to(REPO) else args.config.name
    )
    result = {
        "command": command,
        "quick": args.quick,
        "config": config,
        "epochs": args.epochs,
        "overrides": args.overrides,
        "note": args.note,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / f"{args.name}.json", json.dumps(result, indent=1))
    atomic_write_text(args.out / f"{args.name}.md", markdown(result))
    print(f"wrote {args.out / f'{args.name}.md'}")
    return result


if __name__ == "__main__":
    main()
