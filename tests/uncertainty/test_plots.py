"""Every plot shows the data it is given: the figure is read back (lines, scatter points, labels,
titles) as it is saved, then the PNG is checked to be written. A plot of the wrong data (axes
swapped, values unfiltered, another mean) fails here."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from mlip_unc.uncertainty import plots
from mlip_unc.uncertainty.calibration import calibration_curve, miscalibration_area

PNG_MAGIC = b"\x89PNG"


@pytest.fixture()
def figures(monkeypatch) -> list:
    """The figures the plot functions save (the file is still written)."""
    saved: list = []
    original = plots._save

    def capture(fig, out_path, dpi):
        saved.append(fig)
        path = original(fig, out_path, dpi)
        assert path.read_bytes()[:4] == PNG_MAGIC and path.stat().st_size > 1000
        return path

    monkeypatch.setattr(plots, "_save", capture)
    return saved


@pytest.fixture()
def data():
    rng = np.random.default_rng(0)
    y_pred, y_std = rng.normal(size=300), rng.uniform(0.2, 1.0, size=300)
    y_true = y_pred + y_std * rng.normal(size=300)
    return y_pred, y_std, y_true


def test_calibration_curve_shows_observed_against_expected(tmp_path, figures, data):
    y_pred, y_std, y_true = data
    path = plots.plot_calibration_curve(y_pred, y_std, y_true, tmp_path / "cal.png", label="gin")
    assert path == tmp_path / "cal.png"
    (ax,) = figures[0].axes
    ideal, curve = ax.get_lines()
    assert np.array_equal(ideal.get_xdata(), [0, 1]) and np.array_equal(ideal.get_ydata(), [0, 1])
    expected, observed = calibration_curve(y_pred, y_std, y_true, 100)
    assert np.allclose(curve.get_xdata(), expected) and np.allclose(curve.get_ydata(), observed)
    area = miscalibration_area(y_pred, y_std, y_true, 100)
    assert curve.get_label() == f"gin (area {area:.3f})"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["ideal", curve.get_label()]
    assert ax.get_xlabel() == "expected proportion in interval"
    assert ax.get_ylabel() == "observed proportion"


def test_error_vs_std_scatters_error_against_std_without_invalid_points(tmp_path, figures, data):
    y_pred, y_std, y_true = data
    y_std = y_std.copy()
    y_std[:3] = [np.nan, 0.0, np.inf]  # not drawable on log axes: left out
    plots.plot_error_vs_std(y_pred, y_std, y_true, tmp_path / "sub" / "err.png")
    (ax,) = figures[0].axes
    points = ax.collections[0].get_offsets()
    err = np.abs(y_pred - y_true)
    assert np.allclose(points[:, 0], y_std[3:]) and np.allclose(points[:, 1], err[3:])
    (reference,) = ax.get_lines()
    lo, hi = min(y_std[3:].min(), err[3:].min()), max(y_std[3:].max(), err[3:].max())
    assert np.allclose(reference.get_xdata(), [lo, hi])
    assert np.allclose(reference.get_ydata(), [lo, hi])
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("predicted std", "|error|")


def test_std_vs_density_scatters_std_against_the_proxy_with_its_spearman(tmp_path, figures):
    rng = np.random.default_rng(1)
    std = rng.uniform(0.1, 1.0, size=200)
    proxy = std + rng.normal(scale=0.3, size=200)
    plots.plot_std_vs_density(std, proxy, tmp_path / "dens.png", proxy_label="kNN distance")
    (ax,) = figures[0].axes
    points = ax.collections[0].get_offsets()
    assert np.allclose(points[:, 0], proxy) and np.allclose(points[:, 1], std)
    rho = spearmanr(std, proxy).statistic
    assert 0.3 < rho < 0.95  # a proxy that neither ignores nor copies the std
    assert ax.get_title() == f"Spearman = {rho:.3f}"
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("kNN distance", "predicted std")


def test_lpa_vs_fraction_draws_the_seed_mean_and_spread_per_group(tmp_path, figures):
    fractions = (0.1, 0.25, 0.5, 1.0)
    offsets = {"none": 0.0, "agl": 1.0}
    table = [
        {
            "fraction": f,
            "label": label,
            "mean_std": 1 / f + offsets[label] + s,
            "mean_s": f + offsets[label] + s,
            "mean_kappa": 1 - f / 2 + s,
            "mean_norm2": 2.0 + offsets[label],
        }
        for f in fractions
        for label in offsets
        for s in (0.0, 0.05)  # two seeds: mean +0.025, std 0.025
    ]
    table.append({"fraction": 0.5, "label": "none", "mean_std": float("nan")})  # skipped
    plots.plot_lpa_vs_fraction(table, tmp_path / "lpa.png")
    axes = figures[0].axes
    assert [ax.get_title() for ax in axes] == list(plots.LPA_PANELS)
    x = np.array(fractions)
    expected = {
        "mean_std": lambda label: 1 / x + offsets[label] + 0.025,
        "mean_s": lambda label: x + offsets[label] + 0.025,
        "mean_kappa": lambda label: 1 - x / 2 + 0.025,
        "mean_norm2": lambda label: np.full(4, 2.0 + offsets[label]),
    }
    for ax, key in zip(axes, plots.LPA_PANELS.values(), strict=True):
        assert ax.get_xlabel() == "training fraction"
        bars = ax.containers
        assert [c.get_label() for c in bars] == list(offsets)
        for container, label in zip(bars, offsets, strict=True):
            line = container.lines[0]
            assert np.allclose(line.get_xdata(), x), key
            assert np.allclose(line.get_ydata(), expected[key](label)), (key, label)
            seeds_differ = key != "mean_norm2"
            (segments,) = container.lines[2]
            half = np.array([abs(s[1, 1] - s[0, 1]) / 2 for s in segments.get_segments()])
            assert np.allclose(half, 0.025 if seeds_differ else 0.0), (key, label)
    assert [t.get_text() for t in axes[0].get_legend().get_texts()] == list(offsets)
