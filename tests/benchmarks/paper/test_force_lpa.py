"""benchmarks/paper/force_lpa.py: kappa and its companions on constructed posteriors (fast), and the --quick
run's output from the command line (a subprocess, < 1 min: a tiny EMT Cu model trained on the spot)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.paper import force_lpa as bench
from benchmarks.paper import force_lpa_page as page

ROOT = Path(__file__).resolve().parents[3]


def _posterior(lam: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A factor ``L`` of ``Sigma = Q diag(lam) Q^T`` (random orthogonal Q) and Q."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(
        torch.randn(lam.shape[0], lam.shape[0], generator=gen, dtype=torch.float64)
    )
    return lam.sqrt()[:, None] * q.T, q


def test_kappa_of_eigenvectors_and_of_an_isotropic_posterior():
    lam = torch.tensor([5.0, 3.0, 2.0, 1.0, 0.5, 0.25, 0.1, 0.01], dtype=torch.float64)
    factor, q = _posterior(lam)
    s2 = float(lam.mean())
    rows = torch.stack(
        [3.0 * q[:, -1], 0.5 * q[:, 0]]
    )  # smallest- and largest-variance eigenvectors
    stats = bench.row_stats(rows, factor, 2.0)
    assert stats["kappa"][0] == pytest.approx(0.01 / s2, rel=1e-10)  # kappa = lam_min / s2
    assert stats["kappa"][1] == pytest.approx(5.0 / s2, rel=1e-10)
    assert stats["V"][0] == pytest.approx(2.0 * 9.0 * 0.01, rel=1e-10)  # alpha2 g^T Sigma g
    assert stats["summary"]["log_mean_s2"] == pytest.approx(math.log(2.0 * s2))
    on_low = bench.row_stats(torch.stack([q[:, -1], q[:, -2] + q[:, -1]]), factor, 1.0)["summary"]
    assert on_low["low_variance_fraction"] == pytest.approx(1.0)  # both on the d/4 = 2 smallest
    g = torch.randn(50, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    iso = bench.row_stats(g, _posterior(torch.full((8,), 0.3, dtype=torch.float64))[0], 7.0)
    assert iso["kappa"] == pytest.approx(
        [1.0] * 50, rel=1e-10
    )  # Sigma proportional to I: kappa = 1
    s = bench.row_stats(g, factor, 3.0)["summary"]
    assert s["mean_log_V"] == pytest.approx(
        s["mean_log_norm2"] + s["log_mean_s2"] + s["mean_log_kappa"], abs=1e-12
    )


def test_random_directions_have_mean_kappa_one():
    """Monte Carlo of the closed form E kappa = 1 under a random rotation (and E log kappa < 0)."""
    factor, _ = _posterior(torch.logspace(-3, 1, 16, dtype=torch.float64))
    ref = bench.random_directions(factor, seed=0)
    assert ref["mean_kappa"] == pytest.approx(1.0, abs=0.02)
    assert ref["mean_log_kappa"] < -0.1 and 0 < ref["frac_kappa_below_1"] < 1


def test_sigma_factor_is_the_inverse_of_the_regularised_precision():
    gen = torch.Generator().manual_seed(2)
    frames = [
        {
            "jac": torch.randn(6, 4, 3, generator=gen, dtype=torch.float64),
            "phi": torch.randn(6, generator=gen, dtype=torch.float64),
            "n_atoms": 4,
        }
        for _ in range(3)
    ]
    factor = bench.sigma_factor(frames, (0.1, 0.5), 0.3)
    expected = torch.linalg.inv(
        bench.precision(frames, (0.1, 0.5), 1.0) + 0.3 * torch.eye(6, dtype=torch.float64)
    )
    assert torch.allclose(factor.T @ factor, expected, rtol=1e-9, atol=1e-12)


@pytest.fixture(scope="module")
def quick(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("force_lpa")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.paper.force_lpa", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def test_quick_run_output(quick):
    r = json.loads((quick / "force_lpa.json").read_text())
    assert {
        "command",
        "seed",
        "checkpoint",
        "frames",
        "started",
        "finished",
        "posterior",
        "random_direction",
        "forces",
        "energy",
        "decomposition",
        "ranking",
        "sweep",
        "reproduction",
    } <= set(r)
    assert (
        r["command"].startswith("python -m benchmarks.paper.force_lpa --quick")
        and r["frames"]["test"] == 6
    )
    for kind in ("forces", "energy"):
        for part in ("train", "test", "ood"):
            s = r[kind][part]
            assert s["mean_kappa"] > 0 and all(
                math.isfinite(s[k]) for k in ("mean_log_kappa", "median_log_kappa")
            )
            assert s["mean_log_V"] == pytest.approx(
                s["mean_log_norm2"] + s["log_mean_s2"] + s["mean_log_kappa"], abs=1e-9
            )
            assert (
                0 <= s["frac_kappa_below_1"] <= 1
                and 0 <= s["low_variance_fraction"] <= 1
                and -1 <= s["rho"] <= 1
            )
        for step in r["decomposition"][kind].values():
            assert step["log_u"] == pytest.approx(
                step["log_norm2"] + step["log_mean_s2"] + step["log_kappa"], abs=1e-9
            )
            assert step["log_mean_s2"] == pytest.approx(
                0.0, abs=1e-12
            )  # one posterior for all sets
    sweep = r["sweep"]
    assert [s["fraction"] for s in sweep] == [0.1, 0.25, 0.5, 0.75, 1.0]
    assert all(
        s["mean_log_norm2"] == pytest.approx(sweep[0]["mean_log_norm2"], abs=1e-9) for s in sweep
    )  # same features
    assert sweep[-1]["mean_log_kappa"] == pytest.approx(
        r["forces"]["test"]["mean_log_kappa"], abs=1e-8
    )
    assert r["reproduction"]["rel_frobenius"] < 1e-6 and r["reproduction"][
        "alpha2_forces_refit_over_stored"
    ] == pytest.approx(1.0, rel=1e-4)
    assert set(r["ranking"]) == {
        "max_atom_std",
        "mean_log_kappa",
        "mean_log_norm2",
        "force",
        "latent_knn",
        "descriptor_knn",
    }  # no committee in --quick: said so, not left blank
    assert (
        "no committee" in r["baselines"]["committee_note"]
        and "no committee" in (quick / "force_lpa.md").read_text()
    )
    assert (
        r["ranking"]["force"]["partial_spearman_given_force"] is None
    )  # |F_pred| given itself: undefined
    assert not Path(r["checkpoint"]).is_absolute() or not str(r["checkpoint"]).startswith(str(ROOT))
    section = page.markdown_section(r)
    md = (quick / "force_lpa.md").read_text()
    assert section.startswith("## Force LPA on 3BPA") and "[force_lpa.md](force_lpa.md)" in section
    table = [line for line in section.splitlines() if line.startswith("| force rows g")]
    assert len(table) == 3 and all(
        line in md for line in table
    )  # the md and the section: the same numbers
    assert page.reading(r) in md and (quick / "force_lpa.png").stat().st_size > 0
