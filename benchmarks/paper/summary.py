"""One page for the latent-posterior alignment study: the paper's three claims on each dataset.

Reads the folders written by ``benchmarks/paper/study.py`` (one dataset each: ``paper_study.json``
and ``paper_study.jsonl``) and, when present, ``force_lpa.json`` (``benchmarks/paper/force_lpa.py``), and
writes ``OUT/paper_study.md`` and ``OUT/paper_study_summary.json``:

- the three claims per dataset, each marked reproduced / not reproduced with its numbers (from
  the ``acceptance`` block each study wrote, means over the seeds two cells share);
- the training-length rule and its check: the optimizer steps of every run, the change of the
  training NLL over the last 10 % of epochs, and, for ``--check`` folders (the same runs with
  more steps), how far the study's quantities move when training goes on;
- ``--earlier`` folders (runs under other rules, kept because every run is reported) in a table
  of their own;
- the force-LPA section.

    python -m benchmarks.paper.summary \\
        --studies benchmarks/results/paper_study/{esol,freesolv,lipo} \\
        --check benchmarks/results/paper_study/convergence_{esol,lipo} \\
        --earlier benchmarks/results/paper_study/earlier/* \\
        --force-lpa benchmarks/results/force_lpa.json --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.pages import rerun_command
from benchmarks.paper.force_lpa_page import markdown_section as force_lpa_section
from benchmarks.paper.study import STEM, read_records
from mlip_unc.atomic_write import atomic_write_text

PRUNED_AT = "5d97bda"  # the last commit whose results hold the earlier study folders
CONVERGED_PCT = 10.0  # a check moving no quantity by more than this (relative) counts as converged
CHECK_KEYS = ("rmse", "mean_epistemic_std", "mean_std", "mean_s", "mean_kappa")
NAMES = {
    "esol": "ESOL",
    "freesolv": "FreeSolv",
    "lipo": "Lipophilicity",
    "synthetic": "synthetic (smoke run)",
}


def load_study(folder: Path) -> dict[str, Any]:
    """A study folder's summary JSON and its records; clear error when either is missing."""
    path = folder / f"{STEM}.json"
    if not path.is_file():
        raise SystemExit(
            f"error: {path} not found (run benchmarks/paper/study.py --out {folder} first)"
        )
    summary = json.loads(path.read_text(encoding="utf-8"))
    records = read_records(folder / f"{STEM}.jsonl")
    if not records:
        raise SystemExit(f"error: {folder / (STEM + '.jsonl')} has no records")
    return {
        "folder": folder,
        "summary": summary,
        "records": records,
        "settings": summary["settings"],
    }


def rule_text(s: dict[str, Any]) -> str:
    """The training-length rule of one study, in words."""
    rule = f"{s['epochs']} epochs"
    if s.get("min_steps"):
        rule = f"max({s['epochs']} epochs, {s['min_steps']} optimizer steps)"
    return f"{rule}, batch {s['batch_size']}, cosine lr {s['lr']}, final-epoch weights"


def claims(acc: dict[str, Any]) -> dict[str, Any]:
    """The three claims as verdicts (None: not available) with the numbers behind them."""
    fig = acc.get("figure1", {})
    ivs = acc.get("interventions", [])
    agl = acc.get("agl", {})
    raised = sum(bool(x["verdict"]) for x in ivs)
    return {
        "figure1": None if not fig.get("available") else bool(fig["epistemic"]),
        "figure1_total": None if not fig.get("available") else bool(fig["total"]),
        "figure1_values": fig.get("values"),
        "interventions": None if not ivs else raised == len(ivs),
        "interventions_raised": f"{raised} of {len(ivs)}",
        "interventions_values": {x["variant"]: x["values"] for x in ivs},
        "agl": None if not agl.get("available") else bool(agl["verdict"]),
        "agl_parts": {
            k: agl.get(k) for k in ("rmse_ok", "epistemic_lower", "knn_ok", "tanimoto_ok")
        },
        "agl_values": agl.get("values"),
    }


