"""The property model's default likelihood, read off the molecular table (issue 14.2).

``bgnn`` (homoscedastic noise: one learned sigma_n) against ``bgnn_hetero`` (sigma_n(x) from the
latent) on every (dataset, split) where both were run: recalibrated NLL and miscalibration area
(the uncertainty a user gets), raw Spearman(sigma, |error|) (does sigma rank the errors? a
recalibration factor leaves it unchanged) and RMSE (the price, if any). Each cell compares the
means over seeds; a tie (equal to the shown digits) counts for neither.
"""

from __future__ import annotations

from typing import Any

HOMO, HETERO = "bgnn", "bgnn_hetero"
# (metric, variant, better): the columns the choice is made on
CRITERIA: tuple[tuple[str, str, str], ...] = (
    ("nll", "recal", "lower"),
    ("miscalibration_area", "recal", "lower"),
    ("spearman", "raw", "higher"),
    ("rmse", "raw", "lower"),
)


def compare(rows: list[dict[str, Any]], homo: str = HOMO, hetero: str = HETERO) -> dict[str, Any]:
    """Per (dataset, split) the two means and the winner of each criterion; totals per criterion.

    Args:
        rows: the aggregated rows of ``molecular.json`` (``dataset, split, method, n`` and
            ``{variant: {metric: {"mean": ...}}}``).

    Returns:
        ``{"cells": [{dataset, split, n: [n_homo, n_hetero], metric: {homo, hetero, winner}}],
        "wins": {metric: {homo: k, hetero: k, "of": n_cells}}}``.
    """
    others = {(r["dataset"], r["split"]): r for r in rows if r["method"] == hetero}
    cells, wins = [], {m: {homo: 0, hetero: 0, "of": 0} for m, _, _ in CRITERIA}
    for a in (r for r in rows if r["method"] == homo and (r["dataset"], r["split"]) in others):
        b = others[a["dataset"], a["split"]]
        cell: dict[str, Any] = {"dataset": a["dataset"], "split": a["split"], "n": [a["n"], b["n"]]}
        for metric, variant, better in CRITERIA:
            x, y = a[variant][metric]["mean"], b[variant][metric]["mean"]
            if x is None or y is None:
                continue
            sign = 1.0 if better == "lower" else -1.0
            winner = (
                None if round(x, 3) == round(y, 3) else (homo if sign * (x - y) < 0 else hetero)
            )
            cell[metric] = {homo: x, hetero: y, "winner": winner}
            wins[metric]["of"] += 1
            if winner:
                wins[metric][winner] += 1
        cells.append(cell)
    return {"homo": homo, "hetero": hetero, "cells": cells, "wins": wins}


def render(result: dict[str, Any], default: str) -> list[str]:
    """Markdown lines: the totals, the package default, and one table row per cell."""
    homo, hetero, wins = result["homo"], result["hetero"], result["wins"]
    if not result["cells"]:
        return [f"No (dataset, split) with both {homo} and {hetero} recorded yet."]
    total = "; ".join(
        f"{m} ({v}, {b}): {hetero} better in {wins[m][hetero]}, {homo} in {wins[m][homo]} "
        f"of {wins[m]['of']}"
        for m, v, b in CRITERIA
    )
    lines = [
        f"{hetero} (heteroscedastic) vs {homo} (homoscedastic), means over seeds per (dataset, split): {total}.",
        "",
        f"`mlip-unc property train` (method bgnn) uses the likelihood of the **{default}** row.",
        "",
        "| dataset | split | n | "
        + " | ".join(f"{m} ({v}) {homo} / {hetero}" for m, v, _ in CRITERIA)
        + " |",
        "|---|---|---|" + "---|" * len(CRITERIA),
    ]
    for c in result["cells"]:
        parts = []
        for m, _, _ in CRITERIA:
            if m not in c:
                parts.append("n/a")
                continue
            x, y, w = c[m][homo], c[m][hetero], c[m]["winner"]
            parts.append(
                f"{'**' if w == homo else ''}{x:.3f}{'**' if w == homo else ''} / "
                f"{'**' if w == hetero else ''}{y:.3f}{'**' if w == hetero else ''}"
            )
        lines.append(
            f"| {c['dataset']} | {c['split']} | {c['n'][0]} / {c['n'][1]} | "
            + " | ".join(parts)
            + " |"
        )
    return lines
