"""The latent-posterior alignment study: one trained model -> one flat record; records -> report.

As defined in docs/method.md sections 2 and 4-7 of this project (not the paper's code). The
study trains the Bayesian GIN property model (``bgnn``) on nested training fractions and
compares it with alignment-guided learning (``agl``) and the LPA-breaking interventions
(``isotropy``, ``anti``, ``rotation``), the latter also with the Bayesian last layer frozen
to the posterior of the ``bgnn`` run of the same seed and fraction (``<intervention>_frozen``),
so that only the latent geometry differs.

Data flow: :func:`variant_config` -> :func:`fit_property_model` (the project's ``Trainer``)
-> :func:`study_record` (a flat dict of floats, JSON-ready) -> :func:`aggregate`,
:func:`acceptance` and :func:`render_markdown` (pure functions of a list of records).

Units: predictive stds, RMSE and NLL are in target units; the LPA quantities
(``z^T S z``, ``||z||^2``, ``s``, ``kappa``, ``A``) are in the model's standardised units
(the head works on targets divided by the training std ``y_scale``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.models.property import StandardisedModel, build_model, predict_graphs
from mlip_unc.train.config import Intervention, Method, PropertyConfig
from mlip_unc.train.trainer import Trainer, TrainResult, freeze_posterior_from, target_statistics
from mlip_unc.uncertainty.alignment import alignment_index, lpa_summary, three_factor_split
from mlip_unc.uncertainty.calibration import regression_metrics
from mlip_unc.uncertainty.density import latent_knn_distance, structural_calibration, tanimoto_max_similarity

__all__ = [
    "VARIANTS",
    "INTERVENTIONS",
    "VariantSpec",
    "RECORD_KEYS",
    "variant_config",
    "fit_property_model",
    "study_record",
    "aggregate",
    "acceptance",
    "render_markdown",
]


# ====================================================================== variants
@dataclass(frozen=True)
class VariantSpec:
    """How one study variant differs from the plain ``bgnn`` configuration."""

    method: Method
    intervention: Intervention | None = None
    frozen: bool = False
    """Train with the Bayesian last layer frozen to the ``bgnn`` posterior (same seed, fraction)."""


INTERVENTIONS: tuple[str, ...] = ("isotropy", "anti", "rotation")
VARIANTS: dict[str, VariantSpec] = {
    "bgnn": VariantSpec(Method.BGNN),
    "agl": VariantSpec(Method.AGL),
    **{iv: VariantSpec(Method.BGNN, Intervention(iv)) for iv in INTERVENTIONS},
    **{f"{iv}_frozen": VariantSpec(Method.BGNN, Intervention(iv), frozen=True) for iv in INTERVENTIONS},
}
"""Study variants by name; ``<intervention>_frozen`` needs the ``bgnn`` model of its seed and fraction."""


def variant_config(base: PropertyConfig, variant: str, seed: int) -> PropertyConfig:
    """``base`` with the method, intervention and seed of ``variant`` (see :data:`VARIANTS`).

    ``agl`` keeps ``base``'s AGL form when ``base.train.regularizer`` is an ``agl_*`` term
    (otherwise the config's default, the mean form).
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {list(VARIANTS)}")
    spec = VARIANTS[variant]
    reg = base.train.regularizer if spec.method is Method.AGL and base.train.regularizer.startswith("agl_") else "none"
    train = replace(base.train, seed=seed, regularizer=reg, intervention=spec.intervention)
    model = replace(base.model, method=spec.method)
    return PropertyConfig(model=model, train=train)


def fit_property_model(
    config: PropertyConfig,
    train: Sequence[Data],
    val: Sequence[Data],
    *,
    freeze_posterior: str | Path | None = None,
    keep: str = "last",
) -> tuple[StandardisedModel, TrainResult]:
    """Build and train a property model in memory with the project's ``Trainer``.

    The same steps as ``mlip_unc.train.trainer.train_property_model`` (seed, target
    standardisation on ``train``, ``build_model``, optional ``freeze_posterior_from``,
    ``Trainer.fit``) without writing files, and with the choice of the returned weights:
    ``keep="last"`` (the final epoch: a fixed training budget, so the AGL and intervention
    terms, which start after a warm-up, are in effect) or ``"best"`` (the trainer's best
    validation epoch).
    """
    if keep not in ("last", "best"):
        raise ValueError(f"keep must be 'last' or 'best', got {keep!r}")
    n_targets = int(train[0][keys.TARGET].shape[-1])
    torch.manual_seed(config.train.seed)
    mean, std = target_statistics(train)
    model = build_model(config, n_targets=n_targets, y_mean=mean, y_std=std)
    if freeze_posterior is not None:
        freeze_posterior_from(model, freeze_posterior)
    last: dict[str, Any] = {}

    def remember_last(epoch: int, record: dict[str, Any]) -> None:
        if epoch + 1 == config.train.epochs:
            last["state"] = copy.deepcopy(model.state_dict())

    result = Trainer(model, config).fit(train, val, callbacks=[remember_last] if keep == "last" else ())
    if keep == "last" and "state" in last:  # absent after an early stop: the best epoch is kept
        model.load_state_dict(last["state"])
    return model.eval(), result


# ====================================================================== one record
RECORD_KEYS: tuple[str, ...] = (
    # accuracy and calibration (target units, total predictive std)
    "rmse", "mae", "nll", "spearman", "miscalibration_area", "ence", "coverage_95", "crps", "sharpness",
    "mean_std", "mean_epistemic_std", "mean_aleatoric_std",
    # posterior and LPA (standardised units)
    "kl", "kl_per_n", "mean_u", "mean_norm2", "mean_s2", "mean_s", "mean_kappa", "median_alignment",
    "n_alignment", "rho_lpa", "low_variance_fraction", "effective_rank",
    "mean_log_norm2", "log_mean_s2", "mean_log_kappa", "log_y_scale2", "y_scale",
    # structural calibration
    "struct_cal_knn", "struct_cal_tanimoto",
)  # fmt: skip
"""Numeric keys of :func:`study_record` (besides ``n_train``, ``n_test``)."""


def _targets(graphs: Sequence[Data]) -> np.ndarray:
    return torch.cat([g[keys.TARGET] for g in graphs]).double().numpy()[:, 0]


def _mean_logs(z: torch.Tensor, s2: torch.Tensor) -> dict[str, float]:
    """Per-point means of the logs of the three-factor split (points with z = 0 dropped)."""
    split = three_factor_split(z, s2)
    ok = (split.norm2 > 0) & torch.isfinite(split.kappa) & (split.kappa > 0)
    return {
        "mean_log_norm2": float(split.norm2[ok].log().mean()),
        "log_mean_s2": math.log(float(split.mean_s2)),
        "mean_log_kappa": float(split.kappa[ok].log().mean()),
    }


@torch.no_grad()
def study_record(
    model: StandardisedModel,
    train: Sequence[Data],
    test: Sequence[Data],
    *,
    min_abs_mean_rel: float = 0.1,
    knn_k: int = 10,
    keep_points: bool = False,
) -> dict[str, Any]:
    """Everything the study reports about one trained model with a Bayesian last layer.

    Keys (see :data:`RECORD_KEYS`): ``regression_metrics`` of the test set (total std),
    ``mean_std`` / ``mean_epistemic_std`` / ``mean_aleatoric_std``; ``kl`` (KL(q||p) of the
    head) and ``kl_per_n`` (divided by ``n_train``, the ELBO's term); ``lpa_summary`` of the
    test latents against the head's posterior (``median_alignment`` over the ``n_alignment``
    points with ``|m| > alignment_threshold``, ``m = mu^T z``, the threshold being
    ``min_abs_mean_rel`` times the root mean square of ``m`` over the test set);
    ``mean_log_norm2``, ``log_mean_s2``, ``mean_log_kappa`` and ``log_y_scale2`` (their sum is
    the mean log of the latent part of the epistemic variance in target units);
    ``struct_cal_knn`` = Spearman(epistemic std, latent kNN distance to the training latents,
    ``k = min(knn_k, n_train)``) and ``struct_cal_tanimoto`` = Spearman(epistemic std, 1 - max
    Morgan-Tanimoto similarity to the training molecules); positive = the std grows where the
    training data are sparse. With ``keep_points`` the per-point test arrays are added under
    ``points``.
    """
    head = model.bayes_head
    if head is None:
        raise ValueError("the study needs a model with a Bayesian last layer (bgnn/agl)")
    if head.weight_mu.shape[0] != 1:
        raise ValueError("the study handles one target")
    out = predict_graphs(model, test, latent=True)
    z_train = predict_graphs(model, train, latent=True)[keys.LATENT]
    z = out[keys.LATENT].double()
    mu, s2 = head.weight_mu[0].detach().double(), head.weight_var[0].detach().double()
    y = _targets(test)
    mean = out[keys.PREDICTION].double().numpy()[:, 0]
    std = out[keys.PREDICTION_VAR].double().clamp_min(0).sqrt().numpy()[:, 0]
    epi = out[keys.EPISTEMIC_VAR].double().clamp_min(0).sqrt().numpy()[:, 0]
    alea = out[keys.ALEATORIC_VAR].double().clamp_min(0).sqrt().numpy()[:, 0]

    rec: dict[str, Any] = {"n_train": len(train), "n_test": len(test)}
    rec.update(regression_metrics(mean, std, y, nan_policy="omit"))
    rec.update(mean_std=float(std.mean()), mean_epistemic_std=float(epi.mean()), mean_aleatoric_std=float(alea.mean()))
    kl = float(model.kl())
    rec.update(kl=kl, kl_per_n=kl / len(train))
    m = z @ mu  # (n_test,)
    threshold = min_abs_mean_rel * float(m.pow(2).mean().sqrt())
    rec.update(lpa_summary(z, mu, s2, min_abs_mean=threshold))
    rec["n_alignment"] = int(torch.isfinite(alignment_index(z, mu, s2, threshold)).sum())
    rec["alignment_threshold"] = threshold
    rec.update(_mean_logs(z, s2))
    y_scale = float(model.y_std[0])
    rec.update(y_scale=y_scale, log_y_scale2=2.0 * math.log(y_scale))

    knn = latent_knn_distance(z, z_train.double(), k=min(knn_k, len(train)))
    tanimoto = tanimoto_max_similarity([g[keys.SMILES] for g in test], [g[keys.SMILES] for g in train])
    rec["struct_cal_knn"] = structural_calibration(epi, knn)
    rec["struct_cal_tanimoto"] = structural_calibration(epi, 1.0 - tanimoto)
    if keep_points:
        rec["points"] = {
            "y_true": y.tolist(), "mean": mean.tolist(), "std": std.tolist(), "epistemic_std": epi.tolist(),
            "knn_distance": knn.tolist(), "one_minus_tanimoto": (1.0 - tanimoto).tolist(),
        }  # fmt: skip
    return rec


# ====================================================================== aggregation
Records = Sequence[Mapping[str, Any]]
Cell = tuple[str, float]  # (variant, fraction in %)


def _finite(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


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
    for (fraction, variant), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], order.get(kv[0][1], 99))):
        row: dict[str, Any] = {"fraction": fraction, "variant": variant, "seeds": sorted(int(r["seed"]) for r in rs)}
        for m in metrics:
            row[m], row[f"{m}_std"] = _mean_std(_finite(r.get(m) for r in rs))
        rows.append(row)
    return rows


