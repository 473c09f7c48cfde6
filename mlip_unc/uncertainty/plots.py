"""Diagnostic plots of calibration, density and LPA.

Each function builds a ``matplotlib.figure.Figure`` directly (no pyplot, no global state,
rendered with the Agg canvas), writes a PNG to ``out_path`` (parent folders are created) and
returns the path. matplotlib is imported inside the functions.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlip_unc.uncertainty.calibration import (
    ArrayLike,
    as_numpy,
    calibration_curve,
    miscalibration_area,
)

__all__ = [
    "plot_calibration_curve",
    "plot_error_vs_std",
    "plot_std_vs_density",
    "plot_lpa_vs_fraction",
    "LPA_PANELS",
]

LPA_PANELS: dict[str, str] = {
    "mean predictive std": "mean_std",
    "mean posterior s": "mean_s",
    "kappa": "mean_kappa",
    "norm2": "mean_norm2",
}
"""Default panels of :func:`plot_lpa_vs_fraction`: title -> key in each table row."""


def _figure(ncols: int = 1, width: float = 4.0, height: float = 3.6) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, axes


def _save(fig: Any, out_path: str | Path, dpi: int) -> Path:
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def plot_calibration_curve(
    y_pred: ArrayLike,
    y_std: ArrayLike,
    y_true: ArrayLike,
    out_path: str | Path,
    *,
    n_levels: int = 100,
    label: str | None = None,
    dpi: int = 150,
) -> Path:
    """Observed vs expected proportion of centred Gaussian intervals, with the diagonal."""
    expected, observed = calibration_curve(y_pred, y_std, y_true, n_levels, nan_policy="omit")
    area = miscalibration_area(y_pred, y_std, y_true, n_levels, nan_policy="omit")
    fig, (ax,) = _figure()
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="ideal")
    ax.plot(expected, observed, lw=2, label=f"{label or 'model'} (area {area:.3f})")
    ax.fill_between(expected, expected, observed, alpha=0.2)
    ax.set(
        xlabel="expected proportion in interval",
        ylabel="observed proportion",
        xlim=(0, 1),
        ylim=(0, 1),
    )
    ax.set_aspect("equal")
    ax.legend(loc="upper left", fontsize=8)
    return _save(fig, out_path, dpi)


def plot_error_vs_std(
    y_pred: ArrayLike, y_std: ArrayLike, y_true: ArrayLike, out_path: str | Path, *, dpi: int = 150
) -> Path:
    """|error| vs predicted std, log-log scatter with the ``y = x`` reference line."""
    err = np.abs(as_numpy(y_pred) - as_numpy(y_true))
    std = as_numpy(y_std) * np.ones_like(err)
    ok = np.isfinite(err) & np.isfinite(std) & (err > 0) & (std > 0)
    err, std = err[ok], std[ok]
    fig, (ax,) = _figure()
    ax.scatter(std, err, s=6, alpha=0.5)
    if err.size:
        lo, hi = min(std.min(), err.min()), max(std.max(), err.max())
        ax.plot([lo, hi], [lo, hi], "k--", lw=1, label="|error| = std")
        ax.legend(loc="upper left", fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="predicted std", ylabel="|error|")
    return _save(fig, out_path, dpi)


def plot_std_vs_density(
    y_std: ArrayLike,
    density_proxy: ArrayLike,
    out_path: str | Path,
    *,
    proxy_label: str = "latent kNN distance",
    dpi: int = 150,
) -> Path:
    """Predicted std vs a density proxy (docs/method.md section 7 of this project), Spearman in the title."""
    from mlip_unc.uncertainty.density import structural_calibration

    std, proxy = as_numpy(y_std), as_numpy(density_proxy)
    rho = structural_calibration(std, proxy)
    fig, (ax,) = _figure()
    ax.scatter(proxy, std, s=6, alpha=0.5)
    ax.set(xlabel=proxy_label, ylabel="predicted std", title=f"Spearman = {rho:.3f}")
    return _save(fig, out_path, dpi)


def plot_lpa_vs_fraction(
    table: Sequence[Mapping[str, Any]],
    out_path: str | Path,
    *,
    panels: Mapping[str, str] | None = None,
    fraction_key: str = "fraction",
    group_key: str = "label",
    dpi: int = 150,
) -> Path:
    """LPA quantities against the training fraction, one panel per quantity.

    ``table`` rows are dicts with ``fraction_key`` (x axis), the keys of ``panels`` (default
    :data:`LPA_PANELS`: ``mean_std`` = mean predictive std, ``mean_s`` = mean posterior s,
    ``mean_kappa``, ``mean_norm2``, e.g. merged from ``lpa_summary`` and the metrics) and
    optionally ``group_key`` (one line per group, e.g. AGL variant). Several rows at the same
    fraction (seeds) are drawn as mean +- std. Missing or non-finite values are skipped.
    """
    panels = dict(LPA_PANELS if panels is None else panels)
    fig, axes = _figure(ncols=len(panels), width=3.4)
    groups: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in table:
        groups[str(row.get(group_key, ""))].append(row)
    for ax, (title, key) in zip(axes, panels.items(), strict=False):
        for name, rows in groups.items():
            by_frac: dict[float, list[float]] = defaultdict(list)
            for row in rows:
                v = row.get(key)
                if v is not None and np.isfinite(float(v)):
                    by_frac[float(row[fraction_key])].append(float(v))
            if not by_frac:
                continue
            xs = np.array(sorted(by_frac))
            means = np.array([np.mean(by_frac[x]) for x in xs])
            sds = np.array([np.std(by_frac[x]) for x in xs])
            ax.errorbar(xs, means, yerr=sds, marker="o", capsize=3, label=name or None)
        ax.set(xlabel="training fraction", title=title)
    if any(groups):  # some row had a non-empty group label
        axes[0].legend(fontsize=8)
    return _save(fig, out_path, dpi)
