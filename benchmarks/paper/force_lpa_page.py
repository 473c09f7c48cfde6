"""The force-LPA page: ``force_lpa.md`` and its figure from the result of
:mod:`benchmarks.paper.force_lpa`, and the compact section that ``benchmarks.paper.summary`` puts
on the paper study's page. Pure functions of the result (no torch): the per-set table, the
decomposition, the frame scores, the sweep and a reading made of their numbers only.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common.pages import rerun_command
from mlip_unc.atomic_write import atomic_write

SETS = ("train", "test", "ood")


NAMES = {"train": "train", "test": "in-domain test", "ood": "OOD"}


SCORES = {
    "max_atom_std": "max atom force std",
    "mean_log_kappa": "frame mean log kappa",
    "mean_log_norm2": "frame mean log norm2",  # norm2 = ||g||^2 (no pipes: markdown tables)
    # baselines on the same frames: trivial ones and a committee of the same architecture
    "force": "baseline: max abs F_pred",
    "latent_knn": "baseline: latent kNN distance (Phi)",
    "descriptor_knn": "baseline: descriptor kNN distance",
    "committee5": "baseline: committee5 max atom force std",
}


KNN_K = 10  # neighbours of the distance baselines


RANK_KEYS = ("spearman_frame_in_domain", "partial_spearman_given_force", "auroc_ood")


KAPPA_KEYS = ("mean_log_kappa", "median_log_kappa", "mean_kappa", "frac_kappa_below_1")


def _f(v: Any, fmt: str = "+.3f") -> str:
    return "n/a" if v is None else format(v, fmt)


def _n(v: float | None) -> float:
    return float("nan") if v is None else v


PART = {"norm2": "log norm2", "kappa": "log kappa", "mean_s2": "log s2"}


def reading(r: dict[str, Any]) -> str:
    """One paragraph from the numbers of ``r`` (no claims beyond them)."""
    f, e, ref, rk, sw = (r[k] for k in ("forces", "energy", "random_direction", "ranking", "sweep"))

    def per(d: dict[str, Any], key: str, fmt: str = "+.2f") -> str:
        return ", ".join(_f(d[p][key], fmt) for p in SETS)

    (lk, ek), r0 = (
        ([_n(d[p]["mean_log_kappa"]) for p in SETS] for d in (f, e)),
        _n(ref["mean_log_kappa"]),
    )
    side = (
        "below"
        if all(v < r0 for v in lk)
        else "above"
        if all(v > r0 for v in lk)
        else "on both sides of"
    )
    cmp = (
        "lower than"
        if all(map(float.__lt__, ek, lk))
        else "higher than"
        if all(map(float.__gt__, ek, lk))
        else "not all below or above"
    )
    post = r["posterior"]
    text = [
        (
            f"Sigma (uncalibrated) has eigenvalues from {post['sigma_eig_min']:.3g} to {post['sigma_eig_max']:.4g} "
            f"(1/lambda = {post['one_over_lambda']:.4g}); its 4 largest hold {post['trace_share_top4']:.0%} of tr Sigma "
            "= d s2."
        ),
        (
            f"Force rows (train, in-domain, OOD): mean log kappa {per(f, 'mean_log_kappa')}, {side} the {r0:+.2f} of "
            f"uniformly random directions under the same Sigma (mean kappa {per(f, 'mean_kappa', '.2g')} vs 1; kappa < 1 on "
            f"{per(f, 'frac_kappa_below_1', '.0%')} of rows vs {_f(ref['frac_kappa_below_1'], '.0%')}); rho_F "
            f"{per(f, 'rho')}; low-variance fraction {per(f, 'low_variance_fraction', '.2f')} vs 0.25. The energy "
            f"latents Phi: mean log kappa {per(e, 'mean_log_kappa')}, {cmp} the force rows' on every set."
        ),
    ]
    for step, name in (("train->test", "Train to in-domain"), ("test->ood", "In-domain to OOD")):
        d = r["decomposition"]["forces"][step]
        text.append(
            f"{name}: mean log V of the force rows {_f(d['log_u'], '+.2f')} = {_f(d['log_norm2'], '+.2f')} "
            f"(log norm2) {_f(d['log_kappa'], '+.2f')} (log kappa), the larger part {PART[d['dominant']]}."
        )
    text.append(
        "Frame scores (in-domain Spearman with the frame force error / partial given max |F_pred| / OOD "
        "AUROC): "
        + "; ".join(
            f"{SCORES[k]} " + " / ".join(_f(rk[k][c], ".2f") for c in RANK_KEYS) for k in rk
        )
        + "."
    )
    lo, hi = sw[0], sw[-1]
    ds, dk, dr, dv = (
        _n(hi[k]) - _n(lo[k])
        for k in ("log_mean_s2", "mean_log_kappa", "random_mean_log_kappa", "mean_log_V")
    )
    text.append(
        f"Sweep from {lo['fraction']:.0%} to {hi['fraction']:.0%} of the training frames (features fixed): "
        f"log s2 {ds:+.2f}, mean log kappa of the in-domain rows {dk:+.2f} (random directions {dr:+.2f}), "
        f"mean log V {dv:+.2f}; the larger part is "
        f"{'contraction (log s2)' if abs(ds) > abs(dk) else 'alignment (log kappa)'}. These use the stored "
        f"alpha_F^2; refitted on the validation rows at each fraction it goes from "
        f"{_f(lo['alpha2_forces_valid_refit'], '.4g')} to {_f(hi['alpha2_forces_valid_refit'], '.4g')} (log "
        f"{math.log(_n(hi['alpha2_forces_valid_refit']) / _n(lo['alpha2_forces_valid_refit'])):+.2f})."
    )
    return " ".join(text)


SET_COLS = (
    "mean_log_V",
    "median_log_V",
    "mean_log_norm2",
    "log_mean_s2",
    *KAPPA_KEYS,
    "rho",
    "low_variance_fraction",
    "n_rows",
)


def _cell(v: Any, col: str) -> str:
    if col in ("n_rows", "n_frames"):
        return str(v)
    return _f(
        v,
        ".4g"
        if "alpha" in col
        else ".3g"
        if col == "mean_kappa"
        else ".3f"
        if "frac" in col
        else "+.3f",
    )


def set_table(r: dict[str, Any]) -> list[str]:
    lines = ["| rows | set | " + " | ".join(SET_COLS) + " |", "|---" * (len(SET_COLS) + 2) + "|"]
    for kind, label in (("forces", "force rows g"), ("energy", "energy Phi")):
        lines += [
            f"| {label} | {NAMES[p]} | "
            + " | ".join(_cell(r[kind][p][c], c) for c in SET_COLS)
            + " |"
            for p in SETS
        ]
    ref = {
        **r["random_direction"],
        "low_variance_fraction": 0.25,
        "n_rows": r["random_direction"]["draws"],
    }
    return lines + [
        "| random direction | any | " + " | ".join(_cell(ref.get(c), c) for c in SET_COLS) + " |"
    ]


def markdown_section(result: dict[str, Any]) -> str:
    """A compact section (heading, the per-set table, the reading, a link) for another summary."""
    quick = ["", "QUICK smoke run (EMT Cu, not 3BPA)."] if result.get("quick") else []
    return "\n".join(
        [
            "## Force LPA on 3BPA",
            *quick,
            "",
            *set_table(result),
            "",
            reading(result),
            "",
            "Details: [force_lpa.md](force_lpa.md)",
            "",
        ]
    )


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
        *("| " + " | ".join(x) + " |" for x in rows),
    ]


def write_markdown(r: dict[str, Any]) -> str:
    p, rep = r["posterior"], r["reproduction"]
    sweep_cols = [
        "n_frames",
        "log_mean_s2",
        "mean_log_V",
        "mean_log_norm2",
        *KAPPA_KEYS[:2],
        "frac_kappa_below_1",
        "random_mean_log_kappa",
        "alpha2_forces_valid_refit",
    ]
    lines = [
        "# Force LPA on 3BPA: alignment of the force Jacobian rows with the last-layer posterior",
        "",
        *(["QUICK smoke run (EMT Cu, not 3BPA).", ""] if r["quick"] else []),
        (
            f"Checkpoint `{r['checkpoint']}`; frames {r['frames']}; sweep and reference seed {r['seed']}; split seed "
            f"{r['split_seed']}; started {r['started']}, finished {r['finished']}."
        ),
        "",
        (
            f"Posterior: {p['source']}: alpha_F^2 = {p['alpha2_forces']:.4g} for the force rows, alpha_E^2 = "
            f"{p['alpha2_energy']:.4g} for Phi (kappa, rho and the fractions do not depend on them); d = {p['latent_dim']}, "
            f"lambda = {p['lambda']:.4g} ({p['lambda_over_mean_eig']} x mean eig of the precision); Sigma's eigenvalues "
            f"(uncalibrated) {p['sigma_eig_min']:.3g} to {p['sigma_eig_max']:.4g}, the 4 largest "
            f"{p['trace_share_top4']:.1%} of its trace. Natural logs; V in "
            "(eV/A)^2 (force rows) or eV^2 (Phi). norm2 = ||g||^2, s2 = tr Sigma / d, kappa = g^T Sigma g / (norm2 s2), so "
            "mean log V = mean log norm2 + log s2 + mean log kappa = mean log U_perm + mean log kappa, U_perm = norm2 s2; rho: "
            "Spearman over Sigma's eigen-directions of (mean over rows of (v_k^T g)^2, lam_k); low-variance fraction: "
            f"mean over rows of the share of ||g||^2 on the {p['low_variance_directions']} smallest-lam directions. "
            f"Random direction: {r['random_direction']['draws']} uniformly random unit vectors under the same Sigma (the "
            "random-rotation reference; E kappa = 1 exactly, E log kappa <= 0 by Jensen). Rows with g = 0 are dropped."
        ),
        "",
        "## Per set",
        "",
        *set_table(r),
        "",
        "## Decomposition of the change of mean log V",
        "",
        *_table(
            [
                "rows",
                "step",
                "d mean log V",
                "d mean log norm2",
                "d log s2",
                "d mean log kappa",
                "larger part",
            ],
            [
                [
                    k,
                    s,
                    *(_f(d[c]) for c in ("log_u", "log_norm2", "log_mean_s2", "log_kappa")),
                    PART[d["dominant"]],
                ]
                for k, steps in r["decomposition"].items()
                for s, d in steps.items()
            ],
        ),
        "",
        "## Frame scores (in-domain test vs OOD)",
        "",
        (
            "Frame error: mean over atoms of |F_pred - F_true| of this (single) model, for every score, the committee's "
            "included; partial Spearman given the frame max |F_pred| "
            "(mlip_unc.uncertainty.diagnostics.frame_ranking). Baselines on the same frames: the frame max |F_pred| "
            "(its partial Spearman given itself is undefined: n/a), the mean distance to the "
            f"{r.get('baselines', {}).get('knn_k', KNN_K)} nearest training "
            "frames in the model's energy latents Phi and in the interatomic-distance descriptor "
            "(mlip_unc.uncertainty.density), and the max atom force std of the 5-member MAP committee of "
            "benchmarks/force_uncertainty.py ("
            + r.get("baselines", {}).get("committee", "")
            + ")."
            + (
                " " + r["baselines"]["committee_note"] + "."
                if "committee_note" in r.get("baselines", {})
                else ""
            )
        ),
        "",
        *_table(
            ["score", *RANK_KEYS],
            [[SCORES[k], *(_f(v[c], ".3f") for c in RANK_KEYS)] for k, v in r["ranking"].items()],
        ),
        "",
        "## Training-amount sweep (features fixed, in-domain test rows)",
        "",
        (
            f"Precision refitted on nested random subsets of the {r['frames']['train']} training frames (seed {r['seed']}) "
            "with the model's noises and lambda, Sigma times the stored alpha_F^2; random_mean_log_kappa: the "
            "random-direction value under that Sigma; alpha2_forces_valid_refit: alpha_F^2 refitted on the validation "
            "rows (for reference, not used)."
        ),
        "",
        *_table(
            ["fraction", *sweep_cols],
            [[f"{s['fraction']:.0%}", *(_cell(s[c], c) for c in sweep_cols)] for s in r["sweep"]],
        ),
        "",
        (
            f"Check at 100 %: refit vs the model's stored Sigma (both uncalibrated): relative Frobenius difference "
            f"{rep['rel_frobenius']:.2e}, trace ratio {rep['trace_ratio']:.6f}; |log V| difference on the in-domain test "
            f"rows median {rep['median_abs_log_V_diff_test_rows']:.2e}, max {rep['max_abs_log_V_diff_test_rows']:.2e}; "
            f"mean log kappa difference {rep['mean_log_kappa_diff_test_rows']:.2e}; refitted / stored alpha_F^2 "
            f"{rep['alpha2_forces_refit_over_stored']:.6f}."
        ),
        "",
        "## Reading",
        "",
        reading(r),
        "",
        "![force LPA](force_lpa.png)",
        "",
        f"Command: `{rerun_command(r['command'])}`",
        "",
    ]
    return "\n".join(lines)


def plot(r: dict[str, Any], kappas: dict[str, np.ndarray], path: Path) -> None:
    """log kappa histograms (force rows per set, random directions); the sweep's changes vs 100 %."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(1, 2)
    for (name, kappa), colour in zip(
        kappas.items(), ("k", "tab:grey", "tab:blue", "tab:orange"), strict=False
    ):
        ax.hist(
            np.log(kappa),
            bins=60,
            density=True,
            histtype="step",
            color=colour,
            label=name,
            ls="--" if name == "random direction" else "-",
        )
    ax.set(xlabel="log kappa", ylabel="density", title="force rows: alignment with Sigma")
    ax.legend(fontsize=8)
    x = [100 * s["fraction"] for s in r["sweep"]]
    for key, label in (
        ("mean_log_V", "mean log V"),
        ("log_mean_s2", "log s2"),
        ("mean_log_kappa", "mean log kappa"),
        ("random_mean_log_kappa", "random-direction log kappa"),
    ):
        bx.plot(
            x, [_n(s[key]) - _n(r["sweep"][-1][key]) for s in r["sweep"]], marker="o", label=label
        )
    bx.set(
        xlabel="training frames (%)", ylabel="change vs 100 %", title="sweep: in-domain test rows"
    )
    bx.legend(fontsize=8)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    atomic_write(path, lambda handle: handle.write(buf.getvalue()))