def paired(
    records: list[dict[str, Any]], variant: str, key: str = "mean_epistemic_std"
) -> tuple[float, int, int]:
    """``variant`` vs bgnn at the largest fraction: mean relative change of ``key`` over the seeds both
    have, and in how many of those seeds it is higher (a seed-paired view of the claims' means)."""
    top = max(float(r["fraction"]) for r in records)
    at = {(r["variant"], int(r["seed"])): r[key] for r in records if float(r["fraction"]) == top}
    seeds = sorted(s for (v, s) in at if v == variant and ("bgnn", s) in at)
    if not seeds:
        return math.nan, 0, 0
    ratios = [at[(variant, s)] / at[("bgnn", s)] for s in seeds]
    return 100.0 * (float(np.mean(ratios)) - 1.0), sum(r > 1.0 for r in ratios), len(seeds)


def verdict(flag: bool | None) -> str:
    return "n/a" if flag is None else ("**reproduced**" if flag else "**not reproduced**")


def convergence(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Steps per run and the change of the training NLL over the last 10 % of epochs."""
    steps = [int(r["n_steps"]) for r in records if r.get("n_steps") is not None]
    tails = [
        abs(r["final_train_nll"] - r["train_nll_at_90pct"])
        for r in records
        if r.get("train_nll_at_90pct") is not None and r.get("final_train_nll") is not None
    ]
    return {
        "n_runs": len(records),
        "steps_min": min(steps, default=None),
        "steps_max": max(steps, default=None),
        "tail_nll_change_median": float(np.median(tails)) if tails else None,
        "tail_nll_change_max": float(np.max(tails)) if tails else None,
        "n_tail": len(tails),
    }


def compare_check(main: list[dict[str, Any]], check: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (variant, fraction): the study's quantities with the study's and the check's steps, shared seeds."""

    def cells(records: list[dict[str, Any]]) -> dict[tuple, dict[int, dict]]:
        out: dict[tuple, dict[int, dict]] = {}
        for r in records:
            out.setdefault((r["variant"], float(r["fraction"])), {})[int(r["seed"])] = r
        return out

    a, b = cells(main), cells(check)
    rows = []
    for key in sorted(set(a) & set(b)):
        seeds = sorted(set(a[key]) & set(b[key]))
        if not seeds:
            continue
        row: dict[str, Any] = {
            "variant": key[0],
            "fraction": key[1],
            "seeds": seeds,
            "steps": [float(np.mean([c[s]["n_steps"] for s in seeds])) for c in (a[key], b[key])],
        }
        for k in CHECK_KEYS:
            va = float(np.mean([a[key][s][k] for s in seeds]))
            vb = float(np.mean([b[key][s][k] for s in seeds]))
            row[k] = [va, vb, 100.0 * (vb / va - 1.0) if va else math.nan]
        rows.append(row)
    return rows


def _fmt(v: Any, spec: str = ".3g") -> str:
    return (
        "n/a" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)
    )


