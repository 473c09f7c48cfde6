"""The paper study's claim 1 at the ELBO-optimal posterior widths (a convergence check).

The study's runs (benchmarks/paper/study.py) train for a fixed number of optimizer steps, and
the checks at 4,000 and 8,000 steps showed the posterior widths s still moving by +27 to +244 %
while the RMSE moved by less than 7 %: the features converge, the widths do not. For fixed
features the negative ELBO is minimised over the widths in closed form (docs/method.md s.4,
benchmarks.paper.posterior_optimum). This script takes every saved bgnn model of a study (its work dir
holds ``bgnn_f<fraction>_s<seed>/model.pt``), re-evaluates it as trained (a check against the
study's record) and with its widths set to the optimum for its own training features, and
reports claim 1 (epistemic std falls from the smallest to the largest fraction while the mean
posterior s does not fall) both ways; with ``--check`` studies (the same runs trained longer) it
compares the optimal view across training lengths: if the features have converged, the optimal
widths agree. Resumable (one JSONL line per model). Results: ``OUT/paper_study_optimum.{md,json,jsonl}``.

    python -m benchmarks.paper.optimum \\
        --study benchmarks/results/paper_study/esol=runs/paper_study_steps2000/esol \\
        --check benchmarks/results/paper_study/convergence_esol=runs/paper_study_steps4000/esol
    python -m benchmarks.paper.optimum --quick --out /tmp/pso   # a --quick paper study made on the spot
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common.pages import rerun_command
from benchmarks.common.records import append_jsonl, read_jsonl
from benchmarks.paper import study as ps
from benchmarks.paper.lpa import study_record
from benchmarks.paper.posterior_optimum import with_optimal_posterior
from benchmarks.paper.report import acceptance
from benchmarks.paper.summary import CHECK_KEYS, compare_check
from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.data import training_subset
from mlip_unc.models.factory import PropertyPredictor

REPO = Path(__file__).resolve().parents[2]
STEM = "paper_study_optimum"
KEYS = (
    "rmse",
    "mean_epistemic_std",
    "mean_std",
    "mean_s",
    "mean_kappa",
    "nll",
    "struct_cal_knn",
    "struct_cal_tanimoto",
)
NAMES = {
    "esol": "ESOL",
    "freesolv": "FreeSolv",
    "lipo": "Lipophilicity",
    ps.QUICK_DATASET: "synthetic (quick)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--study",
        action="append",
        default=[],
        metavar="RESULTS=WORK",
        help="A study's results folder (paper_study.jsonl) and its work dir (the bgnn models).",
    )
    p.add_argument(
        "--check",
        action="append",
        default=[],
        metavar="RESULTS=WORK",
        help="The same runs trained longer (compared with the study of the same dataset).",
    )
    p.add_argument(
        "--data-root", type=Path, default=None, help="Default: $MLIP_UNC_DATA, else ../shared/data."
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument(
        "--quick",
        action="store_true",
        help="Run paper_study.py --quick into a temporary folder, then this.",
    )
    p.add_argument(
        "--report-only", action="store_true", help=f"Only rewrite OUT/{STEM}.md from its JSON."
    )
    args = p.parse_args(argv)
    if args.data_root is None:
        env = os.environ.get("MLIP_UNC_DATA")
        args.data_root = Path(env) if env else REPO.parent / "shared" / "data"
    if not args.quick and not args.study and not args.report_only:
        p.error("give at least one --study RESULTS=WORK (or --quick)")
    return args


def _pair(text: str) -> tuple[Path, Path]:
    results, _, work = text.partition("=")
    if not work:
        raise SystemExit(f"error: {text!r}: expected RESULTS=WORK")
    return Path(results), Path(work)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


# ============================================================================ one model
_LOADED: dict[str, Any] = {}


def evaluate(study: Path, work: Path, record: dict[str, Any], data_root: Path) -> dict[str, Any]:
    """The bgnn model of ``record`` as trained and at its optimal widths: the KEYS of each."""
    fraction, seed = float(record["fraction"]), int(record["seed"])
    dataset = record["settings"]["dataset"]
    if _LOADED.get("dataset") != dataset:  # the dataset and its split, loaded once per dataset
        by_row, split = ps.load_study_data(dataset, data_root)
        _LOADED.update(dataset=dataset, by_row=by_row, split=split)
    by_row, split = _LOADED["by_row"], _LOADED["split"]
    rows = training_subset(split.train, fraction / 100.0, seed) if fraction < 100 else split.train
    train, test = [by_row[r] for r in rows], [by_row[r] for r in split.test]
    predictor = PropertyPredictor.load(ps.bgnn_path(work, fraction, seed))
    beta = predictor.config.train.beta
    trained = study_record(predictor.model, train, test)
    optimal = study_record(with_optimal_posterior(predictor.model, train, beta=beta), train, test)
    return {
        "study": _shown(study),
        "work": _shown(work),
        "dataset": dataset,
        "fraction": fraction,
        "seed": seed,
        "n_steps": record["n_steps"],
        "n_train": len(train),
        "beta": beta,
        "recorded_epistemic_std": record["mean_epistemic_std"],
        "trained": {k: trained[k] for k in KEYS},
        "optimal": {k: optimal[k] for k in KEYS},
    }


def run(pairs: list[tuple[Path, Path]], jsonl: Path, data_root: Path) -> list[dict[str, Any]]:
    rows = read_jsonl(jsonl)
    done = {(r["study"], r["fraction"], r["seed"]) for r in rows}
    for study, work in pairs:
        bgnn = [r for r in ps.read_records(study / f"{ps.STEM}.jsonl") if r["variant"] == "bgnn"]
        if not bgnn:
            raise SystemExit(f"error: no bgnn records in {study / (ps.STEM + '.jsonl')}")
        for rec in bgnn:
            if (_shown(study), float(rec["fraction"]), int(rec["seed"])) in done:
                continue
            if not ps.bgnn_path(work, rec["fraction"], rec["seed"]).is_file():
                print(
                    f"skipped: no model at {ps.bgnn_path(work, rec['fraction'], rec['seed'])}",
                    flush=True,
                )
                continue
            start = time.monotonic()
            row = evaluate(study, work, rec, data_root)
            append_jsonl(jsonl, row)
            rows.append(row)
            t, o = row["trained"], row["optimal"]
            print(
                f"{row['study']} {row['fraction']:g} % seed {row['seed']}: epi std {t['mean_epistemic_std']:.3f} -> "
                f"{o['mean_epistemic_std']:.3f}, s {t['mean_s']:.3f} -> {o['mean_s']:.3f}, kappa "
                f"{t['mean_kappa']:.3f} -> {o['mean_kappa']:.3f} ({time.monotonic() - start:.0f} s)",
                flush=True,
            )
    return rows


# ============================================================================ report
def pseudo_records(rows: list[dict[str, Any]], view: str) -> list[dict[str, Any]]:
    """Rows as study records of variant bgnn (for benchmarks.paper.report.acceptance and compare_check)."""
    return [
        {
            **r[view],
            "variant": "bgnn",
            "fraction": r["fraction"],
            "seed": r["seed"],
            "n_steps": r["n_steps"],
        }
        for r in rows
    ]


def study_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "dataset": rows[0]["dataset"],
        "study": rows[0]["study"],
        "n_models": len(rows),
        "max_abs_check_diff": max(
            abs(r["trained"]["mean_epistemic_std"] - r["recorded_epistemic_std"]) for r in rows
        ),
    }
    for view in ("trained", "optimal"):
        fig = acceptance(pseudo_records(rows, view))["figure1"]
        out[view] = {
            "line": fig["line"],
            "epistemic": fig.get("epistemic"),
            "values": fig.get("values"),
        }
    table = []
    for fraction in sorted({r["fraction"] for r in rows}):
        cell = [r for r in rows if r["fraction"] == fraction]
        table.append(
            {
                "fraction": fraction,
                "seeds": sorted(r["seed"] for r in cell),
                "steps": float(np.mean([r["n_steps"] for r in cell])),
                **{
                    f"{view}_{k}": float(np.mean([r[view][k] for r in cell]))
                    for view in ("trained", "optimal")
                    for k in KEYS
                },
            }
        )
    out["table"] = table
    return out


def check_summary(main: list[dict[str, Any]], check: list[dict[str, Any]]) -> dict[str, Any]:
    """The optimal (and trained) view of the same runs trained longer, on shared seeds."""
    out = {"study": main[0]["study"], "check": check[0]["study"]}
    for view in ("trained", "optimal"):
        rows = compare_check(pseudo_records(main, view), pseudo_records(check, view))
        moves = [abs(r[k][2]) for r in rows for k in CHECK_KEYS if math.isfinite(r[k][2])]
        out[view] = {
            "rows": rows,
            "largest_move_pct": max(moves) if moves else None,
            "converged_10pct": bool(moves) and max(moves) <= 10.0,
        }
    return out


def _f(v: Any, spec: str = ".3g") -> str:
    return (
        "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)
    )


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Paper study, claim 1, at the ELBO-optimal posterior widths",
        "",
        *(["QUICK smoke run (synthetic data, not a benchmark).", ""] if result["quick"] else []),
        (
            "Every saved bgnn model of each study, evaluated on the study's test set as trained and with the last "
            "layer's widths set to their optimum for its own training features (benchmarks.paper.posterior_optimum: s_k^2 = "
            "(1/sigma_p^2 + sum_n z_nk^2 / (beta sigma_n^2))^-1, the means and features as trained). Claim 1 is "
            "judged as in paper_study.md (benchmarks.paper.report.acceptance: epistemic std falls from the smallest to the "
            "largest fraction and the mean posterior s does not fall; means over the seeds both cells share). "
            f"Started {result['started']}, finished {result['finished']}."
        ),
        "",
    ]
    cols = ("rmse", "mean_epistemic_std", "mean_s", "mean_kappa", "struct_cal_knn")
    for s in result["studies"]:
        lines += [
            f"## {NAMES.get(s['dataset'], s['dataset'])} (`{s['study']}`, {s['n_models']} models)",
            "",
            f"Check of the re-evaluation: largest |epistemic std - study's record| {s['max_abs_check_diff']:.2e}.",
            "",
            "| fraction % | seeds | steps | "
            + " | ".join(f"{c} trained -> optimal" for c in cols)
            + " |",
            "|---|---|---|" + "---|" * len(cols),
        ]
        for row in s["table"]:
            lines.append(
                f"| {row['fraction']:g} | {len(row['seeds'])} | {row['steps']:.0f} | "
                + " | ".join(
                    f"{_f(row['trained_' + c])} -> {_f(row['optimal_' + c])}" for c in cols
                )
                + " |"
            )
        lines += [
            "",
            f"- As trained: {s['trained']['line']}",
            f"- At the optimal widths: {s['optimal']['line']}",
            "",
        ]
    if result["checks"]:
        lines += [
            "## The optimal view across training lengths",
            "",
            "The same runs trained longer (shared seeds): relative change of the seed means, study -> check. "
            "Converged: every quantity within 10 %.",
            "",
            "| study -> check | view | fraction % | seeds | steps | "
            + " | ".join(CHECK_KEYS)
            + " |",
            "|---|---|---|---|---|" + "---|" * len(CHECK_KEYS),
        ]
        for c in result["checks"]:
            for view in ("trained", "optimal"):
                for r in c[view]["rows"]:
                    lines.append(
                        f"| `{c['study']}` -> `{c['check']}` | {view} | {r['fraction']:g} | {len(r['seeds'])} | "
                        f"{r['steps'][0]:.0f} -> {r['steps'][1]:.0f} | "
                        + " | ".join(
                            f"{_f(r[k][0])} -> {_f(r[k][1])} ({r[k][2]:+.0f} %)" for k in CHECK_KEYS
                        )
                        + " |"
                    )
        lines.append("")
        for c in result["checks"]:
            lines.append(
                f"- `{c['study']}` -> `{c['check']}`: largest move as trained "
                f"{_f(c['trained']['largest_move_pct'], '.0f')} % (converged: "
                f"{'yes' if c['trained']['converged_10pct'] else 'no'}), at the optimal widths "
                f"{_f(c['optimal']['largest_move_pct'], '.0f')} % (converged: "
                f"{'yes' if c['optimal']['converged_10pct'] else 'no'})."
            )
        lines.append("")
    lines += [f"Command: `{rerun_command(result['command'])}`", ""]
    return "\n".join(lines)


def markdown_section(result: dict[str, Any], link: str) -> str:
    """The summary's paragraph (benchmarks/paper/summary.py --optimum)."""
    lines = [
        f"### Claim 1 at the ELBO-optimal posterior widths ([{Path(link).name}]({link}))",
        "",
        (
            "The saved bgnn models re-evaluated with the last layer's widths at their closed-form optimum for their "
            "own training features (means and features as trained; benchmarks.paper.posterior_optimum)."
        ),
        "",
    ]
    for s in result["studies"]:
        v = s["optimal"]["values"] or {}

        def pair(k: str, v: dict[str, Any] = v) -> str:
            return f"{_f(v[k][0])} -> {_f(v[k][1])}" if k in v else "n/a"

        lines.append(
            f"- {NAMES.get(s['dataset'], s['dataset'])}: epistemic std {pair('mean_epistemic_std')}, mean s "
            f"{pair('mean_s')}, kappa {pair('mean_kappa')}: "
            f"{'reproduced' if s['optimal']['epistemic'] else 'not reproduced'} (as trained: "
            f"{'reproduced' if s['trained']['epistemic'] else 'not reproduced'})."
        )
    for c in result["checks"]:
        lines.append(
            f"- `{c['study']}` -> `{c['check']}`: largest move {_f(c['trained']['largest_move_pct'], '.0f')} % "
            f"as trained, {_f(c['optimal']['largest_move_pct'], '.0f')} % at the optimal widths."
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report_only:
        result = json.loads((args.out / f"{STEM}.json").read_text(encoding="utf-8"))
        atomic_write_text(args.out / f"{STEM}.md", markdown(result))
        return result
    torch.set_num_threads(args.threads)
    command = shlex.join(
        ["python", "-m", "benchmarks.paper.optimum", *(sys.argv[1:] if argv is None else argv)]
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pso_") as tmp:
        if args.quick:
            study, work = Path(tmp) / "study", Path(tmp) / "work"
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.paper.study",
                    "--quick",
                    "--out",
                    str(study),
                    "--work-dir",
                    str(work),
                ],
                check=True,
                env=env,
                cwd=REPO,
                capture_output=True,
            )
            args.study, args.check = [f"{study}={work}"], []
        studies, checks = [_pair(t) for t in args.study], [_pair(t) for t in args.check]
        jsonl = (Path(tmp) if args.quick else args.out) / f"{STEM}.jsonl"  # --quick: nothing kept
        rows = run(studies + checks, jsonl, args.data_root)
    by_study: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_study.setdefault(r["study"], []).append(r)
    main_ids = [_shown(s) for s, _ in studies if _shown(s) in by_study]
    check_ids = [_shown(s) for s, _ in checks if _shown(s) in by_study]
    result = {
        "command": command,
        "quick": args.quick,
        "started": started,
        "studies": [study_summary(by_study[s]) for s in main_ids],
        "checks": [
            check_summary(by_study[m], by_study[c])
            for c in check_ids
            for m in main_ids
            if by_study[m][0]["dataset"] == by_study[c][0]["dataset"]
        ],
    }
    result["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    atomic_write_text(args.out / f"{STEM}.json", json.dumps(result, indent=1, default=float))
    atomic_write_text(args.out / f"{STEM}.md", markdown(result))
    print(f"wrote {args.out / STEM}.md")
    return result


if __name__ == "__main__":
    main()