def _compare(records: Records, a: Cell, b: Cell, metrics: Sequence[str]) -> tuple[list[int], dict[str, tuple]]:
    """Common seeds of two cells and, per metric, ``(mean over a, mean over b)`` on those seeds."""

    def cell(c: Cell) -> dict[int, Mapping[str, Any]]:
        return {int(r["seed"]): r for r in records if r["variant"] == c[0] and float(r["fraction"]) == c[1]}

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
        missing = f"1. Figure-1 reproduction: not available (no bgnn seed at both {lo:g} and {hi:g} %)."
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
        + (f", optimizer steps {_pair(v, 'n_steps', '.0f', arrow=True)}" if math.isfinite(v["n_steps"][0]) else "")
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
    how = "posterior frozen from the bgnn run of the same seed and fraction" if frozen else "as trained"
    change = {k: _pct(v[k][1], v[k][0]) for k in ("mean_epistemic_std", "mean_std", "mean_s")}
    line = (
        f"{variant} ({how}, {hi:g} %, seeds {seeds}): RMSE {_pair(v, 'rmse')} (bgnn) "
        f"(within {100 * tol:g} %: {_yes(rmse_ok)}); epistemic std {_pair(v, 'mean_epistemic_std')} "
        f"({change['mean_epistemic_std']}, raised: {_yes(epi_up)}); total std {_pair(v, 'mean_std')} "
        f"({change['mean_std']}, raised: {_yes(tot_up)}); mean s {_pair(v, 'mean_s')} ({change['mean_s']}); "
        f"kappa {_pair(v, 'mean_kappa', '.3g')}. "
        f"**Raises the epistemic std at RMSE within {100 * tol:g} %: {_yes(rmse_ok and epi_up)}.**"
    )
    out = {"variant": variant, "rmse_ok": rmse_ok, "epistemic_raised": epi_up, "total_raised": tot_up}
    return {**out, "verdict": rmse_ok and epi_up, "seeds": seeds, "values": v, "line": line}


