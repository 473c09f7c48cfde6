"""The LPA study's report: records -> per-cell aggregates, acceptance lines, markdown.

Pure functions of a list of flat records (:func:`benchmarks.paper.lpa.study_record` plus
``variant``, ``fraction`` (in %) and ``seed``), as defined in docs/method.md sections 4-7 of
this project. Nothing here trains or touches a model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from benchmarks.paper.lpa import INTERVENTIONS, RECORD_KEYS, VARIANTS

__all__ = ["TABLES", "aggregate", "acceptance", "render_markdown"]


# ====================================================================== aggregation
Records = Sequence[Mapping[str, Any]]
Cell = tuple[str, float]  # (variant, fraction in %)


def _finite(values: Iterable[Any]) -> list[float]:
    return [
        float(v)
        for v in values
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ]


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return float("nan"), float("nan")
    return float(np.mean(values)), (float(np.std(values, ddof=1)) if len(values) > 1 else 0.0)


def aggregate(records: Records, metrics: Sequence[str] = RECORD_KEYS) -> list[dict[str, Any]]:
    """One row per (fraction, variant): ``seeds``, ``<metric>`` and ``<metric>_std`` (sample std over seeds)."""
    groups: dict[tuple[float, str], list[Mapping[str, Any]]] = {}
    for r in records:
        groups.setdefault((float(r["fraction"]), str(r["variant"])), []).append(r)
    order = {name: i for i, name in enumerate(VARIANTS)}
    rows = []
    for (fraction, variant), rs in sorted(
        groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))
    ):
        row: dict[str, Any] = {
            "fraction": fraction,
            "variant": variant,
            "seeds": sorted(int(r["seed"]) for r in rs),
        }
        for m in metrics:
            row[m], row[f"{m}_std"] = _mean_std(_finite(r.get(m) for r in rs))
        rows.append(row)
    return rows


def _compare(
    records: Records, a: Cell, b: Cell, metrics: Sequence[str]
) -> tuple[list[int], dict[str, tuple]]:
    """Common seeds of two cells and, per metric, ``(mean over a, mean over b)`` on those seeds."""

    def cell(c: Cell) -> dict[int, Mapping[str, Any]]:
        return {
            int(r["seed"]): r
            for r in records
            if r["variant"] == c[0] and float(r["fraction"]) == c[1]
        }

    ra, rb = cell(a), cell(b)
    seeds = sorted(set(ra) & set(rb))

    def avg(rs: dict[int, Mapping[str, Any]], key: str) -> float:
        vals = _finite(rs[s].get(key) for s in seeds)
        return float(np.mean(vals)) if vals else float("nan")

    return seeds, {k: (avg(ra, k), avg(rb, k)) for k in metrics}


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _pct(new: float, old: float) -> str:
    ok = old != 0 and math.isfinite(old) and math.isfinite(new)
    return f"{100.0 * (new / old - 1.0):+.0f} %" if ok else "n/a"


def _pair(v: dict[str, tuple], key: str, fmt: str = ".4g", *, arrow: bool = False) -> str:
    a, b = v[key]
    return f"{a:{fmt}} -> {b:{fmt}}" if arrow else f"{b:{fmt}} vs {a:{fmt}}"


# ====================================================================== acceptance lines
def _figure1(records: Records, lo: float, hi: float) -> dict[str, Any]:
    keys_ = ("mean_epistemic_std", "mean_std", "mean_s", "rmse", "mean_kappa", "n_steps")
    seeds, v = _compare(records, ("bgnn", lo), ("bgnn", hi), keys_)
    if not seeds:
        missing = (
            f"1. Figure-1 reproduction: not available (no bgnn seed at both {lo:g} and {hi:g} %)."
        )
        return {"available": False, "line": missing}
    epi_falls = v["mean_epistemic_std"][1] < v["mean_epistemic_std"][0]
    tot_falls = v["mean_std"][1] < v["mean_std"][0]
    s_holds = v["mean_s"][1] >= v["mean_s"][0]
    line = (
        f"1. Figure-1 reproduction (bgnn, {lo:g} % -> {hi:g} % of the training set, seeds {seeds}): "
        f"epistemic std {_pair(v, 'mean_epistemic_std', arrow=True)} (falls: {_yes(epi_falls)}), "
        f"total std {_pair(v, 'mean_std', arrow=True)} (falls: {_yes(tot_falls)}), "
        f"mean posterior s {_pair(v, 'mean_s', arrow=True)} (does not fall: {_yes(s_holds)}); "
        f"RMSE {_pair(v, 'rmse', arrow=True)}, kappa {_pair(v, 'mean_kappa', '.3g', arrow=True)}"
        + (
            f", optimizer steps {_pair(v, 'n_steps', '.0f', arrow=True)}"
            if math.isfinite(v["n_steps"][0])
            else ""
        )
        + ". "
        f"**Reproduced with the epistemic std: {_yes(epi_falls and s_holds)}; "
        f"with the total std: {_yes(tot_falls and s_holds)}.**"
    )
    out = {"available": True, "epistemic": epi_falls and s_holds, "total": tot_falls and s_holds}
    return {**out, "seeds": seeds, "values": v, "line": line}


def _intervention(records: Records, variant: str, hi: float, tol: float) -> dict[str, Any] | None:
    keys_ = ("rmse", "mean_epistemic_std", "mean_std", "mean_s", "mean_kappa")
    seeds, v = _compare(records, ("bgnn", hi), (variant, hi), keys_)
    if not seeds:
        return None
    rmse_ok = abs(v["rmse"][1] / v["rmse"][0] - 1.0) <= tol
    epi_up = v["mean_epistemic_std"][1] > v["mean_epistemic_std"][0]
    tot_up = v["mean_std"][1] > v["mean_std"][0]
    frozen = variant.endswith("_frozen")
    how = (
        "posterior frozen from the bgnn run of the same seed and fraction"
        if frozen
        else "as trained"
    )
    change = {k: _pct(v[k][1], v[k][0]) for k in ("mean_epistemic_std", "mean_std", "mean_s")}
    line = (
        f"{variant} ({how}, {hi:g} %, seeds {seeds}): RMSE {_pair(v, 'rmse')} (bgnn) "
        f"(within {100 * tol:g} %: {_yes(rmse_ok)}); epistemic std {_pair(v, 'mean_epistemic_std')} "
        f"({change['mean_epistemic_std']}, raised: {_yes(epi_up)}); total std {_pair(v, 'mean_std')} "
        f"({change['mean_std']}, raised: {_yes(tot_up)}); mean s {_pair(v, 'mean_s')} ({change['mean_s']}); "
        f"kappa {_pair(v, 'mean_kappa', '.3g')}. "
        f"**Raises the epistemic std at RMSE within {100 * tol:g} %: {_yes(rmse_ok and epi_up)}.**"
    )
    out = {
        "variant": variant,
        "rmse_ok": rmse_ok,
        "epistemic_raised": epi_up,
        "total_raised": tot_up,
    }
    return {**out, "verdict": rmse_ok and epi_up, "seeds": seeds, "values": v, "line": line}


def _agl(records: Records, hi: float, tol: float) -> dict[str, Any]:
    keys_ = (
        "rmse",
        "mean_epistemic_std",
        "mean_std",
        "struct_cal_knn",
        "struct_cal_tanimoto",
        "mean_kappa",
        "mean_norm2",
        "effective_rank",
    )
    seeds, v = _compare(records, ("bgnn", hi), ("agl", hi), keys_)
    if not seeds:
        return {
            "available": False,
            "line": f"3. AGL: not available (no bgnn and agl seed in common at {hi:g} %).",
        }
    rmse_ok = v["rmse"][1] <= (1.0 + tol) * v["rmse"][0]
    epi_low = v["mean_epistemic_std"][1] < v["mean_epistemic_std"][0]
    tot_low = v["mean_std"][1] < v["mean_std"][0]
    knn_ok = abs(v["struct_cal_knn"][1]) >= abs(v["struct_cal_knn"][0])
    tan_ok = abs(v["struct_cal_tanimoto"][1]) >= abs(v["struct_cal_tanimoto"][0])
    verdict = rmse_ok and epi_low and knn_ok and tan_ok
    line = (
        f"3. AGL vs bgnn ({hi:g} %, seeds {seeds}): RMSE {_pair(v, 'rmse')} (at most {100 * tol:g} % worse: "
        f"{_yes(rmse_ok)}); epistemic std {_pair(v, 'mean_epistemic_std')} "
        f"({_pct(*v['mean_epistemic_std'][::-1])}, lower: {_yes(epi_low)}); "
        f"total std {_pair(v, 'mean_std')} (lower: {_yes(tot_low)}); structural calibration "
        f"Spearman(std, latent kNN distance) {_pair(v, 'struct_cal_knn', '+.3f')} "
        f"(|.| at least as high: {_yes(knn_ok)}), "
        f"Spearman(std, 1 - max Tanimoto) {_pair(v, 'struct_cal_tanimoto', '+.3f')} "
        f"(|.| at least as high: {_yes(tan_ok)}); kappa {_pair(v, 'mean_kappa', '.3g')}, "
        f"||z||^2 {_pair(v, 'mean_norm2', '.3g')}, effective rank {_pair(v, 'effective_rank', '.3g')}. "
        f"**Lower epistemic std at RMSE within {100 * tol:g} % with structural calibration at least as high: "
        f"{_yes(verdict)}.**"
    )
    out = {
        "available": True,
        "rmse_ok": rmse_ok,
        "epistemic_lower": epi_low,
        "total_lower": tot_low,
    }
    return {
        **out,
        "knn_ok": knn_ok,
        "tanimoto_ok": tan_ok,
        "verdict": verdict,
        "seeds": seeds,
        "values": v,
        "line": line,
    }


_LOG_PARTS = {
    "mean_log_norm2": "||z||^2",
    "log_mean_s2": "mean s^2",
    "mean_log_kappa": "kappa",
    "log_y_scale2": "target scale^2",
}


def _decomposition(records: Records, a: Cell, b: Cell) -> dict[str, Any] | None:
    seeds, v = _compare(records, a, b, tuple(_LOG_PARTS))
    if not seeds:
        return None
    d = {k: v[k][1] - v[k][0] for k in _LOG_PARTS}
    latent = ("mean_log_norm2", "log_mean_s2", "mean_log_kappa")
    dominant = _LOG_PARTS[max(latent, key=lambda k: abs(d[k]))]
    terms = ", ".join(f"{_LOG_PARTS[k]} {d[k]:+.2f}" for k in _LOG_PARTS)
    text = (
        f"{a[0]} {a[1]:g} % -> {b[0]} {b[1]:g} % (seeds {seeds}): delta mean log U = {sum(d.values()):+.2f} = "
        f"{terms}; the factor (of ||z||^2, mean s^2, kappa) that moved log U most: **{dominant}**"
    )
    return {
        "deltas": d,
        "delta_log_u": sum(d.values()),
        "dominant": dominant,
        "seeds": seeds,
        "text": text,
    }


def acceptance(
    records: Records, *, rmse_tol_intervention: float = 0.10, rmse_tol_agl: float = 0.05
) -> dict[str, Any]:
    """The study's acceptance lines, computed from the records (means over the seeds two cells share).

    Fractions: the smallest and largest present. 1: bgnn's epistemic and total std fall and
    its mean posterior s does not fall. 2: each intervention (as trained and frozen) against
    bgnn at the largest fraction, RMSE within ``rmse_tol_intervention`` (relative, either
    way), epistemic std raised. 3: AGL against bgnn at the largest fraction, RMSE at most
    ``rmse_tol_agl`` worse, epistemic std lower and ``|structural calibration|`` at least as
    high for both proxies. 4: log-variance decomposition (bgnn across fractions, bgnn -> agl).
    Each part has a ``line`` (or ``text``); ``lines`` holds them all, in order.
    """
    fractions = sorted({float(r["fraction"]) for r in records})
    if not fractions:
        return {"lines": ["No records."]}
    lo, hi = fractions[0], fractions[-1]
    out: dict[str, Any] = {
        "fraction_low": lo,
        "fraction_high": hi,
        "figure1": _figure1(records, lo, hi),
    }
    names = [v for iv in INTERVENTIONS for v in (iv, f"{iv}_frozen")]
    out["interventions"] = [
        x for x in (_intervention(records, v, hi, rmse_tol_intervention) for v in names) if x
    ]
    out["agl"] = _agl(records, hi, rmse_tol_agl)
    out["decomposition"] = {
        "bgnn_fraction": _decomposition(records, ("bgnn", lo), ("bgnn", hi)),
        "bgnn_agl": _decomposition(records, ("bgnn", hi), ("agl", hi)),
    }
    lines = [out["figure1"]["line"]]
    if out["interventions"]:
        lines.append(
            f"2. Interventions vs bgnn at {hi:g} % (as trained, with the mean posterior s beside it; and "
            "trained with the posterior frozen from bgnn, so that only the latent geometry differs):"
        )
        lines += [f"   - {x['line']}" for x in out["interventions"]]
    else:
        lines.append(
            f"2. Interventions: not available (no intervention run paired with bgnn at {hi:g} %)."
        )
    lines.append(out["agl"]["line"])
    dec = [x["text"] for x in out["decomposition"].values() if x]
    lines.append(
        "4. Log-variance decomposition of the latent part U = z^T S z of the epistemic variance "
        "(target units): " + ("; ".join(dec) if dec else "not available") + "."
    )
    out["lines"] = lines
    return out


# ====================================================================== markdown
TABLES: dict[str, tuple[str, ...]] = {
    "Accuracy and uncertainty (test set, target units)": (
        "rmse",
        "nll",
        "mean_epistemic_std",
        "mean_std",
        "miscalibration_area",
        "spearman",
        "coverage_95",
    ),
    "Posterior and latent-posterior alignment (standardised units)": (
        "mean_s",
        "kl",
        "mean_kappa",
        "median_alignment",
        "rho_lpa",
        "mean_norm2",
        "effective_rank",
    ),
    "Structural calibration (Spearman of the epistemic std with a sparsity proxy; positive is good)": (
        "struct_cal_knn",
        "struct_cal_tanimoto",
    ),
}


def _cell(mean: float, std: float, n: int) -> str:
    if not math.isfinite(mean):
        return "-"
    return f"{mean:.3g} ± {std:.2g}" if n > 1 and math.isfinite(std) else f"{mean:.3g}"


def render_markdown(
    records: Records, *, command: str, seeds: Sequence[int], header: Sequence[str] = ()
) -> str:
    """The study report: per (fraction, variant) tables first, the acceptance lines, the
    settings (``header``), then the commands that made the records (as they run today)."""
    from benchmarks.common.pages import rerun_command

    rows = aggregate(records)
    parts = ["# Latent-posterior alignment study", ""]
    for title, metrics in TABLES.items():
        parts += [f"## {title}", ""]
        parts.append("| fraction % | variant | seeds | " + " | ".join(metrics) + " |")
        parts.append("|---" * (len(metrics) + 3) + "|")
        for row in rows:
            cells = [_cell(row[m], row[f"{m}_std"], len(row["seeds"])) for m in metrics]
            first = f"| {row['fraction']:g} | {row['variant']} | {len(row['seeds'])} | "
            parts.append(first + " | ".join(cells) + " |")
        parts += ["", "Mean ± sample std over seeds (the mean alone for one seed).", ""]
    parts += [
        "## Acceptance lines (computed from the records)",
        "",
        *acceptance(records)["lines"],
        "",
        "## Settings",
        "",
        f"Seeds: {list(seeds)}.",
        *header,
        "",
        "## Commands",
        "",
        "```",
        *(rerun_command(c) for c in command.splitlines()),
        "```",
        "",
    ]
    return "\n".join(parts)
