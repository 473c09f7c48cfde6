"""Every single-model route measured on issue 11's runs, against both committees: one table, one plot.

Reads committed results only (no training, no evaluation). For each run folder (a
benchmarks/force_uncertainty.py ``--out``, one dataset) it collects the rows that were scored on
that run's in-domain and OOD frames:

- ``force_uncertainty.json``: the default (lowrank), exact and sampled modes, committee A
  (``committee5``), the |F_pred| and latent-distance baselines;
- ``posterior_variants.json``: the shipped posterior (per element, energy + forces precision,
  1e-14 grid floor) at rank 4, 8, 16 and exact, each with the cost timed in that script, and the
  other rank-4 subspaces (not timed; the same r + 1 products as rank 4);
- ``committee_floor.json`` (``--committee-floor``): committee B, trained with other seeds;
- ``trained_factor.json``, ``distance_aware.json``, ``member_llpr.json``,
  ``readout_input_posterior.json`` (``--results``): the trained factor and the posterior fitted on
  it, the distance term, the posterior on every MAP member of committee A (one instance per
  member), and the posterior over the readout's input features (alone or with the latent's; not
  timed: a rank r costs the r + 1 products of the shipped rank r).

Each instance is then held against issue 11's lines (force_uncertainty.TARGETS: in-domain
Spearman, partial Spearman given |F_pred|, OOD AUROC against the committee; std/RMSE; cost) with
committee A and with committee B as the reference. Results: ``OUT/force_uncertainty_routes.{md,json,png}``.

    python benchmarks/force_uncertainty_routes.py --runs R1 R2 R3 --out benchmarks/results/force_uncertainty_routes
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import force_uncertainty as fu  # noqa: E402

from mlip_unc.atomic import atomic_write, atomic_write_text  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
RANKING = ("spearman_frame_in_domain", "partial_spearman_given_force", "auroc_ood")
ALL_LINES = (*RANKING, "std_over_rmse", "cost_ratio")
SHIPPED = {"basis": "per_element", "precision": "energy+forces", "grid_floor": "1e-14"}
# route name -> (source, what it is); the order of the table
ROUTES: dict[str, tuple[str, str]] = {
    "default (lowrank 4)": (
        "force_uncertainty.json",
        "the shipped default: BBB head, per-element LLPR, rank 4",
    ),
    "sampled": ("force_uncertainty.json", "weight draws from the same posterior"),
    "exact": ("force_uncertainty.json", "the whole posterior (d + 1 products)"),
    "per element, rank 8": (
        "posterior_variants.json",
        "the same posterior, 8 least constrained directions",
    ),
    "per element, rank 16": ("posterior_variants.json", "the same posterior, 16 directions"),
    "rank 4, other subspaces": (
        "posterior_variants.json",
        "valid/train variance, half and half, random rotations",
    ),
    "trained factor": (
        "trained_factor.json",
        "MAP head + rank-4 factor trained by the predictive NLL",
    ),
    "trained factor + LLPR": ("trained_factor.json", "the shipped posterior fitted on that model"),
    "distance aware": ("distance_aware.json", "lowrank variance + c d^2, c fitted on validation"),
    "MAP members + LLPR": (
        "member_llpr.json",
        "the shipped posterior on each MAP member of committee A",
    ),
    "readout input x, rank 4": (
        "readout_input_posterior.json",
        "the posterior over the readout's input features",
    ),
    "z + x, rank 4": (
        "readout_input_posterior.json",
        "one posterior over the latent and the readout's input",
    ),
    "z + x, exact": (
        "readout_input_posterior.json",
        "the same, every direction (513 products, not timed; the exact z alone costs 46-53x)",
    ),
    "force_magnitude": ("force_uncertainty.json", "|F_pred| alone (baseline)"),
    "latent_distance": (
        "force_uncertainty.json",
        "latent kNN distance to the training atoms (baseline)",
    ),
    "committee A": ("force_uncertainty.json", "the run's 5-member MAP committee (reference)"),
    "committee B": ("committee_floor.json", "a second 5-member committee, other seeds (reference)"),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs", nargs="+", type=Path, required=True, help="force_uncertainty.py --out folders"
    )
    p.add_argument("--dataset", default="3bpa")
    p.add_argument(
        "--results",
        type=Path,
        default=RESULTS,
        help="folder holding trained_factor/, distance_aware/, member_llpr/, committee_floor/",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "force_uncertainty_routes")
    return p.parse_args(argv)


def _read(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _by_run(summary: Any) -> dict[str, dict[str, Any]]:
    """A summary script's ``runs`` list keyed by the run folder as written there."""
    return {} if summary is None else {str(r["run"]): r for r in summary.get("runs", [])}