def _agl(records: Records, hi: float, tol: float) -> dict[str, Any]:
    keys_ = ("rmse", "mean_epistemic_std", "mean_std", "struct_cal_knn", "struct_cal_tanimoto",
             "mean_kappa", "mean_norm2", "effective_rank")  # fmt: skip
    seeds, v = _compare(records, ("bgnn", hi), ("agl", hi), keys_)
    if not seeds:
        return {"available": False, "line": f"3. AGL: not available (no bgnn and agl seed in common at {hi:g} %)."}
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
    out = {"available": True, "rmse_ok": rmse_ok, "epistemic_lower": epi_low, "total_lower": tot_low}
    return {**out, "knn_ok": knn_ok, "tanimoto_ok": tan_ok, "verdict": verdict, "seeds": seeds, "values": v,
            "line": line}  # fmt: skip


_LOG_PARTS = {"mean_log_norm2": "||z||^2", "log_mean_s2": "mean s^2", "mean_log_kappa": "kappa",
              "log_y_scale2": "target scale^2"}  # fmt: skip


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
    return {"deltas": d, "delta_log_u": sum(d.values()), "dominant": dominant, "seeds": seeds, "text": text}


def acceptance(records: Records, *, rmse_tol_intervention: float = 0.10, rmse_tol_agl: float = 0.05) -> dict[str, Any]:
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
    out: dict[str, Any] = {"fraction_low": lo, "fraction_high": hi, "figure1": _figure1(records, lo, hi)}
    names = [v for iv in INTERVENTIONS for v in (iv, f"{iv}_frozen")]
    out["interventions"] = [x for x in (_intervention(records, v, hi, rmse_tol_intervention) for v in names) if x]
    out["agl"] = _agl(records, hi, rmse_tol_agl)
    out["decomposition"] = {
        "bgnn_fraction": _decomposition(records, ("bgnn", lo), ("bgnn", hi)),
        "bgnn_agl": _decomposition(records, ("bgnn", hi), ("agl", hi)),
    }
    lines = [out["figure1"]["line"]]
    if out["interventions"]:
        lines.append(f"2. Interventions vs bgnn at {hi:g} % (as trained, with the mean posterior s beside it; and "
                     "trained with the posterior frozen from bgnn, so that only the latent geometry differs):")
        lines += [f"   - {x['line']}" for x in out["interventions"]]
    else:
        lines.append(f"2. Interventions: not available (no intervention run paired with bgnn at {hi:g} %).")
    lines.append(out["agl"]["line"])
    dec = [x["text"] for x in out["decomposition"].values() if x]
    lines.append("4. Log-variance decomposition of the latent part U = z^T S z of the epistemic variance "
                 "(target units): " + ("; ".join(dec) if dec else "not available") + ".")
    out["lines"] = lines
    return out


