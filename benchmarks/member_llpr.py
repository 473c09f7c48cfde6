"""The shipped last-layer posterior on MAP-trained models: is the Bayes-by-Backprop training the gap?

benchmarks/trained_factor.py found the shipped last-layer posterior (full, per element, rank-4 lowrank
evaluation) ranking 3BPA frames better on a MAP-head model trained with another loss than on the run's
own single model, which trains its head by Bayes-by-Backprop. The members of a run's committees are
MAP models of the same architecture, trained with the same data, validation split and budget as the
single model (only their seeds differ), so each is a single model as a user with ``model.head=map``
would train it. Here the shipped posterior is fitted post hoc on each (the run's training frames, its
validation frames for λ and the calibration, exactly as ``finalize_checkpoint`` fits the single model)
and its lowrank mode scores the run's in-domain and OOD frames, as the run's default row.

Reference for issue 11's lines: committee B (benchmarks/committee_floor.py), which shares no member with
committee A, whose members are scored here (``--committee a``), and committee A itself beside it (it
contains the member, which flatters the member's ranking against it a little). Steps in
``RUN/member_llpr.jsonl``; results in ``OUT/member_llpr.{md,json}``.

    python benchmarks/member_llpr.py --runs R1 R2 R3 --members 0,1,2 --out benchmarks/results/member_llpr
    python benchmarks/member_llpr.py --quick --out /tmp/ml_quick
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import committee_floor as cf
import force_uncertainty as fu
import trained_factor as tf

from mlip_unc.atomic import atomic_write_text
from mlip_unc.train.potential_data import prepare_data

log = logging.getLogger("member_llpr")
FOLDERS = {"a": "committee5", "b": "committee5_b"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs", nargs="*", type=Path, default=[], help="force_uncertainty.py --out folders"
    )
    p.add_argument("--dataset", default="3bpa")
    p.add_argument(
        "--committee", choices=sorted(FOLDERS), default="a", help="whose members get the posterior"
    )
    p.add_argument("--members", default="0,1,2,3,4", help="comma-separated member indices")
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--threads", type=int, default=1)
    args = fu.parse_with_quick(
        p,
        argv,
        "a quick force_uncertainty run on tiny EMT Cu data made here, then this; needs --out",
    )
    if args.quick:
        args.dataset = "cu_emt"
    args.members = sorted({int(k) for k in args.members.split(",") if k.strip()})
    if not args.runs and not args.quick:
        p.error("give --runs (or --quick)")
    return args


def member_folder(run: Path, args: argparse.Namespace, k: int) -> Path:
    return (
        run
        / "checkpoints"
        / "force_uncertainty"
        / f"{args.dataset}_{FOLDERS[args.committee]}"
        / f"member_{k}"
    )


def evaluate(
    run: Path,
    settings: argparse.Namespace,
    steps: fu.Steps,
    args: argparse.Namespace,
    split: dict[str, Any],
) -> None:
    """The posterior fitted on each member not yet done, its lowrank rows on the run's frames."""
    name, ev = args.dataset, argparse.Namespace(n_samples=4, seed=settings.seed)
    todo = [k for k in args.members if not steps.get(f"eval:{name}:{args.committee}:{k}")]
    if not todo:
        return
    config = fu.train_config(
        split, settings, member_folder(run, args, 0).parent, 5
    )  # the committee's config
    data = prepare_data(config)  # the members' training / validation split
    rank, sets = config.model.posterior_rank, None
    for k in todo:
        model, summary = tf.llpr_model(member_folder(run, args, k), rank, config, data)
        if sets is None:  # the members share cutoff, elements and dtype: the frames are read once
            sets = {
                p: fu.load_frames(split[key], model, split, None)
                for p, key in (("in", "test"), ("ood", "ood"))
            }
        record = {
            p: fu.frame_values(model, d, "lowrank", ev) for p, d in sets.items() if d is not None
        }
        graphs = sets["in"].graphs[:20]
        calls = {
            m: (lambda g, m=m: model(g, compute_forces=True, uncertainty=m))
            for m in ("none", "lowrank")
        }
        ms = fu.time_calls(calls, graphs)
        steps.add(
            f"eval:{name}:{args.committee}:{k}",
            {
                **record,
                "posterior": summary,
                "rank": rank,
                "cost_ratio": ms["lowrank"] / ms["none"],
            },
        )
        log.info(
            "[%s] member %d of committee %s: posterior fitted and scored", run, k, args.committee
        )


