"""How well can issue 11's ranking lines be met at all? A second committee against the first.

For a finished run of benchmarks/force_uncertainty.py (its ``--out`` folder, one dataset), a second
5-member MAP committee (committee B) is trained with the run's own config, data split, validation
split and budget; only the members' seeds differ (``seed + offset + k`` instead of ``seed + k``).
It is evaluated on the run's in-domain and OOD frames exactly as the run's committee5 row
(committee A). Then issue 11's three ranking lines (in-domain Spearman, partial Spearman given
|F_pred|, OOD AUROC; force_uncertainty.TARGETS) are applied to

- B against A (and A against B): how often an independent committee of the same architecture
  meets the lines that the single model is asked to meet, on these 100 frames;
- the run's default single-model row against B: the same single model against another reference.

The paired bootstrap of the in-domain Spearman gap B - A (force_uncertainty.paired_gap) is given
beside it, and for each row the OOD AUROC of its own frame error as the score (what its
uncertainty would reach if it ranked frames exactly as their errors). Results: ``OUT/committee_floor.{md,json}`` over every ``--runs`` folder; each run's
finished steps go to ``RUN/committee_floor.jsonl`` (members trained, evaluation), so an interrupted
command resumes, and ``--members`` lets two processes train different members of one run at once.
Checkpoints: ``RUN/checkpoints/force_uncertainty/<dataset>_committee5_b/member_k``.

    python benchmarks/committee_floor.py --runs benchmarks/results/force_uncertainty_seeds/seed1 --members 0,1,2
    python benchmarks/committee_floor.py --runs R1 R2 R3 --out benchmarks/results/committee_floor
    python benchmarks/committee_floor.py --quick --out /tmp/cf_quick
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import force_uncertainty as fu

from mlip_unc.atomic import atomic_write_text
from mlip_unc.models.committee import load_potential
from mlip_unc.train.potential import train_potential
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.uncertainty import diagnostics as diag

log = logging.getLogger("committee_floor")
LINES = (
    "spearman_frame_in_domain",
    "partial_spearman_given_force",
    "auroc_ood",
)  # issue 11's ranking lines
MEMBERS = 5


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs", nargs="*", type=Path, default=[], help="force_uncertainty.py --out folders"
    )
    p.add_argument("--dataset", default="3bpa")
    p.add_argument(
        "--offset", type=int, default=100, help="committee B's member seeds: run seed + offset + k"
    )
    p.add_argument(
        "--members", default=None, help="train only these members (comma-separated), then stop"
    )
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
    args.members = (
        None
        if args.members is None
        else sorted({int(k) for k in args.members.split(",") if k.strip()})
    )
    if args.members and not set(args.members) <= set(range(MEMBERS)):
        p.error(f"--members: choose among 0..{MEMBERS - 1}")
    if not args.runs and not args.quick:
        p.error("give --runs (or --quick)")
    return args


def run_records(run: Path) -> dict[str, dict[str, Any]]:
    """The run's force_uncertainty.jsonl steps by name (a later line wins, as force_uncertainty.Steps)."""
    lines = (run / "force_uncertainty.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, filter(str.strip, lines))}


def run_settings(run: Path, args: argparse.Namespace) -> argparse.Namespace:
    """The run's own settings (seed, budget, overrides) as force_uncertainty's arguments, on this
    machine's data root."""
    s = run_records(run)["settings"]
    return argparse.Namespace(
        seed=s["seed"],
        budget_minutes=s["budget_minutes"],
        overrides=list(s["overrides"]),
        quick=s["quick"],
        data_root=args.data_root,
        out=run,
    )


def train_members(
    run: Path,
    settings: argparse.Namespace,
    steps: fu.Steps,
    args: argparse.Namespace,
    split: dict[str, Any],
) -> Path:
    """Committee B's members not yet trained (of ``--members``, else all), each recorded as a step."""
    name = args.dataset
    out = run / "checkpoints" / "force_uncertainty" / f"{name}_committee5_b"
    for k in range(MEMBERS):
        if (done := steps.get(f"member:{name}:{k}")) and done[
            "seed"
        ] != settings.seed + args.offset + k:
            raise SystemExit(
                f"{run}: committee B's member {k} was trained with seed {done['seed']}, not "
                f"{settings.seed + args.offset + k} (--offset {args.offset}); keep its offset"
            )
    todo = [k for k in (args.members or range(MEMBERS)) if not steps.get(f"member:{name}:{k}")]
    if todo:
        config = fu.train_config(split, settings, out, MEMBERS)  # the run's committee config
        data = prepare_data(
            config
        )  # the data and validation split of seed `settings.seed`, as committee A
        for k in todo:
            seed = settings.seed + args.offset + k
            log.info(
                "[%s] committee B member %d (seed %d), %.3g min",
                run,
                k,
                seed,
                settings.budget_minutes,
            )
            result = train_potential(
                config.updated(seed=seed, out=str(out / f"member_{k}")), data=data
            )
            for last in (out / f"member_{k}").rglob("last.pt"):
                last.unlink()
            steps.add(f"member:{name}:{k}", {"seed": seed, "train_minutes": result.train_minutes})
    return out


def evaluate(
    run: Path,
    settings: argparse.Namespace,
    steps: fu.Steps,
    args: argparse.Namespace,
    split: dict[str, Any],
    folder: Path,
) -> None:
    """Committee B on the run's in-domain and OOD frames, as the run's committee5 row."""
    name = args.dataset
    if steps.get(f"eval:{name}:committee5_b"):
        return
    committee = load_potential(folder)
    sets = {
        p: fu.load_frames(split[k], committee, split, None)
        for p, k in (("in", "test"), ("ood", "ood"))
    }
    ev = argparse.Namespace(n_samples=4, seed=settings.seed)
    record = {
        p: fu.frame_values(committee, d, "committee5", ev) for p, d in sets.items() if d is not None
    }
    steps.add(f"eval:{name}:committee5_b", record)


def lines_met(row: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """Issue 11's ranking lines for ``row`` against ``reference`` (its committee5): per line the
    value, the target and whether it is met; ``all`` when every line is."""
    out: dict[str, Any] = {}
    for key in LINES:
        target, value = fu.target_bounds(key, reference.get(key))[0], row.get(key)
        out[key] = {"value": value, "target": target, "met": value is not None and value >= target}
    out["all"] = all(v["met"] for v in out.values())
    return out


def verdict(got: dict[str, Any] | None) -> str:
    """A :func:`lines_met` result as a table cell: ``met``, ``missed <lines>``, or empty (no reference)."""
    if got is None:
        return ""
    return "met" if got["all"] else "missed " + ", ".join(k for k in LINES if not got[k]["met"])


def run_summary(run: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """One run's rows (default single model, committee A, committee B) and the lines between them."""
    name = args.dataset
    records = run_records(run)
    if not (run / "committee_floor.jsonl").is_file():
        return None
    floor = fu.Steps(run / "committee_floor.jsonl", floor_settings(run_settings(run, args)))
    b = floor.get(f"eval:{name}:committee5_b")
    results = json.loads((run / "force_uncertainty.json").read_text())
    entry = results.get(name)
    if b is None or entry is None:
        return None
    default = entry["default"]
    a = records[f"eval:{name}:committee5"]
    rows = {
        "default": entry[default],
        "committee5": entry["committee5"],
        "committee5_b": fu.row_metrics(b["in"], b.get("ood"), None),
    }
    seeds = [floor.get(f"member:{name}:{k}")["seed"] for k in range(MEMBERS)]
    frames = {"default": records[f"eval:{name}:{default}"], "committee5": a, "committee5_b": b}
    return {
        "run": str(run),
        "seed": results["meta"]["seed"],
        "default_mode": default,
        "member_seeds_b": seeds,
        "train_minutes_b": [
            floor.get(f"member:{name}:{k}")["train_minutes"] for k in range(MEMBERS)
        ],
        "rows": rows,
        "b_vs_a": lines_met(rows["committee5_b"], rows["committee5"]),
        "a_vs_b": lines_met(rows["committee5"], rows["committee5_b"]),
        "default_vs_a": lines_met(rows["default"], rows["committee5"]),
        "default_vs_b": lines_met(rows["default"], rows["committee5_b"]),
        "bootstrap_b_minus_a": fu.paired_gap(b["in"], a["in"], seed=results["meta"]["seed"]),
        "auroc_ood_of_error": {row: error_auroc(rec) for row, rec in frames.items()},
    }


def error_auroc(record: dict[str, Any]) -> float | None:
    """OOD AUROC of a row's own frame error (mean |F error|) as the score: what its uncertainty
    would reach if it ranked frames exactly as their errors (None without OOD frames)."""
    if not record.get("ood"):
        return None
    errors = [float(e) for part in ("in", "ood") for e in record[part]["error"]]
    labels = [0] * len(record["in"]["error"]) + [1] * len(record["ood"]["error"])
    return diag.auroc(errors, labels)


def floor_settings(settings: argparse.Namespace) -> dict[str, Any]:
    return {
        "command": "",
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "quick": settings.quick,
        "seed": settings.seed,
        "budget_minutes": settings.budget_minutes,
        "overrides": settings.overrides,
    }


def run_folders(args: argparse.Namespace) -> list[Path]:
    """``--runs``, or with ``--quick`` the one quick run (made once)."""
    return [quick_run(args)] if args.quick else list(args.runs)


def each_run(
    args: argparse.Namespace,
    argv: list[str] | None,
    stem: str,
    runs: list[Path],
    extra: dict[str, Any] | None = None,
) -> Iterator[tuple[Path, argparse.Namespace, fu.Steps, dict[str, Any]]]:
    """The loop of the scripts built on finished runs (this one, trained_factor, distance_aware,
    member_llpr): torch threads and logging set, then per run its settings, its ``RUN/<stem>.jsonl``
    steps (settings plus ``extra``; this command noted) and its data split (files in a temporary
    folder that lives while the caller works on the run)."""
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    command = shlex.join(
        ["python", f"benchmarks/{stem}.py", *(sys.argv[1:] if argv is None else argv)]
    )
    with tempfile.TemporaryDirectory(prefix=f"mlip_unc_{stem}_") as work:
        for run in runs:
            settings = run_settings(run, args)
            steps = fu.Steps(
                run / f"{stem}.jsonl",
                {**floor_settings(settings), **(extra or {}), "command": command},
            )
            steps.note_command(command)
            yield run, settings, steps, fu.dataset_split(args.dataset, settings, Path(work))


BASELINES = (
    "force_magnitude",
    "latent_distance",
)  # the run's own baseline rows, shown beside every new row


def baseline_rows(entry: dict[str, Any]) -> dict[str, Any]:
    """The run's |F_pred| and latent-distance rows (force_uncertainty.json, same frames)."""
    return {k: entry[k] for k in BASELINES if k in entry}


def committee_b_row(run: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    """Committee B's row on ``run``'s frames (force_uncertainty.row_metrics), or None if not evaluated."""
    if not (run / "committee_floor.jsonl").is_file():
        return None
    floor = fu.Steps(run / "committee_floor.jsonl", floor_settings(run_settings(run, args)))
    b = floor.get(f"eval:{args.dataset}:committee5_b")
    return None if b is None else fu.row_metrics(b["in"], b.get("ood"), None)


def step_commands(runs: list[Path], args: argparse.Namespace, stem: str) -> list[str]:
    """Every command recorded in the runs' ``RUN/<stem>.jsonl``, in order, each once."""
    commands: list[str] = []
    for run in (r for r in runs if (r / f"{stem}.jsonl").is_file()):
        steps = fu.Steps(run / f"{stem}.jsonl", floor_settings(run_settings(run, args)))
        commands += [c for c in steps.commands if c and c not in commands]
    return commands


def summarise_runs(
    args: argparse.Namespace,
    runs: list[Path],
    stem: str,
    run_summary: Any,
    markdown: Any,
    complete: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    """The summary of a script built on finished runs: ``run_summary(run, args)`` of each run (None
    while unfinished), the commands of their step files and the status (``complete`` also asks
    ``complete(summary)`` of each run), written to ``OUT/<stem>.{json,md}``; ``extra`` keys follow
    ``dataset``."""
    summaries = [s for s in (run_summary(run, args) for run in runs) if s is not None]
    done = len(summaries) == len(runs) and (complete is None or all(complete(s) for s in summaries))
    summary = {
        "dataset": args.dataset,
        **extra,
        "updated": time.strftime("%Y-%m-%d %H:%M"),
        "commands": step_commands(runs, args, stem),
        "runs": summaries,
        "status": "complete" if done else "partial",
    }
    write_results(summary, args.out, stem, markdown)
    return summary


def score_runs(
    args: argparse.Namespace,
    argv: list[str] | None,
    stem: str,
    evaluate: Any,
    run_summary: Any,
    markdown: Any,
    **kwargs: Any,
) -> dict[str, Any]:
    """The whole of a post hoc script on finished runs: ``evaluate(run, settings, steps, args, split)``
    on each (:func:`each_run`), then :func:`summarise_runs` (``kwargs`` passed on)."""
    runs = run_folders(args)
    for run, settings, steps, split in each_run(args, argv, stem, runs):
        evaluate(run, settings, steps, args, split)
    return summarise_runs(args, runs, stem, run_summary, markdown, **kwargs)


def write_results(summary: dict[str, Any], out: Path, stem: str, markdown: Any) -> None:
    """``OUT/<stem>.json`` and ``OUT/<stem>.md`` (``markdown(summary, path)``), atomically."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / f"{stem}.json", json.dumps(summary, indent=1))
    markdown(summary, out / f"{stem}.md")
    log.info("results: %s", out / f"{stem}.md")


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    runs = summary["runs"]
    lines = [
        f"# How often does a second committee meet issue 11's ranking lines? ({summary['dataset']})",
        "",
        f"Commands: {'; '.join(f'`{c}`' for c in summary['commands'])} (updated {summary['updated']}).",
        "",
        (
            "Per run of benchmarks/force_uncertainty.py: committee A = the run's committee5; committee B = 5 more "
            "MAP members trained with the run's config, data, validation split and budget, seeds run seed + "
            f"{summary['offset']} + k; both evaluated on the run's frames. Lines (issue 11): in-domain Spearman >= "
            "reference - 0.05; partial Spearman given |F_pred| >= reference - 0.05 and >= 0.3; OOD AUROC >= "
            "reference - 0.03. 'met' = all three. The OOD AUROC of a row's own frame error (mean |F error| as "
            "the score) is what its uncertainty would reach if it ranked frames exactly as their errors."
        ),
        "",
        "| run | seed | in-domain (default / A / B) | partial (default / A / B) | AUROC OOD (default / A / B) "
        "| AUROC OOD of the row's own error (default / A / B) "
        "| B vs A | A vs B | default vs A | default vs B | bootstrap B - A, in-domain (gap +- std) |",
        "|---" * 11 + "|",
    ]
    verdict = {True: "met", False: "missed"}
    for r in runs:
        rows = r["rows"]
        cells = [
            " / ".join(fu._f3(rows[x].get(k)) for x in ("default", "committee5", "committee5_b"))
            for k in LINES
        ]
        cells.append(
            " / ".join(
                fu._f3(r["auroc_ood_of_error"][x])
                for x in ("default", "committee5", "committee5_b")
            )
        )
        missed = {
            c: ", ".join(k for k in LINES if not r[c][k]["met"])
            for c in ("b_vs_a", "a_vs_b", "default_vs_a", "default_vs_b")
        }
        checks = [verdict[r[c]["all"]] + (f" ({missed[c]})" if missed[c] else "") for c in missed]
        gap = r["bootstrap_b_minus_a"]["spearman_frame_in_domain"]
        lines.append(
            f"| {r['run']} | {r['seed']} | "
            + " | ".join(cells + checks)
            + f" | {gap['gap']:+.3f} +- {gap['std']:.3f} |"
        )
    lines += ["", "Runs in which all three lines hold:"]
    for c, text in (
        ("b_vs_a", "committee B against committee A"),
        ("a_vs_b", "committee A against committee B"),
        ("default_vs_a", "the single model's default row against committee A (the issue's test)"),
        ("default_vs_b", "the single model's default row against committee B"),
    ):
        lines.append(f"- {text}: {sum(r[c]['all'] for r in runs)} of {len(runs)}")
    lines += ["", "Per line, in how many runs it holds (B vs A; default vs A):"]
    for k in LINES:
        lines.append(
            f"- {k}: {sum(r['b_vs_a'][k]['met'] for r in runs)} of {len(runs)}; "
            f"{sum(r['default_vs_a'][k]['met'] for r in runs)} of {len(runs)}"
        )
    lines += [
        "",
        "Committee B's training minutes per member: "
        + "; ".join(
            f"seed {r['seed']}: {', '.join(f'{m:.2f}' for m in r['train_minutes_b'])}" for r in runs
        ),
    ]
    atomic_write_text(path, "\n".join(lines) + "\n")


def quick_run(args: argparse.Namespace) -> Path:
    """A finished force_uncertainty --quick run under OUT/run (made once)."""
    run = args.out / "run"
    if not (run / "force_uncertainty.json").is_file():
        fu.main(["--quick", "--out", str(run)])
    return run


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = parse_args(argv)
    runs = run_folders(args)
    for run, settings, steps, split in each_run(args, argv, "committee_floor", runs):
        folder = train_members(run, settings, steps, args, split)
        steps = fu.Steps(
            run / "committee_floor.jsonl", floor_settings(settings)
        )  # read again: another
        if all(
            steps.get(f"member:{args.dataset}:{k}") for k in range(MEMBERS)
        ):  # process may train members
            evaluate(run, settings, steps, args, split, folder)
    if args.members is not None:
        return None  # a partial training command: the summary comes with the command over all runs
    return summarise_runs(
        args, runs, "committee_floor", run_summary, write_markdown, offset=args.offset
    )


if __name__ == "__main__":
    main()
