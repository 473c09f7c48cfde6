"""Every plot writes a non-empty PNG."""

from __future__ import annotations

import numpy as np

from mlip_unc.uncertainty import plots

PNG_MAGIC = b"\x89PNG"


def _is_png(path) -> bool:
    return path.stat().st_size > 1000 and path.read_bytes()[:4] == PNG_MAGIC


def test_plots_write_pngs(tmp_path) -> None:
    rng = np.random.default_rng(0)
    y_pred, y_std = rng.normal(size=300), rng.uniform(0.2, 1.0, size=300)
    y_true = y_pred + y_std * rng.normal(size=300)
    paths = [
        plots.plot_calibration_curve(y_pred, y_std, y_true, tmp_path / "cal.png"),
        plots.plot_error_vs_std(y_pred, y_std, y_true, tmp_path / "sub" / "err.png"),
        plots.plot_std_vs_density(
            y_std, y_std + rng.normal(scale=0.1, size=300), tmp_path / "dens.png"
        ),
    ]
    table = [
        {
            "fraction": f,
            "label": lab,
            "mean_std": 1 / f + s,
            "mean_s": f + s,
            "mean_kappa": 1 - f / 2,
            "mean_norm2": 2.0,
        }
        for f in (0.1, 0.25, 0.5, 1.0)
        for lab in ("none", "agl")
        for s in (0.0, 0.05)
    ]
    paths.append(plots.plot_lpa_vs_fraction(table, tmp_path / "lpa.png"))
    assert all(_is_png(p) for p in paths)
