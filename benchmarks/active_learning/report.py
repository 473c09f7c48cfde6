"""The active-learning page: ``active_learning.{md,json,png}`` from the benchmark's JSONL records.

Definitions (stated on the page):

- error of a model: force MAE (meV/A) averaged over the four oracle reference sets (MD at 300,
  600 and 1200 K, torsion scan), each set's MAE weighted equally;
- target: the mean over seeds of ``random``'s final error; labels to target: the oracle calls
  at which a run's learning curve first reaches the target, interpolated linearly between
  rounds (a run that never reaches it is reported as ``> its final calls``, censored);
- model CPU: the CPU seconds of training (the initial model included), MD and scoring up to the
  final model, all members of a committee counted; the oracle's own time is not included;
- flags: the monitor's flags (``max_force_std`` over its relative threshold) on randomly picked,
  separately labelled MD frames against ``max_i |F_i - F_i^ref|`` over the same threshold.

The periodic system (Si with the mlearn SNAP potential as the oracle, ``--system si``) has its
own records (``active_learning_si*``), numbers (``active_learning_si.json``), figure and a
section at the end of the same page, with the same definitions over its five reference sets
(MD at 300 K, 1200 K and in the melt, vacancy, surface).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.active_learning.benchmark import STRATEGIES, VARIANTS, WIDE_POOL
from benchmarks.common.figures import save_png
from benchmarks.common.pages import run_section
from benchmarks.common.records import read_jsonl

TAG_NOTES = {
    "v1": "retraining at the first training's peak learning rate (0.01) and no refit of the "
    "energy offsets; stopped after seed 0 of ours and committee5 (round 6) and random (round 0) "
    "because every learning curve rose after the first round (the warm start at a high rate "
    "undid the first training: ours 297 -> 435 -> 297 meV/Å, committee5 296 -> 400 -> 259) and "
    "the energies were off by about 9 eV",
    "collided": "seed 1 of ours_biased as first run: two invocations ran it at once from round 4 "
    "(both wrote its folder; the runner now takes a lock per run); run again from scratch",
    "true_error_unfiltered": "the true_error diagnostic's first version (3BPA, the loop retrained "
    "from scratch): it ranked first frames whose reference forces exceed max_label_force, which "
    "the loop drops; seed 1 spent round 1's 10 calls on dropped frames and stopped, seed 0 ended "
    "at 265.9 meV/Å; stopped in seed 2 and run again with those frames ranked last",
}
SETS = ("md_300K", "md_600K", "md_1200K", "torsion_scan")
SI_SETS = ("md_300K", "md_1200K", "md_melt", "vacancy", "surface")
SI_PREFIX = "active_learning_si"  # the Si records: <prefix>.jsonl.gz, <prefix>_stability.jsonl, ...
SI_MIN_DISTANCE_FRACTION = 0.8  # benchmark.SI_MIN_DISTANCE_FRACTION, stated on the page


def error(row: dict[str, Any], sets: Sequence[str] = SETS) -> float:
    """Force MAE (meV/A) averaged over the reference sets ``sets`` of a round's record."""
    values = [float(v) for name in sets if (v := row.get(f"{name}_force_mae")) is not None]
    return 1000 * float(np.mean(values)) if values else float("nan")


def curves(records: list[dict[str, Any]]) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """``{strategy: {seed: rows sorted by round}}`` (the last record of a round wins)."""
    out: dict[str, dict[int, dict[int, dict[str, Any]]]] = {}
    for r in records:
        out.setdefault(r["strategy"], {}).setdefault(r["seed"], {})[r["round"]] = r
    return {
        s: {seed: [rows[k] for k in sorted(rows)] for seed, rows in by_seed.items()}
        for s, by_seed in out.items()
    }


def calls_to_reach(
    rows: list[dict[str, Any]], target: float, sets: Sequence[str] = SETS
) -> tuple[float, bool]:
    """(oracle calls at which the curve first reaches ``target``, reached?)."""
    calls = [float(r["oracle_calls"]) for r in rows]
    errs = [error(r, sets) for r in rows]
    for k, e in enumerate(errs):
        if e <= target:
            if k == 0:
                return calls[0], True
            frac = (errs[k - 1] - target) / (errs[k - 1] - e)
            return calls[k - 1] + frac * (calls[k] - calls[k - 1]), True
    return calls[-1], False


def model_cpu(rows: list[dict[str, Any]]) -> float:
    """Training (initial included), MD and scoring CPU seconds up to the final model."""
    total = float(rows[0].get("cpu_initial_train_s") or 0.0)
    for r in rows[:-1]:
        total += sum(float(r.get(k) or 0.0) for k in ("cpu_md_s", "cpu_score_s", "cpu_retrain_s"))
    return total


def summarise(
    records: list[dict[str, Any]], stab: list[dict[str, Any]], sets: Sequence[str] = SETS
) -> dict[str, Any]:
    """Every number of the page (of one system: its reference ``sets``), from the records."""
    by = curves(records)
    complete = {
        s: {seed: rows for seed, rows in seeds.items() if "cpu_retrain_s" not in rows[-1]}
        for s, seeds in by.items()
    }  # a finished run's last row is the final model's (no retraining after it)
    finals = {
        s: [error(rows[-1], sets) for rows in seeds.values()]
        for s, seeds in complete.items()
        if seeds
    }
    target = float(np.mean(finals["random"])) if finals.get("random") else float("nan")
    out: dict[str, Any] = {"target_meV_A": target, "strategies": {}}
    for s in STRATEGIES + VARIANTS:
        seeds = complete.get(s) or {}
        if not seeds:
            continue
        reach = {seed: calls_to_reach(rows, target, sets) for seed, rows in seeds.items()}
        flags = {k: 0 for k in ("audit_tp", "audit_fp", "audit_fn", "audit_tn")}
        for rows in seeds.values():
            for r in rows:
                for k in flags:
                    flags[k] += int(r.get(k) or 0)
        tp, fp, fn = flags["audit_tp"], flags["audit_fp"], flags["audit_fn"]
        final_rows = [rows[-1] for rows in seeds.values()]
        out["strategies"][s] = {
            "seeds": sorted(seeds),
            "final_error": _stat([error(r, sets) for r in final_rows]),
            "final_calls": _stat([float(r["oracle_calls"]) for r in final_rows]),
            "final_sets": {
                name: {
                    key: _stat([1000 * float(r.get(f"{name}_{key}") or np.nan) for r in final_rows])
                    for key in ("force_mae", "force_rmse", "energy_mae")
                }
                for name in sets
            },
            "calls_to_target": {
                str(seed): {"calls": c, "reached": ok} for seed, (c, ok) in reach.items()
            },
            "calls_to_target_mean": float(np.mean([c for c, _ in reach.values()])),
            "all_reached": all(ok for _, ok in reach.values()),
            "model_cpu_s": _stat([model_cpu(rows) for rows in seeds.values()]),
            "flags": {
                **flags,
                "precision": tp / (tp + fp) if tp + fp else None,
                "recall": tp / (tp + fn) if tp + fn else None,
            },
            "curve": _mean_curve(list(seeds.values()), sets),
            "flagged_share": _flagged_share([r for rows in seeds.values() for r in rows]),
            "runs_below_round0": sum(
                error(rows[-1], sets) < error(rows[0], sets) for rows in seeds.values()
            ),
            "stability": _stability([r for r in stab if r["strategy"] == s]),
        }
    out["verdicts"] = verdicts(out["strategies"])
    return out