# ====================================================================== markdown
TABLES: dict[str, tuple[str, ...]] = {
    "Accuracy and uncertainty (test set, target units)": (
        "rmse", "nll", "mean_epistemic_std", "mean_std", "miscalibration_area", "spearman", "coverage_95"),
    "Posterior and latent-posterior alignment (standardised units)": (
        "mean_s", "kl", "mean_kappa", "median_alignment", "rho_lpa", "mean_norm2", "effective_rank"),
    "Structural calibration (Spearman of the epistemic std with a sparsity proxy; positive is good)": (
        "struct_cal_knn", "struct_cal_tanimoto"),
}  # fmt: skip


def _cell(mean: float, std: float, n: int) -> str:
    if not math.isfinite(mean):
        return "-"
    return f"{mean:.3g} ± {std:.2g}" if n > 1 and math.isfinite(std) else f"{mean:.3g}"


def render_markdown(records: Records, *, command: str, seeds: Sequence[int], header: Sequence[str] = ()) -> str:
    """The study report: command and seeds, the acceptance lines, per (fraction, variant) tables."""
    rows = aggregate(records)
    parts = ["# Latent-posterior alignment study", "", "```", command, "```", "", f"Seeds: {list(seeds)}.", *header, ""]
    parts += ["## Acceptance lines (computed from the records)", "", *acceptance(records)["lines"], ""]
    for title, metrics in TABLES.items():
        parts += [f"## {title}", "", "Mean ± sample std over seeds (the mean alone for one seed).", ""]
        parts.append("| fraction % | variant | seeds | " + " | ".join(metrics) + " |")
        parts.append("|---" * (len(metrics) + 3) + "|")
        for row in rows:
            cells = [_cell(row[m], row[f"{m}_std"], len(row["seeds"])) for m in metrics]
            first = f"| {row['fraction']:g} | {row['variant']} | {len(row['seeds'])} | "
            parts.append(first + " | ".join(cells) + " |")
        parts.append("")
    return "\n".join(parts)
