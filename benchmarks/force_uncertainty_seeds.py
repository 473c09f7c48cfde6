"""Several runs of benchmarks/force_uncertainty.py side by side (issue 11): one data set, each
run with its own seed (weights, split and committee), every run listed, then the mean and
spread of each row's metrics and of the default-committee5 gaps, and how many runs meet each
target. Reads the runs' force_uncertainty.json; trains nothing.

    python benchmarks/force_uncertainty_seeds.py --dataset 3bpa \\
        --runs benchmarks/results/force_uncertainty_angular benchmarks/results/force_uncertainty_seeds/seed1 \\
        --out benchmarks/results/force_uncertainty_seeds
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import force_uncertainty as fu  # noqa: E402

from mlip_unc.atomic import atomic_write, atomic_write_text  # noqa: E402

ROWS = ("default", "committee5", "force_magnitude")
SUBSPACE_KEYS = ("spearman_frame_in_domain", "partial_spearman_given_force", "auroc_ood")


def _g(value: float | None, spread: float | None = None) -> str:
    """force_uncertainty's three decimals (the targets are met or missed at that level), ± spread."""
    return fu._f3(value) + ("" if value is None or spread is None else f" ± {spread:.3f}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="3bpa")
    p.add_argument(
        "--runs", type=Path, nargs="+", required=True, help="folders holding force_uncertainty.json"
    )
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def load_run(folder: Path, dataset: str) -> dict[str, Any]:
    """One run's rows (the default under its own name and as "default"), seed, settings and gaps."""
    path = folder / "force_uncertainty.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no results (run benchmarks/force_uncertainty.py --out {folder} first)"
        )
    res = json.loads(path.read_text())
    if dataset not in res:
        raise KeyError(f"{path}: no data set {dataset!r} (has {[k for k in res if k != 'meta']})")
    entry, meta = res[dataset], res["meta"]
    return {
        "folder": str(
            folder.resolve().relative_to(REPO) if folder.resolve().is_relative_to(REPO) else folder
        ),
        "seed": meta.get("seed"),
        "overrides": meta.get("overrides", []),
        "status": meta.get("status"),
        "default_name": entry["default"],
        "rows": {r: entry.get(entry["default"] if r == "default" else r, {}) for r in ROWS},
        "acceptance": fu.acceptance(entry),
        "gaps": meta.get("paired_bootstrap", {}).get(dataset, {}),
        "posterior": meta.get("posterior", {}).get(dataset),
        "refitted": meta.get("refitted", {}).get(dataset),
        "subspaces": _subspace_rows(folder / "posterior_variants.json", dataset),
    }


def _subspace_rows(path: Path, dataset: str) -> list[dict[str, Any]] | None:
    """The run's low-rank subspace study (benchmarks/posterior_variants.py), or None if not run there."""
    if not path.is_file():
        return None
    return ((json.loads(path.read_text()).get(dataset) or {}).get("subspaces") or {}).get("rows")