def _flagged_share(rows: list[dict[str, Any]]) -> float | None:
    """Share of the MD frames the rounds visited that the monitor flagged (None: no MD yet)."""
    visited = sum(int(r.get("n_md_frames") or 0) for r in rows)
    return sum(int(r.get("n_flagged") or 0) for r in rows) / visited if visited else None


def _stat(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    return {"mean": float(np.nanmean(a)), "std": float(np.nanstd(a)), "n": int(a.size)}


def _mean_curve(
    runs: list[list[dict[str, Any]]], sets: Sequence[str] = SETS
) -> list[dict[str, float]]:
    n = min(len(rows) for rows in runs)
    return [
        {
            "round": k,
            "calls": float(np.mean([rows[k]["oracle_calls"] for rows in runs])),
            "error": float(np.mean([error(rows[k], sets) for rows in runs])),
            "error_min": float(np.min([error(rows[k], sets) for rows in runs])),
            "error_max": float(np.max([error(rows[k], sets) for rows in runs])),
        }
        for k in range(n)
    ]


def _stability(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {}
    for t in sorted({r["temperature"] for r in rows}):
        sel = [r for r in rows if r["temperature"] == t]
        out[f"{t:g}"] = {
            "runs": len(sel),
            "failed": sum(bool(r["failed"]) for r in sel),
            "mean_survived_ps": float(np.mean([r["survived_ps"] for r in sel])),
            "length_ps": float(sel[0]["length_ps"]),
        }
    return out


def verdicts(st: dict[str, Any]) -> list[str]:
    """The issue's targets, each as one sentence with the measured ratio."""
    if not {"ours", "random", "committee5"} <= set(st):
        return ["Targets not evaluated: ours, random and committee5 are not all finished."]
    ours, rnd, com = st["ours"], st["random"], st["committee5"]
    lines = []
    r1 = ours["calls_to_target_mean"] / rnd["calls_to_target_mean"]
    censored = "" if ours["all_reached"] else " (censored: not every ours seed reached the target)"
    lines.append(
        f"ours reaches random's final error with {r1:.2f}x random's oracle calls "
        f"(target <= 0.6x): {'met' if r1 <= 0.6 and ours['all_reached'] else 'missed'}{censored}."
    )
    r2 = ours["calls_to_target_mean"] / com["calls_to_target_mean"]
    lines.append(
        f"ours needs {r2:.2f}x the committee's oracle calls to that error (target <= 1.1x): "
        f"{'met' if r2 <= 1.1 and ours['all_reached'] else 'missed'}{censored}."
    )
    r3 = ours["model_cpu_s"]["mean"] / com["model_cpu_s"]["mean"]
    lines.append(
        f"ours spends {r3:.2f}x the committee's model CPU time (target <= 0.4x): "
        f"{'met' if r3 <= 0.4 else 'missed'}."
    )
    hot_o, hot_c = ours["stability"].get("1200"), com["stability"].get("1200")
    if hot_o and hot_c:
        ok = hot_o["mean_survived_ps"] >= hot_c["mean_survived_ps"]
        lines.append(
            f"At 1200 K the final ours model survives {hot_o['mean_survived_ps']:.2f} ps on "
            f"average ({hot_o['failed']}/{hot_o['runs']} runs failed) against the committee-trained "
            f"model's {hot_c['mean_survived_ps']:.2f} ps ({hot_c['failed']}/{hot_c['runs']}): "
            f"{'met' if ok else 'missed'}."
        )
    return lines


def status_line(st: dict[str, Any], wanted: int = 3, si_run: bool | None = False) -> str:
    """``Status: complete`` or ``partial`` with the finished seeds of each strategy; the 3BPA
    page says whether the periodic system has records (``si_run``; None: say nothing)."""
    seeds = {s: st[s]["seeds"] if s in st else [] for s in STRATEGIES}
    done = all(len(v) >= wanted for v in seeds.values())
    per = "; ".join(f"{s} {', '.join(map(str, v)) or 'none'}" for s, v in seeds.items())
    line = f"Status: {'complete' if done else 'partial'} ({wanted} seeds wanted; finished: {per})."
    if si_run is None:
        return line
    if si_run:
        return line + " The periodic system (Si with the SNAP oracle) has its section below."
    return line + " Only 3BPA so far: the periodic system (Si with the SNAP oracle) is not run yet."


def reading(summary: dict[str, Any]) -> list[str]:
    """What the tables say, in sentences whose numbers come from ``summary`` (with
    ``summary["scratch_loop"]``, the strategies of the loop retrained from scratch)."""
    st, out = summary["strategies"], []
    loop = summary.get("scratch_loop") or {}
    below = ", ".join(f"{s} {v['runs_below_round0']} of {len(v['seeds'])}" for s, v in st.items())
    out.append(
        f"Runs whose final model (80 calls) is better than their round-0 model (20 calls): {below}. "
        "Where that is few, the learning curves measure the warm-started retraining more than the "
        "choice of labels, and 'calls to target' is reached at round 0 or not at all."
    )
    if refit := summary.get("refit"):
        out.append(_refit_sentence(refit, spread=False))
    if "ours" in st and "random" in st:
        o, r = st["ours"]["stability"].get("600"), st["random"]["stability"].get("600")
        if o and r:
            out.append(
                f"At 600 K the final ours models run {o['mean_survived_ps']:.2f} ps on average "
                f"before an unphysical frame ({o['failed']}/{o['runs']} runs fail) against "
                f"random's {r['mean_survived_ps']:.2f} ps ({r['failed']}/{r['runs']})."
            )
    out.append(
        "Why we think the targets are missed here: the seed set (16 + 4 frames) gives an initial "
        "model whose MD leaves the thermal region within the first round, so the most uncertain "
        "visited frames are distorted, high-energy structures; labelling them teaches the model "
        "where MD goes wrong (the stability rows) but not the thermal frames of the reference "
        "sets (the error rows), and 20 warm-started epochs per round do not absorb them. Not "
        "yet tested: a larger seed set"
        + ", MD stopped at the first flag"
        + (
            " (ours_early, section below, stops it at the tenth, so that every round labels 10)"
            if "ours_early" in loop
            else ""
        )
        + ("." if loop else ", retraining from scratch.")
    )
    if {"ours", "random"} <= set(loop):
        o, r = loop["ours"]["final_error"], loop["random"]["final_error"]
        out.append(
            "With the loop retrained from scratch every round (section below), ours ends at "
            f"{o['mean']:.1f} ± {o['std']:.1f} meV/Å against random's {r['mean']:.1f} ± "
            f"{r['std']:.1f}"
            + (
                f" and the committee's {c['mean']:.1f} ± {c['std']:.1f}"
                if (c := (loop.get("committee5") or {}).get("final_error"))
                else ""
            )
            + ": "
            + (
                "the warm-started retraining alone does not explain the miss here."
                if o["mean"] >= r["mean"] - r["std"]
                else "the warm-started retraining hid part of what the labels are worth."
            )
        )
        if t := (loop.get("true_error") or {}).get("final_error"):
            if t["mean"] > r["mean"] + r["std"]:
                than = "less than"
            elif t["mean"] < r["mean"] - r["std"]:
                than = "more than"
            else:
                than = "about as much as"
            ratio = (
                loop["true_error"]["calls_to_target_mean"] / loop["random"]["calls_to_target_mean"]
            )
            out.append(
                "In that loop, labelling the frames with the largest true force error (true_error, "
                f"section 'How much the score chooses') ends at {t['mean']:.1f} ± {t['std']:.1f} "
                f"meV/Å against random's {r['mean']:.1f}, at {ratio:.2f}x random's calls to its "
                f"final error: the frames where the model is most wrong teach the reference sets "
                f"{than} a uniform draw, so "
                + (
                    "a better error ranking, which is what sigma_F offers, cannot reach the 0.6x "
                    "target with this protocol."
                    if ratio > 0.6 or not loop["true_error"]["all_reached"]
                    else "an error ranking as good as the truth would reach the 0.6x target."
                )
            )
    return out + wide_reading(summary)


def _pm(stat: dict[str, float], spec: str = "{:.0f}") -> str:
    if stat is None or not math.isfinite(stat["mean"]):
        return "n/a"
    return f"{spec.format(stat['mean'])} ± {spec.format(stat['std'])}"


def _strategy_table(st: dict[str, Any]) -> list[str]:
    """The main table: one row per strategy."""
    lines = [
        "| strategy | seeds | final error | oracle calls | calls to target | model CPU s | "
        "flag precision | flag recall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s, v in st.items():
        reach = ", ".join(
            f"{c['calls']:.0f}" + ("" if c["reached"] else " (not reached)")
            for c in v["calls_to_target"].values()
        )
        f = v["flags"]
        prec = "n/a" if f["precision"] is None else f"{f['precision']:.2f}"
        rec = "n/a" if f["recall"] is None else f"{f['recall']:.2f}"
        lines.append(
            f"| {s} | {len(v['seeds'])} | {_pm(v['final_error'], '{:.1f}')} | "
            f"{_pm(v['final_calls'])} | {reach} | {_pm(v['model_cpu_s'])} | {prec} "
            f"({f['audit_tp']}/{f['audit_tp'] + f['audit_fp']}) | {rec} "
            f"({f['audit_tp']}/{f['audit_tp'] + f['audit_fn']}) |"
        )
    return lines


def _sets_table(st: dict[str, Any], sets: Sequence[str]) -> list[str]:
    """Final models per reference set: force MAE / RMSE and energy MAE."""
    lines = [
        "| strategy | " + " | ".join(f"{n} F MAE / RMSE, E MAE" for n in sets) + " |",
        "|---|" + "---|" * len(sets),
    ]
    for s, v in st.items():
        cells = [
            f"{_pm(v['final_sets'][n]['force_mae'])} / {_pm(v['final_sets'][n]['force_rmse'])}, "
            f"{_pm(v['final_sets'][n]['energy_mae'])}"
            for n in sets
        ]
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines


def _curves_table(st: dict[str, Any]) -> list[str]:
    """Learning curves: error @ oracle calls per round, mean over seeds."""
    n = max(len(v["curve"]) for v in st.values()) if st else 0
    lines = ["| strategy | " + " | ".join(f"round {k}" for k in range(n)) + " |"]
    lines.append("|---|" + "---|" * n)
    for s, v in st.items():
        cells = [f"{p['error']:.1f} @ {p['calls']:.0f}" for p in v["curve"]]
        lines.append(f"| {s} | " + " | ".join(cells + ["–"] * (n - len(cells))) + " |")
    if any(len(v["curve"]) < n for v in st.values()):
        lines += [
            "",
            "–: a run of that strategy ended before this round (a round whose chosen frames "
            "could none be labelled ends the loop), and the mean covers the rounds every seed has.",
        ]
    return lines


def _stability_table(st: dict[str, Any]) -> list[str]:
    lines = [
        "| strategy | T (K) | runs | failed | mean time to failure or end (ps) |",
        "|---|---|---|---|---|",
    ]
    for s, v in st.items():
        for t, x in v["stability"].items():
            lines.append(
                f"| {s} | {t} | {x['runs']} | {x['failed']} | {x['mean_survived_ps']:.3f} of {x['length_ps']:.3g} |"
            )
    return lines


def _refit_table(refit: dict[str, Any]) -> list[str]:
    lines = [
        "| strategy | runs | error from scratch (meV/Å) | per seed |",
        "|---|---|---|---|",
    ]
    for s, v in refit.items():
        per = ", ".join(f"{e:.1f} (seed {k})" for k, e in v["per_seed"].items())
        lines.append(f"| {s} | {v['n']} | {_pm(v['error'], '{:.1f}')} | {per} |")
    return lines


def markdown(
    summary: dict[str, Any],
    runs: list[dict[str, Any]],
    png: str,
    other_tags: dict[str, int] | None = None,
    si: list[str] | None = None,
    scratch_loop: list[str] | None = None,
) -> str:
    """The page: 3BPA (``scratch_loop``: its section on the loop retrained from scratch), then
    the lines of the Si section (``si``; none: not run yet)."""
    st = summary["strategies"]
    lines = [
        "# Active learning on 3BPA with GFN2-xTB as the oracle",
        "",
        "Does the uncertainty save reference calculations? Five strategies at the same label "
        "budget and the same MD protocol (`benchmarks/active_learning/benchmark.py` says how "
        "each is made; `configs/al_xtb_3bpa.yaml` is the `ours` run). Error = force MAE (meV/Å) "
        "averaged over the four xTB reference sets (MD at 300/600/1200 K, torsion scan); "
        f"target = random's final error, {summary['target_meV_A']:.1f} meV/Å.",
        "",
        status_line(st, si_run=bool(si)),
        "",
        *_strategy_table(st),
    ]
    lines += ["", "Targets of the issue:", ""] + [f"- {v}" for v in summary["verdicts"]]
    lines += ["", "Reading:", ""] + [f"- {v}" for v in reading(summary)]
    lines += ["", f"![learning curves]({png})", "", "## Final models per reference set", ""]
    lines += _sets_table(st, SETS)
    lines += ["", "Forces meV/Å, energies meV, mean ± std over seeds.", ""]
    lines += ["## Learning curves (mean over seeds)", "", *_curves_table(st)]
    lines += [
        "",
        "Cells: error (meV/Å) @ oracle calls.",
        "",
        "## MD stability of the final models",
        "",
        *_stability_table(st),
    ]
    lines += [
        "",
        "A run fails at the first frame (checked every 10 steps) with a bond of the start "
        "geometry stretched beyond 1.5x or compressed below 0.7x, two atoms closer than 0.7 Å, "
        "or a frame the calculator refuses. Langevin NVT, 0.5 fs, friction 0.02/fs, from the "
        "seed set's first frame; the committee's model is its member 0 (one model's cost).",
        "",
    ]
    refit = summary.get("refit") or {}
    if refit:
        lines += [
            "## The data without the training protocol",
            "",
            "A model trained from scratch (the first training's recipe: 200 epochs, rate 0.01) "
            "on each finished run's final training and validation frames, on the same reference "
            "sets: how good the labels a strategy chose are, apart from the warm-started "
            "retraining.",
            "",
            *_refit_table(refit),
        ]
        lines.append("")
    lines += scratch_loop or []
    if other_tags:
        lines += ["## Other records in the same files", ""]
        lines += [
            f"- tag `{t}` ({n} rounds): {TAG_NOTES.get(t, '')}" for t, n in other_tags.items()
        ]
        lines.append("")
    last = runs[-1] if runs else {}
    lines += run_section(
        [r["command"] for r in runs],
        date=last.get("started"),
        json_name="active_learning.json",
        machine=last.get("machine"),
        load_avg=last.get("load_avg"),
        versions=last.get("versions"),
    )
    if si:
        lines += ["", *si]
    return "\n".join(lines) + "\n"


SI_COMMANDS = (
    "OMP_NUM_THREADS=1 .venv-mace/bin/python -m benchmarks.active_learning.reference_sets_si",
    "OMP_NUM_THREADS=1 .venv-mace/bin/python -m benchmarks.active_learning --system si",
)


def _refit_sentence(refit: dict[str, Any], *, spread: bool) -> str:
    """The from-scratch refits of the runs' final labels in one sentence (``spread``: with the
    std over the runs)."""
    parts = ", ".join(
        f"{s} {v['error']['mean']:.1f}" + (f" ± {v['error']['std']:.1f}" if spread else "")
        for s, v in refit.items()
    )
    what = "mean ± std" if spread else "mean"
    tail = "without the warm-started retraining" if spread else "without the retraining protocol"
    return (
        "Trained from scratch on each run's final labels (table below), the error is "
        f"(meV/Å, {what} over the runs refitted): {parts}: the labels themselves, {tail}."
    )


def si_reading(summary: dict[str, Any], sets: Sequence[str]) -> list[str]:
    """What the Si tables say, in sentences whose numbers come from ``summary``; then why we
    think the label-saving target is missed."""
    st, out = summary["strategies"], []
    finals = {s: v["final_error"]["mean"] for s, v in st.items()}
    spread = f"{min(finals.values()):.1f}-{max(finals.values()):.1f}"
    if "random" in st:
        spread += f" meV/Å (random's seed std: {st['random']['final_error']['std']:.1f})"
    out.append(f"The strategies' final errors span {spread}.")
    shares = {
        s: v.get("flagged_share") for s, v in st.items() if v.get("flagged_share") is not None
    }
    if shares:
        out.append(
            "Share of the visited MD frames the monitor flagged: "
            + ", ".join(f"{s} {100 * v:.0f} %" for s, v in shares.items())
            + ". A round's labels are picked among the flagged frames of one trajectory."
        )
    if "ours" in st:
        per_set = {n: st["ours"]["final_sets"][n]["force_mae"]["mean"] for n in sets}
        worst = max(per_set, key=lambda n: per_set[n])
        out.append(
            f"The average is dominated by {worst}: the final ours models' force MAE there is "
            f"{per_set[worst]:.0f} meV/Å against "
            + ", ".join(f"{n} {v:.0f}" for n, v in per_set.items() if n != worst)
            + "."
        )
    if refit := summary.get("refit"):
        out.append(_refit_sentence(refit, spread=True))
    wider = "" if summary.get("wide_pool") else ", more MD frames per round (a wider pool)"
    untested = (
        f"a committee retrained from scratch{wider}"
        if summary.get("scratch")  # read below: trained from scratch at every round
        else f"the label target on models retrained from scratch every round{wider}"
    )
    out.append(
        "Why we think the target is missed here: the warm-started models' error follows the "
        "temperature schedule of the rounds (the learning curves move together) and the melt "
        "more than the labels chosen; the from-scratch refits above measure the labels apart "
        f"from that. Not yet tested: {untested}."
    )
    if scratch := summary.get("scratch"):
        out.append(
            "Trained from scratch at every round (section below), the label target reads: "
            + " ".join(scratch["verdicts"])
        )
    return out + wide_reading(summary)


def label_target(strategy: dict[str, Any], random_calls: float) -> tuple[float, bool]:
    """A strategy's calls to the target over random's ``random_calls``, and whether that meets the
    issue's 0.6x (every seed of the strategy reaching the target)."""
    ratio = strategy["calls_to_target_mean"] / random_calls
    return ratio, ratio <= 0.6 and strategy["all_reached"]


def wide_reading(summary: dict[str, Any]) -> list[str]:
    """One sentence per ``--wide-pool`` protocol with ours and random finished
    (``summary["wide_pool"]``, :func:`wide_pool_report`)."""
    out = []
    for tag, st in (summary.get("wide_pool") or {}).items():
        if not {"ours", "random"} <= set(st):
            continue
        o, r = st["ours"]["final_error"], st["random"]["final_error"]
        ratio, met = label_target(st["ours"], st["random"]["calls_to_target_mean"])
        out.append(
            f"Choosing the labels among {WIDE_POOL}x more MD frames per round ({WIDE_TAGS[tag]}, "
            f"section 'A wider pool'), ours ends at {o['mean']:.1f} ± {o['std']:.1f} meV/Å "
            f"against random's {r['mean']:.1f} ± {r['std']:.1f}, at {ratio:.2f}x random's calls "
            "to its final error: "
            + ("within" if met else "a wider pool does not bring it within")
            + " the 0.6x target."
        )
    return out


def si_section(summary: dict[str, Any] | None, runs: list[dict[str, Any]], png: str) -> list[str]:
    """The page's section on the periodic system: its tables from ``summary`` (None: no
    records of the tag yet, the commands that make them)."""
    from benchmarks.active_learning.reference_sets_si import Settings

    ref = Settings()
    lines = [
        "## Si with the published SNAP potential as the oracle",
        "",
        "The periodic system: a 64-atom diamond Si cell (`configs/al_snap_si.yaml`), the same "
        "five strategies and protocol, MD heating from 300 K to 2200 K over the rounds. The "
        "oracle is the published SNAP potential of the mlearn study (Zuo et al., J. Phys. Chem. "
        "A 2020, 124, 731; LAMMPS `pair_style snap`): **a stand-in for DFT**, cheap enough to "
        "label every frame the benchmark asks for; errors are against SNAP, not against PBE. "
        "Error = force MAE (meV/Å) averaged over the five SNAP reference sets "
        "(`benchmarks/active_learning/reference_sets_si.py`: MD at 300 K, 1200 K and in the "
        f"melt at {ref.melt_k:g} K, a relaxed and thermal vacancy and (001) surface at "
        f"{ref.defect_k:g} K).",
        "",
        f"Reference sets: {ref.n_frames} frames per MD set, {ref.stride * ref.timestep_fs:g} fs "
        f"apart after {ref.equilibration * ref.timestep_fs / 1000:g} ps (as many as a few "
        "minutes of one shared core make; every other one is evaluated), the melt first melted "
        f"at {ref.premelt_k:g} K; the vacancy and surface sets: the relaxed cell and "
        f"{ref.n_defect_frames} frames of MD, all evaluated. Checksums: "
        "`active_learning/reference_sets_si.json`.",
        "",
    ]
    if summary is None or not summary["strategies"]:
        return lines + ["Not run yet. Commands:", "", *[f"- `{c}`" for c in SI_COMMANDS]]
    st = summary["strategies"]
    lines += [
        f"Target = random's final error, {summary['target_meV_A']:.1f} meV/Å. "
        + status_line(st, si_run=None),
        "",
        *_strategy_table(st),
        "",
        "Targets of the issue:",
        "",
        *[f"- {v}" for v in summary["verdicts"]],
        "",
        "Reading:",
        "",
        *[f"- {v}" for v in si_reading(summary, SI_SETS)],
        "",
        f"![learning curves, Si]({png})",
        "",
        "### Final models per reference set (Si)",
        "",
        *_sets_table(st, SI_SETS),
        "",
        "Forces meV/Å, energies meV, mean ± std over seeds.",
        "",
        "### Learning curves (Si, mean over seeds)",
        "",
        *_curves_table(st),
        "",
        "Cells: error (meV/Å) @ oracle calls.",
        "",
        "### MD stability of the final models (Si)",
        "",
        *_stability_table(st),
        "",
        "Langevin NVT, 1 fs, friction 0.02/fs, from the crystal at 1200 K and from the first "
        f"frame of the oracle's melt set at {ref.melt_k:g} K. A run fails at the first frame (checked every "
        f"10 steps) with two atoms closer than {SI_MIN_DISTANCE_FRACTION:g}x the smallest "
        "interatomic distance in the oracle's reference sets (their manifest), non-finite "
        "forces, or a frame the calculator refuses; the committee's model is its member 0.",
        "",
    ]
    refit = summary.get("refit") or {}
    if refit:
        lines += ["### The data without the training protocol (Si)", "", *_refit_table(refit), ""]
    lines += scratch_section(summary.get("scratch") or {})
    last = runs[-1] if runs else {}
    footer = run_section(
        [r["command"] for r in runs],
        date=last.get("started"),
        json_name="active_learning_si.json",
        machine=last.get("machine"),
        load_avg=last.get("load_avg"),
        versions=last.get("versions"),
    )
    return lines + ["### Run (Si)", *footer[1:]]


def plot(
    summary: dict[str, Any], path: Path, oracle: str = "GFN2-xTB", n_sets: int = len(SETS)
) -> None:
    """The learning curves (mean over seeds, min-max band); with ``summary["scratch"]`` a
    second panel, the models trained from scratch at every round (mean ± std band). The
    selection variants (:data:`VARIANTS`) are dashed."""
    from matplotlib.figure import Figure

    scratch = summary.get("scratch") or {}
    fig = Figure(figsize=(11.5 if scratch else 6.5, 4), layout="constrained")
    axes = fig.subplots(1, 2 if scratch else 1, sharey=True, squeeze=False)[0]
    ax = axes[0]
    colours = {}
    for s, v in summary["strategies"].items():
        c = v["curve"]
        x = [p["calls"] for p in c]
        style = "o--" if s in VARIANTS else "o-"  # the selection variants: dashed
        (line,) = ax.plot(x, [p["error"] for p in c], style, label=s)
        colours[s] = line.get_color()
        ax.fill_between(x, [p["error_min"] for p in c], [p["error_max"] for p in c], alpha=0.15)
    ax.axhline(summary["target_meV_A"], color="grey", ls="--", lw=0.8, label="target")
    if scratch:
        ax.set_title("warm-started retraining (the issue's protocol)", fontsize=9)
        ax2 = axes[1]
        for s, v in scratch["strategies"].items():
            c = v["curve"]
            x = [p["calls"] for p in c]
            mean = np.array([p["error_mean"] for p in c])
            std = np.array([p["error_std"] for p in c])
            ax2.plot(x, mean, "o--" if s in VARIANTS else "o-", label=s, color=colours.get(s))
            ax2.fill_between(x, mean - std, mean + std, alpha=0.15, color=colours.get(s))
        ax2.axhline(scratch["target_meV_A"], color="grey", ls="--", lw=0.8, label="target")
        ax2.set_title("trained from scratch at every round", fontsize=9)
        ax2.set_xlabel(f"oracle calls ({oracle})")
        ax2.legend(fontsize=8)
    ax.set_xlabel(f"oracle calls ({oracle})")
    ax.set_ylabel(f"force MAE, mean of {n_sets} sets (meV/Å)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    save_png(fig, path)


def scratch_curves(
    refits: list[dict[str, Any]], records: list[dict[str, Any]]
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """From-scratch learning curves, ``{strategy: {seed: rows sorted by round}}``, of the runs
    with per-round refit records (``benchmark.refit_final(rounds=...)``): round k > 0 is the
    model trained from scratch on the run's labels after k rounds; a refit record without
    ``round`` is the final round's (the round and oracle calls of the run's last record);
    round 0 is the shared initial model (the first single-model strategy's round-0 record of
    the seed: trained from scratch on the seed set with the same recipe as the refits)."""
    runs = curves(records)
    per_round = {(r["strategy"], r["seed"]) for r in refits if "round" in r}
    out: dict[str, dict[int, dict[int, dict[str, Any]]]] = {}
    for r in refits:
        key = (r["strategy"], r["seed"])
        rows = runs.get(r["strategy"], {}).get(r["seed"])
        if key not in per_round or not rows:
            continue
        last = rows[-1]
        if "round" not in r:  # the final round's refit
            r = {**r, "round": last["round"], "oracle_calls": last["oracle_calls"]}
        out.setdefault(r["strategy"], {}).setdefault(r["seed"], {})[r["round"]] = r
    for s, seeds in out.items():
        for seed, rows_by_round in seeds.items():
            initial = [
                runs[o][seed][0]
                for o in STRATEGIES
                if o != "committee5" and seed in runs.get(o, {}) and runs[o][seed][0]["round"] == 0
            ]
            if initial:
                rows_by_round[0] = {**initial[0], "strategy": s}
    return {
        s: {seed: [rows[k] for k in sorted(rows)] for seed, rows in sorted(seeds.items())}
        for s, seeds in out.items()
    }


def scratch_summary(
    refits: list[dict[str, Any]], records: list[dict[str, Any]], sets: Sequence[str]
) -> dict[str, Any]:
    """The from-scratch reading (empty without per-round refits): per strategy the curve (mean
    and std over seeds at each round), and the labels to target as on the warm-started table
    (:func:`calls_to_reach`, linear between rounds) with target = random's mean final
    from-scratch error, over the runs whose curve has every round up to its final one; the
    ratios of the mean calls (ours/random, ours/committee5) against the issue's targets."""
    by = scratch_curves(refits, records)
    if not by:
        return {}
    ends = {
        (s, seed): rows[-1]["round"]
        for s, seeds in curves(records).items()
        for seed, rows in seeds.items()
    }
    final = {
        s: {
            seed: rows
            for seed, rows in seeds.items()
            if [r["round"] for r in rows] == list(range(ends[s, seed] + 1))
        }
        for s, seeds in by.items()
    }  # complete: every round from 0 to the run's final one
    random_finals = {  # per seed: the final refit (no ``round``, or the run's last round)
        r["seed"]: error(r, sets)
        for r in refits
        if r["strategy"] == "random"
        and ("random", r["seed"]) in ends
        and r.get("round", ends["random", r["seed"]]) == ends["random", r["seed"]]
    }
    target = float(np.mean(list(random_finals.values()))) if random_finals else float("nan")
    out: dict[str, Any] = {"target_meV_A": target, "strategies": {}}
    for s in STRATEGIES + VARIANTS:
        seeds = by.get(s)
        if not seeds:
            continue
        rounds = sorted({r["round"] for rows in seeds.values() for r in rows})
        curve = []
        for k in rounds:
            at = [r for rows in seeds.values() for r in rows if r["round"] == k]
            curve.append(
                {
                    "round": k,
                    "calls": float(np.mean([r["oracle_calls"] for r in at])),
                    **{f"error_{key}": v for key, v in _stat([error(r, sets) for r in at]).items()},
                }
            )
        reach = {seed: calls_to_reach(rows, target, sets) for seed, rows in final[s].items()}
        out["strategies"][s] = {
            "seeds": sorted(seeds),
            "complete_seeds": sorted(final[s]),
            "curve": curve,
            "calls_to_target": {
                str(seed): {"calls": c, "reached": ok} for seed, (c, ok) in reach.items()
            },
            "calls_to_target_stat": _stat([c for c, _ in reach.values()]) if reach else None,
            "all_reached": bool(reach) and all(ok for _, ok in reach.values()),
        }
    out["verdicts"] = scratch_verdicts(out["strategies"])
    return out


def scratch_verdicts(st: dict[str, Any]) -> list[str]:
    """The issue's two label targets read on the from-scratch curves, one sentence each."""
    need = ("ours", "random", "committee5")
    if not all(st.get(s, {}).get("calls_to_target_stat") for s in need):
        return ["Not evaluated: ours, random and committee5 do not all have a complete curve."]
    calls = {s: st[s]["calls_to_target_stat"]["mean"] for s in need}
    ok = st["ours"]["all_reached"]
    censored = "" if ok else " (censored: not every ours seed reached the target)"
    r1, r2 = calls["ours"] / calls["random"], calls["ours"] / calls["committee5"]

    def bound(name: str, limit: float) -> str:
        note = censored_bound(st[name]["calls_to_target"], name, calls["ours"], limit)
        return f" ({note})" if note else ""

    return [
        f"ours reaches random's final from-scratch error with {r1:.2f}x random's oracle calls "
        f"(target <= 0.6x): {'met' if r1 <= 0.6 and ok else 'missed'}{censored}"
        f"{bound('random', 0.6)}.",
        f"ours needs {r2:.2f}x the committee's oracle calls to that error (target <= 1.1x): "
        f"{'met' if r2 <= 1.1 and ok else 'missed'}{bound('committee5', 1.1)}.",
    ]


def censored_bound(
    reach: dict[str, dict[str, Any]], name: str, ours_calls: float, limit: float | None
) -> str:
    """A note (empty if none) where ``name`` has seeds counted at their final calls (``reach``:
    per seed its calls and whether it reached the target): its true calls are larger, so ours'
    ratio to it is an upper bound, and the target ``limit`` would be met only above
    ``ours_calls / limit`` (``limit`` None: ours itself falls short, so no such condition)."""
    short = [c for c in reach.values() if not c["reached"]]
    if not short:
        return ""
    note = (
        f"{name}: {len(short)} of {len(reach)} seeds never reach it and count at their final "
        "calls, so the ratio is an upper bound"
    )
    if limit is None:
        return note
    return f"{note}: missed as measured, met only if {name} took at least {ours_calls / limit:.0f} calls on average"


def _scratch_table(scratch: dict[str, Any]) -> list[str]:
    """From-scratch errors per round: mean ± std over seeds @ oracle calls, then the labels to
    target per seed and their mean ± std."""
    st = scratch["strategies"]
    rounds = sorted({p["round"] for v in st.values() for p in v["curve"]})
    lines = [
        "| strategy | seeds | "
        + " | ".join(f"round {k}" for k in rounds)
        + " | calls to target (per seed) | mean ± std |",
        "|---|---|" + "---|" * len(rounds) + "---|---|",
    ]
    for s, v in st.items():
        at = {p["round"]: p for p in v["curve"]}
        cells = [
            f"{at[k]['error_mean']:.1f} ± {at[k]['error_std']:.1f} @ {at[k]['calls']:.0f}"
            + (f" (n={at[k]['error_n']})" if at[k]["error_n"] != len(v["seeds"]) else "")
            if k in at
            else "n/a"
            for k in rounds
        ]
        reach = ", ".join(
            f"{c['calls']:.0f}" + ("" if c["reached"] else " (not reached)")
            for c in v["calls_to_target"].values()
        )
        lines.append(
            f"| {s} | {len(v['seeds'])} | "
            + " | ".join(cells)
            + f" | {reach or 'n/a'} | {_pm(v['calls_to_target_stat'], '{:.1f}')} |"
        )
    return lines


def scratch_section(scratch: dict[str, Any], wanted: int = 3) -> list[str]:
    """The Si page's section on the models trained from scratch at every round (partial while
    a strategy has fewer than ``wanted`` complete curves)."""
    if not scratch:
        return []
    st = scratch["strategies"]
    status = (
        "complete" if all(len(v["complete_seeds"]) >= wanted for v in st.values()) else "partial"
    )
    complete = ", ".join(f"{s} {len(v['complete_seeds'])}" for s, v in st.items())
    return [
        "### Trained from scratch at every round (Si)",
        "",
        "A second reading of the label target, apart from the warm-started retraining: after "
        "every round k of each run, a model trained from scratch (the first training's recipe, "
        "as the final refits above) on the frames the run had labelled by then, with the "
        "run's own train/validation split of that round (the files its k-th retraining read). "
        "Round 0 is the shared initial model (trained from scratch on the seed set); the final "
        "round is the refit above. Cells: error (meV/Å, mean ± std over seeds) @ oracle calls. "
        f"Target = random's mean final from-scratch error, {scratch['target_meV_A']:.1f} meV/Å; "
        "calls to target: where a run's from-scratch curve first reaches it, linear between "
        f"rounds, as above. Status: {status} (complete curves, of {wanted} seeds wanted: "
        f"{complete}).",
        "",
        *_scratch_table(scratch),
        "",
        "The issue's label targets on these curves:",
        "",
        *[f"- {v}" for v in scratch["verdicts"]],
        "",
        "The issue's protocol (warm-started retraining every round, the targets above) remains "
        "the one the acceptance is judged on; this is a second reading of the same labels.",
        "",
    ]


SCRATCH_TAG = "scratch"
"""Records of the loop run with ``--retrain-from-scratch`` (every round trained anew)."""
WIDE_TAGS = {"wide": "fine-tuned each round", "scratch_wide": "retrained from scratch every round"}
"""Records of ``--wide-pool`` runs, by tag: the protocol they widen."""
SCRATCH_INTRO = (
    "The same protocol with `retrain_from_scratch: true`: each round's model is trained anew "
    "with the first training's recipe, and it drives the next round's MD. Same seed sets and "
    "initial models as above; no stability runs."
)


def _after_calls(st: dict[str, Any]) -> str:
    """``at the same N oracle calls`` for ours and random, or each one's mean final calls."""
    ours, rand = (round(st[s]["final_calls"]["mean"]) for s in ("ours", "random"))
    if ours == rand:
        return f"at the same {ours} oracle calls"
    return f"after {ours} and {rand} oracle calls (mean over seeds)"


def other_references(runs: list[dict[str, Any]], tag: str, besides: Sequence[str] = ()) -> bool:
    """Whether the runs of ``tag`` were evaluated on a generation of the reference sets that no
    run of another tag records, the tags ``besides`` aside (run records' ``references``
    checksums; older records have none): then its rows compare with those tags' only."""
    own = {
        json.dumps(r["references"], sort_keys=True)
        for r in runs
        if r.get("tag") == tag and r.get("references")
    }
    others = {
        json.dumps(r.get("references"), sort_keys=True)
        for r in runs
        if r.get("tag") != tag and r.get("tag") not in besides
    }
    return bool(own) and not own & others


def wide_pool_report(
    every: list[dict[str, Any]],
    *,
    sets: Sequence[str],
    system: str,
    heading: str,
    runs: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """Per ``--wide-pool`` protocol with records in ``every``: :func:`summarise`'s strategies
    (``{tag: strategies}``, for the JSON and :func:`wide_reading`) and its section
    (:func:`scratch_loop_section` with its own title and introduction; ``runs``: the system's
    run records, for :func:`other_references`)."""
    summaries: dict[str, Any] = {}
    lines: list[str] = []
    for tag, protocol in WIDE_TAGS.items():
        records = [r for r in every if r.get("tag") == tag]
        if not records:
            continue
        summary = summarise(records, [], sets)
        summaries[tag] = summary["strategies"]
        fresh = other_references(runs or [], tag, besides=list(WIDE_TAGS))
        intro = (
            f"The loop {protocol}, with each round's MD {WIDE_POOL}x longer at the same logging "
            f"interval (`--wide-pool`): a round logs {logged_frames(records)} frames and the 10 "
            "labels are chosen among them, so the score, not the farthest-point rule over nearly "
            "every frame, decides. No stability runs. "
            + (
                "Its runs used seed sets, initial models and reference sets generated again for "
                "them (the checksums in their run records): the oracle's MD is chaotic and its "
                "results differ between generations in the 7th digit, so the sets are "
                "statistically alike, not identical, to those of the other protocols: compare "
                "its rows with each other and with the other wide-pool section's."
                if fresh
                else "Same seed sets and initial models as above."
            )
        )
        lines += scratch_loop_section(
            records,
            sets=sets,
            system=system,
            heading=heading,
            title=f"A wider pool, {protocol}",
            intro=intro,
            summary=summary,
        )
    return summaries, lines


def scratch_loop_section(
    records: list[dict[str, Any]],
    wanted: int = 3,
    *,
    sets: Sequence[str] = SI_SETS,
    system: str = "Si",
    heading: str = "###",
    title: str = "The loop retrained from scratch every round",
    intro: str = SCRATCH_INTRO,
    summary: dict[str, Any] | None = None,
) -> list[str]:
    """A system's section on one other protocol of the loop, by default the loop retrained from
    scratch every round (``--retrain-from-scratch``; its MD driven by those models; ``title``
    and ``intro`` name another): finished runs in the main table's form, target = random's
    final error of these runs; partial runs by rounds done. ``summary``: the records'
    :func:`summarise`, when the caller has it."""
    if not records:
        return []
    summary = summary or summarise(records, [], sets)
    st = summary["strategies"]
    by = curves(records)
    progress = "; ".join(
        f"{s} seed {seed}: {len(rows)} rows"
        for s, seeds in by.items()
        for seed, rows in seeds.items()
    )
    done = all(len(v["seeds"]) >= wanted for v in st.values()) and bool(st)
    lines = [
        f"{heading} {title} ({system})",
        "",
        f"{intro} Status: {'complete' if done else 'partial'} (rows per run: {progress}).",
        "",
    ]
    if not st:
        return lines + ["No run finished yet.", ""]
    lines += [
        f"Target = random's final error in these runs, {summary['target_meV_A']:.1f} meV/Å.",
        "",
        *_strategy_table(st),
        "",
        *_curves_table(st),
        "",
    ]
    if {"ours", "random"} <= set(st):
        ratio, met = label_target(st["ours"], st["random"]["calls_to_target_mean"])
        ours, rand = st["ours"]["final_error"], st["random"]["final_error"]
        bound = censored_bound(
            st["random"]["calls_to_target"],
            "random",
            st["ours"]["calls_to_target_mean"],
            0.6 if st["ours"]["all_reached"] else None,
        )
        lines += [
            f"ours reaches random's final error with {ratio:.2f}x random's oracle calls (the "
            f"issue's target <= 0.6x: {'met' if met else 'missed'}"
            f"{'' if st['ours']['all_reached'] else '; not every ours seed reached it'}"
            f"{f'; {bound}' if bound else ''}). "
            f"Final error: ours {ours['mean']:.1f} ± {ours['std']:.1f} against random's "
            f"{rand['mean']:.1f} ± {rand['std']:.1f} meV/Å {_after_calls(st)}."
            + ("" if "committee5" in st else " The committee was not run in this protocol."),
            "",
        ]
    if {"ours", "random", "committee5"} <= set(st):  # against the committee retrained the same way
        lines += [f"- {v}" for v in verdicts(st)[1:3]] + [""]
    if dropped := dropped_labels(records, list(st)):
        lines += [dropped, ""]
    return lines


def dropped_labels(records: list[dict[str, Any]], strategies: Sequence[str]) -> str:
    """A sentence on the chosen frames whose labels the loop dropped (the oracle failed, or
    their reference forces exceed ``max_label_force``): spent calls that trained nothing, per
    strategy (empty when none was dropped)."""
    counts = {s: [0, 0] for s in strategies}
    for r in records:
        if r["strategy"] in counts and "n_labelled" in r:
            dropped = int(r.get("n_dropped") or 0)
            counts[r["strategy"]][0] += dropped
            counts[r["strategy"]][1] += int(r["n_labelled"]) + dropped
    if not any(d for d, _ in counts.values()):
        return ""
    return (
        "Chosen frames whose labels were dropped (the oracle failed, or their reference forces "
        "exceed max_label_force): oracle calls that trained nothing: "
        + ", ".join(f"{s} {d} of {n}" for s, (d, n) in counts.items())
        + "."
    )


def pool_table(pool: list[dict[str, Any]]) -> list[str]:
    """Per round, over the seeds of the ``true_error`` runs: the logged frames' true largest
    force error and how the model's sigma_F and its largest |F_pred| rank it (Spearman)."""
    by: dict[int, list[dict[str, Any]]] = {}
    for r in pool:
        by.setdefault(int(r["round"]), []).append(r)
    lines = [
        "| round | seeds | frames | true largest force error, mean (eV/Å) | Spearman sigma_F | "
        "Spearman abs(F_pred) |",
        "|---|---|---|---|---|---|",
    ]
    for k in sorted(by):
        rows = by[k]

        def cell(key: str, rows: list[dict[str, Any]] = rows) -> str:
            return _pm(_stat([float(r[key]) for r in rows]), "{:.2f}")

        lines.append(
            f"| {k} | {len(rows)} | {sum(int(r['n_labelled']) for r in rows)} | "
            f"{cell('mean_max_force_error')} | {cell('spearman_sigma')} | "
            f"{cell('spearman_force')} |"
        )
    return lines


def logged_frames(records: list[dict[str, Any]]) -> int:
    """The MD frames a round logs (the median over the records' rounds; 0 without MD)."""
    counts = [int(r["n_md_frames"]) for r in records if r.get("n_md_frames")]
    return int(np.median(counts)) if counts else 0


def early_rounds(records: list[dict[str, Any]]) -> tuple[int, int]:
    """(rounds whose MD logged fewer frames than :func:`logged_frames`, rounds with MD) of the
    ``ours_early`` records: those stopped at the tenth flagged frame."""
    full = logged_frames(records)
    rows = [r for r in records if r["strategy"] == "ours_early" and r.get("n_md_frames")]
    return sum(int(r["n_md_frames"]) < full for r in rows), len(rows)


def selection_section(
    st: dict[str, Any],
    pool: list[dict[str, Any]],
    *,
    system: str,
    frames: int,
    early: tuple[int, int] = (0, 0),
    sets: Sequence[str] = SETS,
    heading: str = "###",
) -> list[str]:
    """How much the score chooses: the selection variants (:data:`VARIANTS`) beside ours and
    random in ``st`` (one protocol's :func:`summarise` strategies), as label-target ratios
    against random's final error, and the ``true_error`` runs' ranking of the logged frames
    (:func:`pool_table`). ``frames``: logged MD frames per round; ``early``: (rounds whose MD
    stopped at the tenth flag, rounds) of the ``ours_early`` runs (:func:`early_rounds`)."""
    if not set(VARIANTS) & set(st) or "random" not in st:
        return []
    lines = [
        f"{heading} How much the score chooses ({system})",
        "",
        f"A round logs {frames} MD frames and labels 10. With the shipped pool (4 x top_k = 40 "
        "frames) the diverse selection runs farthest-point sampling over nearly every logged "
        "frame, so the score picks little more than the first label. Variants of the rule, "
        "at the same budget in the same protocol: `ours_top` labels the 10 frames with the "
        "largest sigma_F (`selection.pool_factor: 1`); `ours_early` does the same with the MD "
        "stopped at its tenth flagged frame (`md.max_flags: 10`); `true_error` labels the 10 "
        "with the largest true force error, found by labelling every logged frame with the "
        "oracle (those labels are not counted as calls and never trained on; their CPU is in "
        "its model CPU). `true_error` is what a perfect error estimate would choose with this "
        "rule.",
        "",
        "| strategy | seeds | final error (meV/Å) | calls to random's final error | x random's |",
        "|---|---|---|---|---|",
    ]
    base = st["random"]["calls_to_target_mean"]
    shown = [s for s in ("random", "ours", *VARIANTS) if s in st]
    for s in shown:
        v = st[s]
        censored = "" if v["all_reached"] else " (not every seed reached it)"
        lines.append(
            f"| {s} | {len(v['seeds'])} | {_pm(v['final_error'], '{:.1f}')} | "
            f"{v['calls_to_target_mean']:.0f}{censored} | {v['calls_to_target_mean'] / base:.2f} |"
        )
    lines += ["", "Final models per reference set:", ""]
    lines += [*_sets_table({s: st[s] for s in shown}, sets), ""]
    lines += ["Forces meV/Å, energies meV, mean ± std over seeds.", ""]
    if "ours_early" in st:
        lines += [
            f"`ours_early`'s MD stopped at its tenth flagged frame in {early[0]} of {early[1]} "
            "rounds; in the others it flagged fewer (the thresholds are 1.5x the validation "
            "level, which rises as the labels join the validation set) and ran all its steps, "
            "as `ours_top`'s does.",
            "",
        ]
    if "true_error" in st:
        v = st["true_error"]
        ratio, met = label_target(v, base)
        lines += [
            f"Ranked by the true error, the loop needs {ratio:.2f}x random's oracle calls to "
            f"random's final error{'' if v['all_reached'] else ' (not every seed reached it)'}: "
            + (
                "within the issue's 0.6x, so a score that ranked frames as the true error does "
                "would meet the target with this rule."
                if met
                else "above the issue's 0.6x, so no score that ranks the logged frames by their "
                "error meets the target with this rule."
            ),
            "",
        ]
    if pool:
        lines += [
            "How the model of each round ranks the frames its MD logged, in the `true_error` "
            "runs (mean ± std over seeds):",
            "",
            *pool_table(pool),
            "",
        ]
    return lines


def protocol_selection(
    st: dict[str, Any],
    records: list[dict[str, Any]],
    pool: list[dict[str, Any]],
    tag: str,
    **kwargs: Any,
) -> list[str]:
    """:func:`selection_section` of one protocol: its ``records`` (for the logged frames and
    the early stops) and the ``pool`` records of its ``tag``; ``kwargs`` go through."""
    return selection_section(
        st,
        [r for r in pool if r.get("tag") == tag],
        frames=logged_frames(records),
        early=early_rounds(records),
        **kwargs,
    )


def system_summary(
    out: Path,
    prefix: str,
    records_name: str,
    tag: str,
    sets: Sequence[str],
    every: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, int]]:
    """(summary, run records, round counts of other tags but ``quick``) of one system's records
    of ``tag``: ``records_name`` (``every``: its records, already read) and
    ``<prefix>_{stability,runs,refit}.jsonl`` under ``out``."""
    every = read_jsonl(out / records_name) if every is None else every
    records = [r for r in every if r.get("tag") == tag]
    other: dict[str, int] = {}
    for r in every:
        if r.get("tag") not in (tag, "quick"):
            other[str(r.get("tag"))] = other.get(str(r.get("tag")), 0) + 1
    stab = [r for r in read_jsonl(out / f"{prefix}_stability.jsonl") if r.get("tag") == tag]
    runs = [r for r in read_jsonl(out / f"{prefix}_runs.jsonl") if r.get("tag") == tag]
    summary = summarise(records, stab, sets)
    refits = [r for r in read_jsonl(out / f"{prefix}_refit.jsonl") if r.get("tag") == tag]
    summary["refit"] = {  # the final labels' refits (per-round ones carry ``round``)
        s: {
            "n": len(rows),
            "error": _stat([error(r, sets) for r in rows]),
            "per_seed": {str(r["seed"]): error(r, sets) for r in rows},
        }
        for s in STRATEGIES
        if (rows := [r for r in refits if r["strategy"] == s and "round" not in r])
    }
    if scratch := scratch_summary(refits, records, sets):
        summary["scratch"] = scratch
    summary["written"] = time.strftime("%Y-%m-%d %H:%M")
    summary["commands"] = [r["command"] for r in runs]
    return summary, runs, other


def write_report(out: Path, tag: str) -> Path:
    """Rewrite ``out/active_learning.{md,json,png}`` from the records of ``tag`` (3BPA), with
    the Si section from the ``active_learning_si*`` records (``active_learning_si.{json,png}``
    where there are any)."""
    every = read_jsonl(out / "active_learning.jsonl.gz")
    summary, runs, other = system_summary(
        out, "active_learning", "active_learning.jsonl.gz", tag, SETS, every
    )
    for own in (SCRATCH_TAG, *WIDE_TAGS):  # their own sections
        other.pop(own, None)
    loop_3bpa = [r for r in every if r.get("tag") == SCRATCH_TAG]
    scratch_loop = scratch_loop_section(loop_3bpa, sets=SETS, system="3BPA", heading="##")
    pool = read_jsonl(out / "active_learning_pool.jsonl")
    warm = [r for r in every if r.get("tag") == tag]
    scratch_loop = [
        *protocol_selection(
            summary["strategies"],
            warm,
            pool,
            tag,
            system="3BPA, fine-tuned each round",
            heading="##",
        ),
        *scratch_loop,
    ]
    if loop_3bpa:
        summary["scratch_loop"] = summarise(loop_3bpa, [], SETS)["strategies"]
        scratch_loop += protocol_selection(
            summary["scratch_loop"],
            loop_3bpa,
            pool,
            SCRATCH_TAG,
            system="3BPA, the loop retrained from scratch",
        )
    summary["wide_pool"], wide = wide_pool_report(
        every,
        sets=SETS,
        system="3BPA",
        heading="##",
        runs=read_jsonl(out / "active_learning_runs.jsonl"),
    )
    scratch_loop += wide
    (out / "active_learning.json").write_text(json.dumps(summary, indent=1))
    if summary["strategies"]:
        plot(summary, out / "active_learning.png")
    every_si = read_jsonl(out / f"{SI_PREFIX}.jsonl.gz")
    si, si_runs, _ = system_summary(out, SI_PREFIX, f"{SI_PREFIX}.jsonl.gz", tag, SI_SETS, every_si)
    si_lines = None
    if si["strategies"]:
        si["wide_pool"], si_wide = wide_pool_report(
            every_si,
            sets=SI_SETS,
            system="Si",
            heading="###",
            runs=read_jsonl(out / f"{SI_PREFIX}_runs.jsonl"),
        )
        (out / f"{SI_PREFIX}.json").write_text(json.dumps(si, indent=1))
        plot(si, out / f"{SI_PREFIX}.png", oracle="SNAP", n_sets=len(SI_SETS))
        si_lines = si_section(si, si_runs, f"{SI_PREFIX}.png")
        si_pool = read_jsonl(out / f"{SI_PREFIX}_pool.jsonl")
        warm_si = [r for r in every_si if r.get("tag") == tag]
        si_lines += protocol_selection(
            si["strategies"],
            warm_si,
            si_pool,
            tag,
            system="Si, fine-tuned each round",
            sets=SI_SETS,
        )
        loop = [r for r in every_si if r.get("tag") == SCRATCH_TAG]
        si_lines += scratch_loop_section(loop)
        if loop:
            si_lines += protocol_selection(
                summarise(loop, [], SI_SETS)["strategies"],
                loop,
                si_pool,
                SCRATCH_TAG,
                system="Si, the loop retrained from scratch",
                sets=SI_SETS,
            )
        si_lines += si_wide
    page = out / "active_learning.md"
    text = markdown(summary, runs, "active_learning.png", other, si_lines, scratch_loop)
    if si_lines is None:
        text += "\n" + "\n".join(si_section(None, [], "")) + "\n"
    page.write_text(text)
    return page
