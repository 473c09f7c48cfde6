"""Force uncertainty that carries information: the modes of one model, a 5-member
committee and |F_pred| alone, ranking the same frames.

Per dataset one Bayesian model (configs/<dataset>_equivariant.yaml) and a committee of 5 MAP
models of the same architecture (``model.head=map``, ``train.ensemble=5``), each model and
member under the wall budget ``--budget-minutes``. Rows: each mode the single model offers
(energy, exact, lowrank, sampled; one that raises is skipped: ``meta.skipped``), committee5,
and the baselines that need no posterior: force_magnitude (|F_pred|), latent_distance and
descriptor_distance (distance to the training set). Frames, scoring and distances:
:mod:`benchmarks.common.force_frames`; definitions: the results file.
``--quick``: EMT Cu made here, configs/tiny_emt.yaml, 10 s per model. Results
``OUT/force_uncertainty.{json,md,png}`` after every step; finished steps are appended to
``OUT/force_uncertainty.jsonl`` and skipped when the command is run again.

    python -m benchmarks.force_uncertainty --budget-minutes 10 --threads 1
    python -m benchmarks.force_uncertainty --quick --out /tmp/fu_quick
    python -m benchmarks.force_uncertainty --report-only   # rewrite the page from the JSON

``--part size`` (the rest of the flags are its own): quality at size, boxes of 27 and 343
independent molecules and Si cells of 216 and 1,000 atoms (benchmarks/force_uncertainty_size.py):

    python -m benchmarks.force_uncertainty --part size --budget-minutes 10 --threads 1

The page keeps its tables first; sections that other scripts write onto it (benchmarks/peers:
between ``<!-- peers/NAME: begin ...-->`` and ``<!-- peers/NAME: end -->``) are moved to
``OUT/force_uncertainty_NAME.md`` and linked (:func:`benchmarks.common.pages.move_peer_sections`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import force_frames as ff
from benchmarks.common.format import fmt2, fmt3
from benchmarks.common.pages import environment, move_peer_sections, run_section
from mlip_unc.models.checkpoint import load_checkpoint
from mlip_unc.models.loading import load_potential
from mlip_unc.train.potential import finalize_checkpoint
from mlip_unc.train.potential_data import prepare_data

log = logging.getLogger("force_uncertainty")
DATASETS = ("3bpa", "ethanol", "solvent_xtb")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument(
        "--budget-minutes", type=float, default=None, help="wall time per model (10; quick: 1/6)"
    )
    p.add_argument(
        "--default-mode",
        default="lowrank",
        help="the mode named 'default' in the results (the calculator's default, auto, is lowrank "
        "on these molecules: mlip_unc.models.full_posterior.LOWRANK_ATOM_DIRECTIONS)",
    )
    for flag, default, text in (
        ("--threads", 1, "torch threads"),
        ("--seed", 0, "seed of weights and split"),
        ("--n-samples", 4, "draws of the sampled mode"),
        ("--timing-frames", 20, "frames timed"),
        ("--max-eval-frames", None, "cap each test set (checks only)"),
    ):
        p.add_argument(flag, type=int, default=default, help=text)
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], help="config override, both models"
    )
    p.add_argument(
        "--refit",
        nargs="?",
        const="all",
        default=None,
        metavar="DATASETS",
        help="refit the single model's post-training fits (posterior, domain guard, levels) with this code "
        "and evaluate its modes again; training steps are kept; optionally only these (comma-separated) "
        "of --datasets",
    )
    p.add_argument(
        "--no-committee",
        action="store_true",
        help="skip the committee (its training, committee5 row and timing): the single model's rows only",
    )
    p.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite OUT/force_uncertainty.md from OUT/force_uncertainty.json",
    )
    args = ff.parse_with_quick(p, argv, "tiny EMT Cu data made here; needs --out")
    args.datasets = (
        ["cu_emt"] if args.quick else [d.strip().lower() for d in args.datasets.split(",") if d]
    )
    if bad := [d for d in args.datasets if d not in (*DATASETS, "cu_emt")]:
        p.error(f"unknown dataset(s) {bad}; choose from {DATASETS}")
    args.budget_minutes = args.budget_minutes or (10.0 / 60.0 if args.quick else 10.0)
    args.refit = (
        set(args.datasets)
        if args.refit == "all"
        else {d.strip().lower() for d in args.refit.split(",") if d.strip()}
        if args.refit
        else set()
    )
    if bad := args.refit - set(args.datasets):
        p.error(f"--refit {sorted(bad)}: not among --datasets {args.datasets}")
    return args


def refit(
    name: str, split: dict[str, Any], args: argparse.Namespace, steps: ff.Steps, out: Path
) -> None:
    """``--refit``: the single model's post-training fits made again by this code (the weights are
    kept; the model section must equal the checkpoint's but for the posterior's rank and basis);
    its mode rows are then evaluated again."""
    config = ff.train_config(split, args, out, 1)
    saved = load_checkpoint(out / "model.pt", kind="potential")["metadata"]["training_config"][
        "model"
    ]
    post_training = ("posterior_rank", "posterior_basis")  # read by the fits this refit makes again
    default = type(config.model)().model_dump(
        mode="json"
    )  # keys added since training count at their defaults
    now = {
        k: v
        for k, v in config.to_dict()["model"].items()
        if k not in post_training and (k in saved or v != default.get(k))
    }
    if now != {k: v for k, v in saved.items() if k not in post_training}:
        raise SystemExit(
            f"{name}: the model section changed since training ({saved} -> {now}); not refitted"
        )
    finalize_checkpoint(out / "model.pt", config, prepare_data(config))
    steps.add(f"refit:{name}", {"model": str(out / "model.pt")})
    log.info("[refit] %s: posterior, guard and levels fitted again", name)


def run_dataset(name: str, args: argparse.Namespace, steps: ff.Steps, work: Path) -> None:
    split = ff.dataset_split(name, args, work)
    single_dir = ff.train(name, split, args, steps, 1)
    if name in args.refit:
        refit(name, split, args, steps, single_dir)
    single = load_potential(single_dir / "model.pt")
    committee = (
        None
        if getattr(args, "no_committee", False)
        else load_potential(ff.train(name, split, args, steps, 5))
    )
    test = ff.load_frames(split["test"], single, split, args.max_eval_frames)
    ood = ff.load_frames(split["ood"], single, split, args.max_eval_frames)
    modes, skipped = ff.offered_modes(single, test.graphs[0], args)
    if not steps.get(f"modes:{name}"):
        steps.add(
            f"modes:{name}",
            {"offered": modes, "skipped": skipped, "n_test": len(test), "n_ood": len(ood or [])},
        )
    refitted = (steps.get(f"refit:{name}") or {}).get("line", -1)
    sets, distances = {p: d for p, d in (("in", test), ("ood", ood)) if d is not None}, None
    committee_rows = [] if committee is None else ["committee5"]
    for row in [*modes, *committee_rows, "force_magnitude", *ff.DISTANCES]:
        if (done := steps.get(f"eval:{name}:{row}")) and not (
            row in modes and done["line"] < refitted
        ):
            continue
        if (
            row in ff.DISTANCES
        ):  # the single model's errors and |F_pred| (force_magnitude's record), another score
            distances = distances or ff.distance_scores(
                single, ff.load_frames(split["train"], single, split, None), sets
            )
            plain = steps.get(f"eval:{name}:force_magnitude")
            record = {part: {**plain[part], "score": distances[row][part]} for part in sets}
        else:
            model = committee if row == "committee5" else single
            record = {part: ff.frame_values(model, data, row, args) for part, data in sets.items()}
        steps.add(f"eval:{name}:{row}", record)
        log.info("[eval] %s %s done", name, row)
    if (timed := steps.get(f"cost:{name}")) is None or timed[
        "line"
    ] < refitted:  # a refit may change the modes' cost
        gen = torch.Generator().manual_seed(args.seed)
        calls = {
            m: (
                lambda g, m=m: single(
                    g, compute_forces=True, uncertainty=m, n_samples=args.n_samples, generator=gen
                )
            )
            for m in ("none", *modes)
        }
        if committee is not None:
            calls["committee5"] = lambda g: committee(g, compute_forces=True, uncertainty="exact")
        graphs = test.graphs[: args.timing_frames]
        ms = {"plain" if k == "none" else k: v for k, v in ff.time_calls(calls, graphs).items()}
        steps.add(
            f"cost:{name}",
            {"ms": ms, "n_frames": len(graphs), "atoms": [int(g.num_atoms) for g in graphs]},
        )


def assemble(steps: ff.Steps, args: argparse.Namespace, status: str) -> dict[str, Any]:
    """The results JSON: ``{"meta": ..., dataset: {"default": name, name: row}}``."""
    settings = steps.get("settings") or {}
    no_committee = getattr(args, "no_committee", False)
    meta = {
        k: settings.get(k) for k in ("command", "started", *ff.SETTINGS, "threads", "data_root")
    }
    meta.update(
        status=status,
        updated=time.strftime("%Y-%m-%d %H:%M"),
        environment=environment(),
        default_mode=args.default_mode,
        committee_budget_minutes_per_member=None if no_committee else args.budget_minutes,
        skipped={},
        train_minutes={},
        cost_ms={},
        notes=["--no-committee: no committee trained, no committee5 row"] if no_committee else [],
        refitted={},
        commands=steps.commands,
    )
    results: dict[str, Any] = {"meta": meta}
    for name in args.datasets:
        cost = (steps.get(f"cost:{name}") or {}).get("ms") or {}
        ratio = {
            **{k: v / cost["plain"] for k, v in cost.items()},
            "force_magnitude": 1.0,
        }  # plain E+F = 1
        rows = {
            step.split(":", 2)[2]: ff.row_metrics(
                rec["in"], rec.get("ood"), ratio.get(step.split(":", 2)[2])
            )
            for step, rec in steps.records.items()
            if step.startswith(f"eval:{name}:")
        }
        if not rows:
            continue
        default = next(
            (m for m in (args.default_mode, "exact", "sampled", "energy") if m in rows),
            "committee5",
        )
        if default != args.default_mode:
            meta["notes"].append(
                f"{name}: default mode {args.default_mode!r} not offered; {default!r} reported as default"
            )
        results[name] = {"default": default, **rows}
        meta["skipped"][name] = (steps.get(f"modes:{name}") or {}).get("skipped", {})
        meta["train_minutes"][name] = {
            t: step["train_minutes"]
            for t in ("single", "committee5")
            if (step := steps.get(f"train:{name}:{t}"))
        }
        meta["cost_ms"][name] = cost or None
        if refitted := steps.get(f"refit:{name}"):
            meta["refitted"][name] = refitted["time"]
        single_in, committee_in = (steps.get(f"eval:{name}:{r}") for r in (default, "committee5"))
        if single_in and committee_in and default != "committee5":
            meta.setdefault("paired_bootstrap", {})[name] = ff.paired_gap(
                single_in["in"], committee_in["in"], seed=args.seed
            )
        single = args.out / "checkpoints" / "force_uncertainty" / f"{name}_single" / "model.pt"
        if single.is_file():  # the single model's posterior as evaluated: full or not, rank, basis
            meta.setdefault("posterior", {})[name] = load_checkpoint(single, kind="potential")[
                "config"
            ].get("posterior")
    return results


def _posterior_text(post: dict[str, Any]) -> str:
    if not post.get("full"):
        return "diagonal (variational)"
    return f"full, basis {post.get('basis', 'shared')}, lowrank rank {post.get('rank')}"


def target_bounds(key: str, committee_value: float | None) -> tuple[float | None, float | None]:
    """The target's ``(lowest, highest)`` for ``key`` (TARGETS): the floor or committee5 - slack,
    whichever is higher; None where the target has no such side."""
    slack, low, high = ff.TARGETS[key]
    ref = None if slack is None or committee_value is None else committee_value - slack
    return max((x for x in (low, ref) if x is not None), default=None), high


def acceptance(entry: dict[str, Any]) -> list[str]:
    """The targets (TARGETS) for the default row, each 'met' or 'missed by' how much."""
    d, c = entry.get(entry["default"], {}), entry.get("committee5", {})
    out = []
    for key in ff.TARGETS:
        (low, high), v = target_bounds(key, c.get(key)), d.get(key)
        miss = (
            None
            if v is None
            else max(
                0.0, low - v if low is not None else 0.0, v - high if high is not None else 0.0
            )
        )
        result = "n/a" if miss is None else f"missed by {miss:.2g}" if miss > 0 else "met"
        out.append(f"- {key} = {fmt3(v)}, target [{fmt3(low)}, {fmt3(high)}]: {result}")
    return out


def gap_lines(gaps: dict[str, dict[str, float]] | None) -> list[str]:
    """The paired bootstrap of the Spearman gaps (paired_gap) as markdown lines."""
    if not gaps:
        return []
    return [
        "",
        "Default - committee5 on the same in-domain frames, paired bootstrap (1000 resamples of the frames):",
        *(
            f"- {k}: gap {g['gap']:+.3f}, bootstrap std {g['std']:.3f}; resamples within the slack "
            f"(gap >= -{ff.TARGETS[k][0]:g}): {100 * g['p_within_slack']:.0f} %"
            for k, g in gaps.items()
        ),
    ]


def _minutes(train: dict[str, list[float]] | None) -> str:
    """Training minutes per model, two decimals (the JSON keeps them exact)."""
    return (
        "; ".join(f"{k} {', '.join(f'{m:.2f}' for m in v)}" for k, v in (train or {}).items())
        or "n/a"
    )


def write_markdown(results: dict[str, Any], path: Path) -> None:
    """The page: one table of every data set's rows first, then per data set its notes and the
    default row's acceptance, the quality at size (force_uncertainty_size.py), definitions and
    the run. Peer sections found on the page move to their own pages, linked here."""
    meta = results["meta"]
    commands = meta.get("commands") or [meta["command"]]
    names = [n for n in results if n != "meta"]
    peers = move_peer_sections(path, by="benchmarks/force_uncertainty.py")
    from benchmarks.force_uncertainty_size import size_section  # it imports this module

    size = size_section(path.parent)
    links = ", ".join(f"[{title}]({page})" for title, page in peers)
    lines = [
        "# Force uncertainty: modes vs a committee vs |F_pred|",
        "",
        "Per data set, each mode of one Bayesian model, a 5-member committee and the baselines on the "
        "same frames ((default) = the mode the results call default); notes, acceptance, definitions "
        "and the run below the table"
        + (
            "; quality at size (boxes of molecules, Si cells): [below](#quality-at-size)"
            if size
            else ""
        )
        + (f"; peers' rows on the same frames: {links}" if links else "")
        + ".",
        "",
        "| set | row | " + " | ".join(ff.ROW_KEYS) + " |",
        "|---" * (len(ff.ROW_KEYS) + 2) + "|",
    ]
    for name in names:
        entry = results[name]
        lines += [
            f"| {name} | {row}{' (default)' if row == entry['default'] else ''} | "
            + " | ".join(fmt2(r[k]) for k in ff.ROW_KEYS)
            + " |"
            for row, r in entry.items()
            if row != "default"
        ]
    lines += ["", "## Per data set"]
    for name in names:
        entry = results[name]
        cost = meta["cost_ms"].get(name) or {}
        post = meta.get("posterior", {}).get(name)
        lines += [
            "",
            f"**{name}** (default: {entry['default']}): plain E+F {fmt2(cost.get('plain'))} ms per frame "
            f"(this set's in-domain frames); skipped modes: {meta['skipped'].get(name) or 'none'}; "
            f"training minutes: {_minutes(meta['train_minutes'].get(name))}"
            + (f"; single model's posterior: {_posterior_text(post)}" if post else "")
            + ".",
            *(
                [
                    f"The single model's posterior, domain guard and levels were fitted again (`--refit`) "
                    f"on {meta['refitted'][name]}, by the code of that day; its mode rows were evaluated "
                    "after that, and every row's cost was timed again (interleaved). Training and "
                    "committee steps are from the first run."
                ]
                if meta.get("refitted", {}).get(name)
                else []
            ),
            "",
            f"Acceptance of the default row ({entry['default']}; committee5 - slack):",
            *acceptance(entry),
            *gap_lines(meta.get("paired_bootstrap", {}).get(name)),
        ]
    if size:
        lines += ["", *size]
    env = meta.get("environment") or {}
    lines += [
        "",
        "## Definitions",
        "",
        (
            "Frame score = max over atoms of the force std sqrt(sum_c Var F_ac) (energy mode: the epistemic energy "
            "std; force_magnitude: max over atoms of |F_pred|; latent_distance: max over atoms of the mean distance "
            f"to the {ff.KNN_K} nearest training atoms of the same element in the single model's per-atom latents, "
            f"standardised per element; descriptor_distance: mean distance to the {ff.KNN_K} nearest training frames in "
            "an interatomic-distance histogram; training = every frame of data.train; the baselines are not timed "
            "but |F_pred| = plain E+F); frame error = mean over atoms of |F_pred - F_true|. "
            "auroc_ood: in-domain (0) vs OOD (1) frames by the score; auroc_sigma_over_force: the same with score / "
            "max |F_pred|; partial_spearman_given_force: in-domain score vs error with the frame max |F_pred| "
            "partialled out (ranks); std_over_rmse: sqrt(mean epistemic Var F) / RMSE per component, in-domain; "
            "cost_ratio: median over frames of the best of 3 single-frame calls / plain E+F, interleaved "
            "(committee5 = 5 members); force MAE per component, in-domain. Paired bootstrap: default - committee5 "
            "on the same in-domain frames, 1000 resamples of the frames."
        ),
        "",
    ]
    lines += run_section(
        commands,
        date=f"started {meta['started']}, updated {meta['updated']}",
        json_name="force_uncertainty.json",
        machine=env.get("machine"),
        load_avg=env.get("load_avg"),
        versions=env.get("versions"),
        extra=[
            f"Seed {meta['seed']}; {meta['threads']} torch thread(s); {meta['budget_minutes']:g} min "
            f"per model and per committee member (wall time, shared CPU); status: {meta['status']}."
            + (f" {len(meta['notes'])} note(s) in the JSON." if meta["notes"] else ""),
            *(
                []
                if env
                else [
                    "Load average and versions: not recorded (this run predates their "
                    "recording); each data set's cost ratios come from one run of interleaved "
                    "calls. The peers' pages record theirs."
                ]
            ),
        ],
    )
    path.write_text("\n".join(lines) + "\n")


def plot(steps: ff.Steps, results: dict[str, Any], path: Path) -> None:
    """sigma_F vs |error| per frame: one panel per dataset (rows) and result row (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    if not (names := [n for n in results if n != "meta"]):
        return
    columns = max(len(results[n]) - 1 for n in names)
    with plt.rc_context({"font.size": 7}):
        fig, axes = plt.subplots(
            len(names), columns, figsize=(2.6 * columns, 2.4 * len(names)), squeeze=False
        )
        for i, name in enumerate(names):
            for j, row in enumerate(r for r in results[name] if r != "default"):
                ax, record = axes[i, j], steps.get(f"eval:{name}:{row}")
                for part, colour in (("in", "tab:blue"), ("ood", "tab:orange")):
                    if record.get(part):
                        x, y = (
                            np.asarray(record[part][k], dtype=float) for k in ("score", "error")
                        )
                        ax.scatter(
                            x,
                            y,
                            s=4,
                            alpha=0.6,
                            color=colour,
                            label="in-domain" if part == "in" else "OOD",
                        )
                ax.set(
                    xscale="log",
                    yscale="log",
                    title=f"{name}: {row}",
                    xlabel="frame score",
                    ylabel="mean |F err| (eV/A)",
                )
                for axis in (ax.xaxis, ax.yaxis):  # labels at 1, 2, 5 x 10^k only
                    axis.set(
                        major_locator=LogLocator(subs=(1, 2, 5)),
                        major_formatter=FormatStrFormatter("%.2g"),
                        minor_formatter=NullFormatter(),
                    )
            for j in range(len(results[name]) - 1, columns):
                axes[i, j].axis("off")
        axes[0, 0].legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)