def run_summary(run: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    name, path = args.dataset, run / "member_llpr.jsonl"
    if not path.is_file():
        return None
    settings = cf.run_settings(run, args)
    steps = fu.Steps(path, cf.floor_settings(settings))
    entry = json.loads((run / "force_uncertainty.json").read_text())[name]
    refs = {"committee5": entry["committee5"]}
    if (b := cf.committee_b_row(run, args)) is not None:
        refs["committee5_b"] = b
    members = {}
    for k in range(5):
        if (rec := steps.get(f"eval:{name}:{args.committee}:{k}")) is None:
            continue
        row = fu.row_metrics(rec["in"], rec.get("ood"), rec["cost_ratio"])
        members[k] = {
            "row": row,
            "lines": {ref: cf.lines_met(row, refs[ref]) for ref in refs},
            "posterior": rec["posterior"],
        }
    if not members:
        return None
    default = entry[entry["default"]]
    return {
        "run": str(run),
        "seed": settings.seed,
        "committee": args.committee,
        "references": refs,
        "default": default,
        "default_lines": {ref: cf.lines_met(default, refs[ref]) for ref in refs},
        "baselines": cf.baseline_rows(entry),
        "members": members,
    }


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    f3, keys3 = fu._f3, ("spearman_frame_in_domain", "partial_spearman_given_force", "auroc_ood")
    lines = [
        f"# The shipped last-layer posterior on MAP-trained members, {summary['dataset']}",
        "",
        f"Commands: {'; '.join(f'`{c}`' for c in summary['commands'])} (updated {summary['updated']}; "
        f"status {summary['status']}).",
        "",
        (
            "Each row: one MAP member of the run's committee "
            + summary["committee"].upper()
            + " with the "
            "shipped posterior (full, the config's basis and rank) fitted post hoc; its lowrank mode on the run's "
            "frames. Lines (issue 11) against committee B (independent of A's members) and committee A; the "
            "run's default single model (Bayes-by-Backprop head, same posterior) first, then the run's own "
            "baseline rows on the same frames (force_magnitude = |F_pred|, latent_distance)."
        ),
        "",
        "| run | seed | row | in-domain | partial | AUROC OOD | std/RMSE | cost ratio | F MAE (meV/A) "
        "| lines vs B | lines vs A |",
        "|---" * 11 + "|",
    ]

    for r in summary["runs"]:
        items = [("default (BBB)", r["default"], r["default_lines"])]
        items += [(name, row, {}) for name, row in r.get("baselines", {}).items()]
        items += [
            (f"member {k}", m["row"], m["lines"])
            for k, m in sorted(r["members"].items(), key=lambda x: int(x[0]))
        ]
        for label, row, got in items:
            cells = [f3(row.get(k)) for k in (*keys3, "std_over_rmse", "cost_ratio")] + [
                f"{row['force_mae_meV_A']:.1f}"
            ]
            lines.append(
                f"| {r['run']} | {r['seed']} | {label} | "
                + " | ".join(cells)
                + " | "
                + " | ".join(cf.verdict(got.get(ref)) for ref in ("committee5_b", "committee5"))
                + " |"
            )
    lines += [
        "",
        "Summary over every member scored (count meeting all three ranking lines; mean of each line):",
    ]
    for ref in ("committee5_b", "committee5"):
        members = [m for r in summary["runs"] for m in r["members"].values() if ref in m["lines"]]
        if not members:
            continue
        met = sum(m["lines"][ref]["all"] for m in members)
        defaults = [r for r in summary["runs"] if ref in r["default_lines"]]
        lines.append(
            f"- against {ref}: members {met} of {len(members)}; the runs' default rows "
            f"{sum(r['default_lines'][ref]['all'] for r in defaults)} of {len(defaults)}"
        )
    if members := [m for r in summary["runs"] for m in r["members"].values()]:
        means = {
            k: statistics.mean(m["row"][k] for m in members) for k in (*keys3, "force_mae_meV_A")
        }
        lines.append("- member means: " + ", ".join(f"{k} {means[k]:.3f}" for k in means))
    atomic_write_text(path, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    return cf.score_runs(
        args,
        argv,
        "member_llpr",
        evaluate,
        run_summary,
        write_markdown,
        complete=lambda s: len(s["members"]) == cf.MEMBERS,
        committee=args.committee,
    )


if __name__ == "__main__":
    main()