def claims_table(studies: list[dict[str, Any]]) -> list[str]:
    lines = [
        (
            "| dataset | seeds | runs | rule | 1. uncertainty falls, posterior widens (Figure 1) | "
            "2. interventions raise the epistemic std | 3. AGL: lower std, equal RMSE, structural calibration |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for st in studies:
        c, s = st["claims"], st["settings"]
        f1 = c["figure1_values"] or {}
        fig = (
            (
                f"{verdict(c['figure1'])}: epistemic std {_fmt(f1.get('mean_epistemic_std', [None])[0])} -> "
                f"{_fmt(f1.get('mean_epistemic_std', [None, None])[1])}, mean s {_fmt(f1.get('mean_s', [None])[0])} -> "
                f"{_fmt(f1.get('mean_s', [None, None])[1])} (total std: "
                f"{'falls' if c['figure1_total'] else 'does not fall'})"
            )
            if f1
            else "n/a"
        )
        per = []
        for name in c["interventions_values"]:
            change, up, n = paired(st["records"], name)
            per.append(f"{name} {change:+.0f} % ({up}/{n} seeds)")
        iv = (
            f"{verdict(c['interventions'])}: {c['interventions_raised']} raise it at RMSE within 10 %"
            + (f"; {', '.join(per)}" if per else "")
        )
        av = c["agl_values"] or {}
        parts = c["agl_parts"]
        agl_change, agl_up, agl_n = paired(st["records"], "agl")
        agl = (
            (
                f"{verdict(c['agl'])} (epistemic std {agl_change:+.0f} %, higher in {agl_up}/{agl_n} seeds): RMSE {_fmt(av.get('rmse', [None, None])[1])} vs "
                f"{_fmt(av.get('rmse', [None])[0])} (ok: {parts['rmse_ok']}), epistemic std "
                f"{_fmt(av.get('mean_epistemic_std', [None, None])[1])} vs {_fmt(av.get('mean_epistemic_std', [None])[0])}"
                f" (lower: {parts['epistemic_lower']}), kNN calibration ok: {parts['knn_ok']}, Tanimoto ok: "
                f"{parts['tanimoto_ok']}"
            )
            if av
            else "n/a"
        )
        per_seed = Counter(int(r["seed"]) for r in st["records"])
        full = sum(n == max(per_seed.values()) for n in per_seed.values())
        seeds = f"{full}" + (f" (+{len(per_seed) - full} partial)" if full < len(per_seed) else "")
        if full < st["expected_seeds"]:
            seeds += f" **PARTIAL: {st['expected_seeds']} planned**"
        lines.append(
            f"| {NAMES.get(s['dataset'], s['dataset'])} | {seeds} | {len(st['records'])} | "
            f"{rule_text(s)} | {fig} | {iv} | {agl} |"
        )
    return lines


def render(
    studies: list[dict[str, Any]],
    checks: list[dict[str, Any]],
    earlier: list[dict[str, Any]],
    force_section: str | None,
    command: str,
    optimum_section: str | None = None,
) -> str:
    out = [
        "# Latent-posterior alignment study: the paper's three claims",
        "",
        (
            "Each dataset's runs, tables and figures are in its own folder (linked below); the verdicts are computed "
            "from those records by `benchmarks.paper.report.acceptance` (means over the seeds two cells share; smallest vs "
            "largest training fraction for claim 1, the largest fraction for claims 2 and 3). Claim 1 is marked "
            "reproduced when the epistemic std falls and the mean posterior std s does not fall; claim 2 when every "
            "intervention (isotropy, anti, rotation; as trained and with the posterior frozen from bgnn) raises the "
            "epistemic std at RMSE within 10 %; claim 3 when AGL lowers the epistemic std at RMSE at most 5 % worse "
            "and |Spearman| of the std with both density proxies (latent kNN distance, 1 - max Tanimoto) is at "
            "least bgnn's."
        ),
        "",
    ]
    out += claims_table(studies)
    out += [
        "",
        "## Training length: the rule and its check",
        "",
        (
            "Rule: every run trains for max(E epochs, S optimizer steps) with a cosine learning rate to zero and "
            "keeps the final epoch, so that a 10 % subset gets as many updates as the full set (the earlier 60-epoch "
            "ESOL study gave its 10 % runs 180 steps against 1,740 at 100 %, which confounds data size with training "
            "length). Checks: the change of the training NLL over the last 10 % of epochs (per run), and the same "
            "runs trained twice as long (`--check` folders)."
        ),
        "",
        "| dataset | runs | optimizer steps per run | median / max abs change of train NLL over the last 10 % of epochs |",
        "|---|---|---|---|",
    ]
    for st in studies:
        c = st["convergence"]
        out.append(
            f"| {NAMES.get(st['settings']['dataset'], st['settings']['dataset'])} | {c['n_runs']} | "
            f"{c['steps_min']}-{c['steps_max']} | {_fmt(c['tail_nll_change_median'])} / "
            f"{_fmt(c['tail_nll_change_max'])} |"
        )
    for ch in checks:
        out += [
            "",
            (
                f"Check `{ch['folder']}` ({rule_text(ch['settings'])}) against the study's runs: mean over the "
                "shared seeds, study -> check (relative change)."
            ),
            "",
            "| variant | fraction % | seeds | steps | " + " | ".join(CHECK_KEYS) + " |",
            "|---|---|---|---|" + "---|" * len(CHECK_KEYS),
        ]
        for row in ch["rows"]:
            vals = " | ".join(
                f"{row[k][0]:.3g} -> {row[k][1]:.3g} ({row[k][2]:+.0f} %)" for k in CHECK_KEYS
            )
            out.append(
                f"| {row['variant']} | {row['fraction']:g} | {row['seeds']} | "
                f"{row['steps'][0]:.0f} -> {row['steps'][1]:.0f} | {vals} |"
            )
        worst = ch["largest_change"]
        c1 = ch["claims"]
        f1 = c1["figure1_values"] or {}
        out += [
            "",
            (
                f"Largest change: {worst['key']} {worst['change']:+.0f} % ({worst['variant']} {worst['fraction']:g} %); "
                f"every quantity within {CONVERGED_PCT:g} %: **{'yes' if ch['converged'] else 'no'}**."
                + (
                    f" Claim 1 within the check's own runs: {verdict(c1['figure1'])} (epistemic std "
                    f"{_fmt(f1['mean_epistemic_std'][0])} -> {_fmt(f1['mean_epistemic_std'][1])}, mean s "
                    f"{_fmt(f1['mean_s'][0])} -> {_fmt(f1['mean_s'][1])})."
                    if f1
                    else ""
                )
            ),
        ]
    if optimum_section:
        out += ["", optimum_section.rstrip("\n")]
    out += ["", "## Per dataset", ""]
    for st in studies:
        name = NAMES.get(st["settings"]["dataset"], st["settings"]["dataset"])
        out += [f"### {name} ([{st['folder']}/{STEM}.md]({st['link']}))", ""]
        out += st["summary"]["acceptance"].get("lines", [])
        out.append("")
    if earlier:
        out += ["## Earlier runs under other rules (kept: every run is reported)", ""]
        out += claims_table(earlier)
        kept = [st for st in earlier if st.get("page_kept", True)]
        gone = [Path(st["folder"]).name for st in earlier if st not in kept]
        out += [""] + [f"- [{st['folder']}/{STEM}.md]({st['link']})" for st in kept]
        if gone:
            out.append(
                f"- The {len(gone)} earlier folders (`paper_study/earlier/`: {', '.join(gone)}) "
                "are no longer committed; read them with `git show "
                f"{PRUNED_AT}:benchmarks/results/paper_study/earlier/<folder>/paper_study.md`."
            )
        out.append("")
    out.append(
        force_section
        if force_section
        else "## Force LPA on 3BPA\n\nNot run yet (`benchmarks/paper/force_lpa.py`)."
    )
    out += ["", "## Command", "", "```", rerun_command(command), "```"]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--studies", type=Path, nargs="+", required=True, help="paper_study.py output folders"
    )
    p.add_argument("--check", type=Path, nargs="*", default=[], help="the same runs trained longer")
    p.add_argument("--earlier", type=Path, nargs="*", default=[], help="studies under other rules")
    p.add_argument(
        "--force-lpa",
        type=Path,
        default=None,
        help="force_lpa.json (benchmarks/paper/force_lpa.py)",
    )
    p.add_argument(
        "--optimum",
        type=Path,
        default=None,
        help="paper_study_optimum.json (benchmarks/paper/optimum.py)",
    )
    p.add_argument(
        "--expected-seeds",
        type=int,
        default=5,
        help="seeds a --studies folder should have (else PARTIAL)",
    )
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    command = shlex.join(
        ["python", "-m", "benchmarks.paper.summary", *(sys.argv[1:] if argv is None else argv)]
    )
    args.out.mkdir(parents=True, exist_ok=True)

    def with_link(folder: Path) -> dict[str, Any]:
        st = load_study(folder)
        st["link"] = os.path.relpath(folder.resolve() / f"{STEM}.md", args.out.resolve())
        st["claims"], st["convergence"] = (
            claims(st["summary"]["acceptance"]),
            convergence(st["records"]),
        )
        st["expected_seeds"] = args.expected_seeds if folder in args.studies else 0
        st["page_kept"] = (folder / f"{STEM}.md").is_file()
        return st

    studies, earlier = [with_link(f) for f in args.studies], [with_link(f) for f in args.earlier]
    by_dataset = {st["settings"]["dataset"]: st for st in studies}
    checks = []
    for folder in args.check:
        ch = load_study(folder)
        main_study = by_dataset.get(ch["settings"]["dataset"])
        if main_study is None:
            raise SystemExit(
                f"error: {folder} is a {ch['settings']['dataset']} study; no --studies folder has it"
            )
        rows = compare_check(main_study["records"], ch["records"])
        changes = [
            {"key": k, "change": r[k][2], "variant": r["variant"], "fraction": r["fraction"]}
            for r in rows
            for k in CHECK_KEYS
            if math.isfinite(r[k][2])
        ]
        worst = max(
            changes,
            key=lambda c: abs(c["change"]),
            default={"key": "n/a", "change": math.nan, "variant": "n/a", "fraction": math.nan},
        )
        checks.append(
            {
                **ch,
                "rows": rows,
                "largest_change": worst,
                "claims": claims(ch["summary"]["acceptance"]),
                "converged": bool(changes) and abs(worst["change"]) <= CONVERGED_PCT,
            }
        )
    force_section, force = None, None
    if args.force_lpa is not None and args.force_lpa.is_file():
        force = json.loads(args.force_lpa.read_text(encoding="utf-8"))
        force_section = force_lpa_section(force)
    optimum_section = None
    if args.optimum is not None and args.optimum.is_file():
        from benchmarks.paper import optimum  # late: optimum imports this module

        link = os.path.relpath(args.optimum.resolve().with_suffix(".md"), args.out.resolve())
        optimum_section = optimum.markdown_section(
            json.loads(args.optimum.read_text(encoding="utf-8")), link
        )
    md = render(studies, checks, earlier, force_section, command, optimum_section)
    atomic_write_text(args.out / f"{STEM}.md", md)
    summary = {
        "command": command,
        "studies": {
            st["settings"]["dataset"]: {
                "folder": str(st["folder"]),
                "settings": st["settings"],
                "n_runs": len(st["records"]),
                "claims": st["claims"],
                "convergence": st["convergence"],
            }
            for st in studies
        },
        "checks": [
            {
                "folder": str(c["folder"]),
                "settings": c["settings"],
                "rows": c["rows"],
                "largest_change": c["largest_change"],
                "converged": c["converged"],
                "claims": c["claims"],
            }
            for c in checks
        ],
        "earlier": [
            {"folder": str(st["folder"]), "settings": st["settings"], "claims": st["claims"]}
            for st in earlier
        ],
        "force_lpa": str(args.force_lpa) if force is not None else None,
    }
    atomic_write_text(
        args.out / f"{STEM}_summary.json", json.dumps(summary, indent=1, allow_nan=True) + "\n"
    )
    print(
        f"wrote {args.out / STEM}.md and {STEM}_summary.json ({len(studies)} studies, {len(checks)} checks)"
    )
    return summary


if __name__ == "__main__":
    main()