def run_instances(
    run: Path, key: str, dataset: str, summaries: dict[str, dict[str, dict[str, Any]]]
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(route, label, row)`` for every row scored on ``run``'s frames; ``key`` names the run in the
    summaries (as their ``--runs`` wrote it)."""
    entry = (_read(run / "force_uncertainty.json") or {}).get(dataset, {})
    for route, name in (
        ("default (lowrank 4)", entry.get("default")),
        ("sampled", "sampled"),
        ("exact", "exact"),
        ("force_magnitude", "force_magnitude"),
        ("latent_distance", "latent_distance"),
        ("committee A", "committee5"),
    ):
        if name in entry:
            yield route, "", entry[name]
    variants = (_read(run / "posterior_variants.json") or {}).get(dataset, {})
    costs = variants.get("cost_ratio", {})
    for row in variants.get("rows", []):
        if all(str(row.get(k)) == v for k, v in SHIPPED.items()) and str(row["rank"]) in (
            "8",
            "16",
        ):
            yield (
                f"per element, rank {row['rank']}",
                "",
                {**row, "cost_ratio": costs.get(f"lowrank{row['rank']}")},
            )
    for row in (variants.get("subspaces") or {}).get("rows", []):
        if row["subspace"] != "least_constrained" and str(row["rank"]) == "4":
            yield "rank 4, other subspaces", row["subspace"], {**row, "cost_ratio": None}
    tf = summaries["trained_factor"].get(key, {}).get("rows", {})
    for route, name in (
        ("trained factor", "trained_factor"),
        ("trained factor + LLPR", "trained_factor_llpr"),
    ):
        if name in tf:
            yield route, "", tf[name]
    da = summaries["distance_aware"].get(key, {}).get("rows", {})
    if "distance_aware" in da:
        yield "distance aware", "", da["distance_aware"]
    for k, member in sorted(
        summaries["member_llpr"].get(key, {}).get("members", {}).items(), key=lambda x: int(x[0])
    ):
        yield "MAP members + LLPR", f"member {k}", member["row"]
    for row in summaries["readout_input_posterior"].get(key, {}).get("rows", []):
        route = {
            ("x", 4): "readout input x, rank 4",
            ("z+x", 4): "z + x, rank 4",
            ("z+x", "exact"): "z + x, exact",
        }
        if (row["features"], row["rank"]) in route:
            yield route[(row["features"], row["rank"])], "", {**row, "cost_ratio": None}
    b = summaries["committee_floor"].get(key, {}).get("rows", {}).get("committee5_b")
    if b is not None:
        yield "committee B", "", b


def lines(row: dict[str, Any], reference: dict[str, Any] | None) -> dict[str, bool | None]:
    """Each of issue 11's lines for ``row`` against ``reference``: met, missed, or None (not
    measured, or no reference)."""
    out: dict[str, bool | None] = {}
    for key in ALL_LINES:
        value = row.get(key)
        if value is None or (key in RANKING and (reference is None or reference.get(key) is None)):
            out[key] = None
            continue
        low, high = fu.target_bounds(key, None if reference is None else reference.get(key))
        out[key] = (low is None or value >= low) and (high is None or value <= high)
    return out


def collect(args: argparse.Namespace) -> dict[str, Any]:
    summaries = {
        stem: _by_run(_read(args.results / stem / f"{stem}.json"))
        for stem in (
            "trained_factor",
            "distance_aware",
            "member_llpr",
            "readout_input_posterior",
            "committee_floor",
        )
    }
    runs = []
    for run in args.runs:
        key = str(run)
        instances = list(run_instances(run, key, args.dataset, summaries))
        refs = {
            name: next((row for route, _, row in instances if route == f"committee {name}"), None)
            for name in "AB"
        }
        seed = (_read(run / "force_uncertainty.json") or {}).get("meta", {}).get("seed")
        rows = []
        for route, label, row in instances:
            versus = {
                name: lines(row, ref) for name, ref in refs.items() if route != f"committee {name}"
            }
            rows.append(
                {
                    "route": route,
                    "label": label,
                    "row": {k: row.get(k) for k in (*ALL_LINES, "force_mae_meV_A")},
                    "lines": versus,
                }
            )
        runs.append(
            {
                "run": key,
                "seed": seed,
                "rows": rows,
                "references": {
                    n: (None if r is None else r.get("auroc_ood")) for n, r in refs.items()
                },
            }
        )
    return {"dataset": args.dataset, "runs": runs, "routes": summarise(runs)}


def _all(verdicts: dict[str, bool | None], keys: tuple[str, ...]) -> bool | None:
    """True when every line in ``keys`` is met, False when one is missed, None when one was not measured."""
    values = [verdicts.get(k) for k in keys]
    return (
        False
        if any(v is False for v in values)
        else None
        if any(v is None for v in values)
        else True
    )


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per route: the instances, the mean of each line's value and the counts of instances that
    meet the three ranking lines / all five, against A and against B."""
    out = []
    for route, (source, what) in ROUTES.items():
        items = [(r, row) for r in runs for row in r["rows"] if row["route"] == route]
        if not items:
            continue
        means = {
            k: (
                float(np.mean(v))
                if (v := [row["row"][k] for _, row in items if row["row"][k] is not None])
                else None
            )
            for k in (*ALL_LINES, "force_mae_meV_A")
        }
        counts: dict[str, Any] = {}
        for ref in "AB":
            for name, keys in (("ranking", RANKING), ("all", ALL_LINES)):
                verdicts = [
                    _all(row["lines"][ref], keys) for _, row in items if ref in row["lines"]
                ]
                counts[f"{name}_vs_{ref}"] = (
                    None
                    if not verdicts
                    else {
                        "met": sum(v is True for v in verdicts),
                        "missed": sum(v is False for v in verdicts),
                        "not_measured": sum(v is None for v in verdicts),
                        "n": len(verdicts),
                    }
                )
        gaps = [
            row["row"]["auroc_ood"] - r["references"]["A"]
            for r, row in items
            if row["row"]["auroc_ood"] is not None and r["references"]["A"] is not None
        ]
        out.append(
            {
                "route": route,
                "source": source,
                "what": what,
                "n": len(items),
                "mean": means,
                "auroc_gap_to_a": {
                    "mean": float(np.mean(gaps)) if gaps else None,
                    "max": float(np.max(gaps)) if gaps else None,
                },
                **counts,
            }
        )
    return out