def save(steps: ff.Steps, args: argparse.Namespace, status: str) -> dict[str, Any]:
    results = assemble(steps, args, status)
    tmp = args.out / ".force_uncertainty.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    os.replace(tmp, args.out / "force_uncertainty.json")
    write_markdown(results, args.out / "force_uncertainty.md")
    plot(steps, results, args.out / "force_uncertainty.png")
    return results


def split_part(argv: list[str]) -> tuple[str, list[str]]:
    """``--part modes|size`` (default modes) and the other arguments."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--part", choices=("modes", "size"), default="modes")
    known, rest = p.parse_known_args(argv)
    return known.part, rest


def main(argv: list[str] | None = None) -> dict[str, Any]:
    part, rest = split_part(sys.argv[1:] if argv is None else argv)
    if part == "size":  # boxes of molecules and large cells: benchmarks/force_uncertainty_size.py
        from benchmarks import force_uncertainty_size

        return force_uncertainty_size.main(rest)
    argv = rest
    args = parse_args(argv)
    if args.report_only:
        results = json.loads((args.out / "force_uncertainty.json").read_text())
        write_markdown(results, args.out / "force_uncertainty.md")
        return results
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "benchmarks.force_uncertainty", *argv])
    settings = {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "quick": args.quick,
        "seed": args.seed,
        "budget_minutes": args.budget_minutes,
        "overrides": args.overrides,
        "threads": args.threads,
        "data_root": None if args.quick else str(args.data_root),
        "committee": not args.no_committee,
    }
    steps = ff.Steps(args.out / "force_uncertainty.jsonl", settings)
    steps.note_command(command)
    with tempfile.TemporaryDirectory(prefix="mlip_unc_fu_") as work:
        for name in args.datasets:
            run_dataset(name, args, steps, Path(work))
            save(steps, args, "partial")
    results = save(steps, args, "complete")
    log.info("results: %s", args.out / "force_uncertainty.md")
    return results


if __name__ == "__main__":
    main()