def summarise_subspaces(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (subspace, rank) of posterior_variants' study: each run's ranking metrics, their mean, and
    in how many runs issue 11's three ranking lines hold against that run's committee5."""
    runs = [r for r in runs if r["subspaces"]]
    if not runs:
        return []
    out = []
    for first in runs[0]["subspaces"]:
        key = (first["subspace"], first["rank"])
        per_run, met_all = [], 0
        for r in runs:
            row = next((x for x in r["subspaces"] if (x["subspace"], x["rank"]) == key), None)
            if row is None:
                continue
            lines = fu.acceptance({"default": "x", "x": row, "committee5": r["rows"]["committee5"]})
            met = [
                line.endswith(": met") for line in lines if line.split(" =")[0][2:] in SUBSPACE_KEYS
            ]
            met_all += all(met)
            per_run.append({k: row.get(k) for k in SUBSPACE_KEYS})
        out.append(
            {
                "subspace": key[0],
                "rank": key[1],
                "per_run": per_run,
                "runs_meeting_all_three": met_all,
                "n": len(per_run),
                "mean": {k: float(np.mean([v[k] for v in per_run])) for k in SUBSPACE_KEYS},
            }
        )
    return out


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and std over runs of every row's metrics, of the gaps, and the targets met per run."""
    stats: dict[str, Any] = {}
    for row in ROWS:
        stats[row] = {}
        for key in fu.ROW_KEYS:
            vals = [r["rows"][row].get(key) for r in runs if r["rows"][row].get(key) is not None]
            if vals:
                stats[row][key] = {
                    "mean": float(np.mean(vals)),
                    "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else None,
                    "n": len(vals),
                }
    gaps = {}
    for key, (slack, _, _) in fu.TARGETS.items():
        if slack is None:
            continue
        vals = [
            r["rows"]["default"][key] - r["rows"]["committee5"][key]
            for r in runs
            if r["rows"]["default"].get(key) is not None
            and r["rows"]["committee5"].get(key) is not None
        ]
        if vals:
            gaps[key] = {
                "mean": float(np.mean(vals)),
                "std": float(np.std(vals, ddof=1)) if len(vals) > 1 else None,
                "per_run": vals,
                "slack": slack,
            }
    met = {
        key: sum(
            any(
                line.startswith(f"- {key} =") and line.endswith(": met") for line in r["acceptance"]
            )
            for r in runs
        )
        for key in fu.TARGETS
    }
    means = {row: {k: v["mean"] for k, v in stats[row].items()} for row in ROWS}
    mean_entry = {
        "default": "mean of the defaults",
        "mean of the defaults": means["default"],
        "committee5": means["committee5"],
    }
    return {
        "stats": stats,
        "gaps": gaps,
        "targets_met": met,
        "n_runs": len(runs),
        "acceptance_of_means": fu.acceptance(mean_entry),
    }


def write_markdown(out: dict[str, Any], dataset: str, path: Path) -> None:
    runs, s = out["runs"], out["summary"]
    lines = [
        f"# Force uncertainty on {dataset}: {s['n_runs']} runs side by side",
        "",
        f"Command: `{out['meta']['command']}` ({out['meta']['updated']}). Each run: its own seed of weights, split "
        "and committee; the rows are its default mode (the config's posterior), its 5-member committee of the same "
        "architecture and budget, and |F_pred| alone, on the same frames. Nothing is dropped: every run given is "
        "listed and averaged.",
        "",
        "## Runs",
        "",
        "| run | seed | default | "
        + " | ".join(f"{k} (default / committee5)" for k in fu.TARGETS)
        + " | targets met |",
        "|---" * (len(fu.TARGETS) + 4) + "|",
    ]
    for r in runs:
        cells = [
            f"{_g(r['rows']['default'].get(k))} / {_g(r['rows']['committee5'].get(k))}"
            for k in fu.TARGETS
        ]
        met = sum(line.endswith(": met") for line in r["acceptance"])
        lines.append(
            f"| {r['folder']} | {r['seed']} | {r['default_name']} | "
            + " | ".join(cells)
            + f" | {met} of {len(fu.TARGETS)} |"
        )
    lines += ["", "Per run, issue 11's lines (from each run's own force_uncertainty.json):", ""]
    for r in runs:
        extra = (f"; posterior {r['posterior']}" if r["posterior"] else "") + (
            f"; refitted {r['refitted']}" if r["refitted"] else ""
        )
        lines += [
            f"- {r['folder']} (seed {r['seed']}, overrides {r['overrides'] or 'none'}{extra}):",
            *(f"  {line}" for line in r["acceptance"]),
            *(
                f"  - paired bootstrap {k}: gap {g['gap']:+.3f} +- {g['std']:.3f}, "
                f"{100 * g['p_within_slack']:.0f} % of resamples within the slack"
                for k, g in r["gaps"].items()
            ),
        ]
    lines += [
        "",
        "## Mean over runs (std across runs)",
        "",
        "| row | " + " | ".join(fu.ROW_KEYS) + " |",
        "|---" * (len(fu.ROW_KEYS) + 1) + "|",
    ]
    for row in ROWS:
        st = s["stats"][row]
        lines.append(
            f"| {row} | "
            + " | ".join(_g(st[k]["mean"], st[k]["std"]) if k in st else "n/a" for k in fu.ROW_KEYS)
            + " |"
        )
    lines += ["", "Gap default - committee5, per run and mean (the target asks gap >= -slack):", ""]
    for key, g in s["gaps"].items():
        per = ", ".join(f"{v:+.3f}" for v in g["per_run"])
        lines.append(
            f"- {key}: {per}; mean {g['mean']:+.3f}"
            + (f" +- {g['std']:.3f}" if g["std"] is not None else "")
            + f" (slack {g['slack']:g}); runs meeting the target: {s['targets_met'][key]} of {s['n_runs']}"
        )
    for key in fu.TARGETS:
        if key not in s["gaps"]:
            lines.append(
                f"- {key}: runs meeting the target: {s['targets_met'][key]} of {s['n_runs']}"
            )
    lines += [
        "",
        "Issue 11's lines applied to the means over runs:",
        "",
        *s["acceptance_of_means"],
        "",
    ]
    if sub := out.get("subspaces"):
        lines += [
            "## Which r directions the low-rank mode keeps (posterior_variants.py, post hoc)",
            "",
            "From each run's posterior_variants.json (`subspaces`: rotations of the same posterior at the same cost "
            "per rank; least_constrained is the shipped choice, exact the whole posterior). Per run, then the mean; "
            "'runs meeting' counts the runs in which the three ranking lines (in-domain, partial, OOD AUROC, against "
            "that run's committee5) all hold.",
            "",
            "| subspace | rank | "
            + " | ".join(f"{k} (per run; mean)" for k in SUBSPACE_KEYS)
            + " | runs meeting |",
            "|---" * (len(SUBSPACE_KEYS) + 3) + "|",
        ]
        for row in sub:
            cells = [
                ", ".join(_g(v[k]) for v in row["per_run"]) + f"; {_g(row['mean'][k])}"
                for k in SUBSPACE_KEYS
            ]
            lines.append(
                f"| {row['subspace']} | {row['rank']} | "
                + " | ".join(cells)
                + f" | {row['runs_meeting_all_three']} of {row['n']} |"
            )
        lines.append("")
    lines += ["![per-run scores](force_uncertainty_seeds.png)", ""]
    atomic_write_text(path, "\n".join(lines))


def plot(out: dict[str, Any], path: Path) -> None:
    keys = ("spearman_frame_in_domain", "partial_spearman_given_force", "auroc_ood")
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.4))
    for ax, key in zip(axes, keys, strict=False):
        for k, (row, marker) in enumerate(zip(ROWS, ("o", "s", "^"), strict=False)):
            vals = [r["rows"][row].get(key) for r in out["runs"]]
            xs = [i + (k - 1) * 0.15 for i, v in enumerate(vals) if v is not None]
            ax.scatter(xs, [v for v in vals if v is not None], marker=marker, label=row)
        ax.set_xticks(range(len(out["runs"])), [f"seed {r['seed']}" for r in out["runs"]])
        ax.set_title(key, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    runs = [load_run(folder, args.dataset) for folder in args.runs]
    command = shlex.join(
        [
            "python",
            "benchmarks/force_uncertainty_seeds.py",
            *(sys.argv[1:] if argv is None else argv),
        ]
    )
    meta = {"command": command, "updated": time.strftime("%Y-%m-%d %H:%M"), "dataset": args.dataset}
    out = {
        "runs": runs,
        "summary": summarise(runs),
        "subspaces": summarise_subspaces(runs),
        "meta": meta,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        args.out / "force_uncertainty_seeds.json", json.dumps(fu._clean(out), indent=1)
    )
    write_markdown(out, args.dataset, args.out / "force_uncertainty_seeds.md")
    plot(out, args.out / "force_uncertainty_seeds.png")
    return out


if __name__ == "__main__":
    main()