def _count(c: dict[str, int] | None) -> str:
    if c is None:
        return "n/a"
    return f"{c['met']} of {c['n']}" + (f" ({c['not_measured']} n/m)" if c["not_measured"] else "")


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    runs = summary["runs"]
    head = [
        f"# Issue 11 on {summary['dataset']}: every single-model route against both committees",
        "",
        f"Command: `{summary['meta']['command']}` (updated {summary['meta']['updated']}); it reads the "
        "committed results named in the source column, nothing is trained or evaluated again.",
        "",
        "Runs: "
        + ", ".join(
            f"`{r['run']}` (seed {r['seed']}; committee A's OOD AUROC {fu._f3(r['references']['A'])}, "
            f"B's {fu._f3(r['references']['B'])})"
            for r in runs
        )
        + ".",
        "",
        "Lines (issue 11, force_uncertainty.TARGETS): in-domain Spearman >= committee - 0.05; partial Spearman "
        "given |F_pred| >= committee - 0.05 and > 0.3; OOD AUROC >= committee - 0.03; 0.5 <= std/RMSE <= 2; "
        "cost <= 2x plain E+F. 'Ranking' counts the instances meeting the first three, 'all five' every line; "
        "n/m = a line not measured for that instance (counted as neither met nor missed). A route's instances "
        "are its runs (or members, or subspaces); means are over instances.",
        "",
        "| route | source | n | in-domain | partial | OOD AUROC | AUROC - A (mean / best) | std/RMSE | cost | "
        "F MAE | ranking vs A | ranking vs B | all five vs A | all five vs B |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary["routes"]:
        m, g = s["mean"], s["auroc_gap_to_a"]
        gap = "n/a" if g["mean"] is None else f"{g['mean']:+.3f} / {g['max']:+.3f}"
        head.append(
            f"| {s['route']} | {s['source']} | {s['n']} | {fu._f3(m['spearman_frame_in_domain'])} | "
            f"{fu._f3(m['partial_spearman_given_force'])} | {fu._f3(m['auroc_ood'])} | {gap} | {fu._f3(m['std_over_rmse'])} | "
            f"{_cost(m['cost_ratio'])} | {_mae(m['force_mae_meV_A'])} | {_count(s['ranking_vs_A'])} | "
            f"{_count(s['ranking_vs_B'])} | {_count(s['all_vs_A'])} | {_count(s['all_vs_B'])} |"
        )
    head += [
        "",
        "What each route is: "
        + "; ".join(f"**{s['route']}**: {s['what']}" for s in summary["routes"])
        + ".",
        "",
        "Per instance (in-domain / partial / OOD AUROC / cost; the lines missed against A, then B):",
        "",
    ]
    for r in runs:
        head += [
            f"**seed {r['seed']}** (`{r['run']}`)",
            "",
            "| route | instance | in-domain | partial | AUROC | cost | missed vs A | missed vs B |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for row in r["rows"]:
            v = row["row"]
            head.append(
                f"| {row['route']} | {row['label'] or '-'} | {fu._f3(v['spearman_frame_in_domain'])} | "
                f"{fu._f3(v['partial_spearman_given_force'])} | {fu._f3(v['auroc_ood'])} | {_cost(v['cost_ratio'])} | "
                f"{_missed(row['lines'].get('A'))} | {_missed(row['lines'].get('B'))} |"
            )
        head.append("")
    head += [
        "![OOD AUROC and in-domain Spearman against committee A, by cost](force_uncertainty_routes.png)",
        "",
    ]
    atomic_write_text(path, "\n".join(head))


def _cost(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _mae(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f}"


def _missed(verdicts: dict[str, bool | None] | None) -> str:
    if verdicts is None:
        return "(reference)"
    missed = [k for k, v in verdicts.items() if v is False]
    return ", ".join(missed) if missed else "none"


def plot(summary: dict[str, Any], path: Path) -> None:
    """Two panels, one point per instance: OOD AUROC and in-domain Spearman minus committee A's on
    the same run, against the cost ratio (instances without a timed cost in a column at the left)."""
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.0))
    markers, colours = "osD^v<>pPX*hH8", plt.get_cmap("tab20").colors
    for ax, key, slack in zip(axes, ("auroc_ood", "spearman_frame_in_domain"), (0.03, 0.05), strict=False):
        for k, route in enumerate(ROUTES):
            pts = []
            for r in summary["runs"]:
                ref = next((x["row"] for x in r["rows"] if x["route"] == "committee A"), None)
                for row in (x for x in r["rows"] if x["route"] == route):
                    v, c = row["row"].get(key), row["row"].get("cost_ratio")
                    if v is not None and ref is not None and ref.get(key) is not None:
                        pts.append((0.8 if c is None else c, v - ref[key]))
            if pts:
                xs, ys = zip(*pts, strict=False)
                ax.scatter(
                    xs,
                    ys,
                    marker=markers[k % len(markers)],
                    color=colours[(2 * k) % 20 + (k >= 10)],
                    s=30,
                    alpha=0.85,
                    label=route,
                )
        ax.axhline(-slack, color="k", ls="--", lw=1)
        ax.axvline(2.0, color="r", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_xlabel("cost / plain E+F (0.8 = not timed)")
        ax.set_ylabel(f"{key} minus committee A's (same run)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(
        "Issue 11: a route meets a line above the dashed line; the cost line is left of the dotted one",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95), w_pad=3.0)
    atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    summary = collect(args)
    command = shlex.join(
        [
            "python",
            "benchmarks/force_uncertainty_routes.py",
            *(sys.argv[1:] if argv is None else argv),
        ]
    )
    summary["meta"] = {"command": command, "updated": time.strftime("%Y-%m-%d %H:%M")}
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(
        args.out / "force_uncertainty_routes.json", json.dumps(fu._clean(summary), indent=1)
    )
    write_markdown(summary, args.out / "force_uncertainty_routes.md")
    plot(summary, args.out / "force_uncertainty_routes.png")
    return summary


if __name__ == "__main__":
    main()
