"""Force-uncertainty diagnostics: known values, and cases a wrong formula would fail."""

import math

import numpy as np
import pytest
import torch

from mlip_unc.uncertainty import diagnostics as dg
from mlip_unc.uncertainty.calibration import spearman_corr

X = [1.0, 2.0, 3.0, 4.0, 5.0]
Y = [2.0, 1.0, 4.0, 3.0, 5.0]  # Spearman with X: 1 - 6*4/(5*24) = 0.8
Z = [1.0, 2.0, 3.0, 5.0, 4.0]  # with X: 0.9; with Y: 1 - 6*8/120 = 0.6


def test_spearman_known_value_and_nan_handling():
    assert spearman_corr(X, Y, nan_policy="omit") == pytest.approx(0.8)
    assert spearman_corr(X, [10.0, 20.0, 30.0, 40.0, 50.0], nan_policy="omit") == pytest.approx(1.0)
    # non-finite pairs are dropped, not propagated
    assert spearman_corr([*X, np.nan], [*Y, 1.0], nan_policy="omit") == pytest.approx(0.8)
    assert math.isnan(spearman_corr([1.0, 2.0], [1.0, 2.0], nan_policy="omit"))  # < 3 pairs
    assert math.isnan(
        spearman_corr([1.0, 1.0, 1.0], [1.0, 2.0, 3.0], nan_policy="omit")
    )  # constant


def test_atom_force_std_is_root_of_summed_variance():
    var = np.array([[1.0, 4.0, 4.0], [0.0, 0.0, 9.0]])
    # sqrt(1 + 4 + 4) = 3; not the sum of stds (5) nor the root mean variance (sqrt 3)
    np.testing.assert_allclose(dg.atom_force_std(var), [3.0, 3.0])
    np.testing.assert_allclose(dg.atom_force_std(torch.tensor(var)), [3.0, 3.0])
    np.testing.assert_allclose(dg.atom_force_norm([[3.0, 4.0, 0.0], [0.0, 0.0, -2.0]]), [5.0, 2.0])


def test_per_frame_max_and_mean():
    values = [1.0, 5.0, 2.0, 7.0, 3.0]
    frame = [0, 0, 1, 2, 2]
    np.testing.assert_allclose(dg.per_frame(values, frame), [5.0, 2.0, 7.0])
    np.testing.assert_allclose(dg.per_frame(values, frame, how="mean"), [3.0, 2.0, 5.0])
    out = dg.per_frame(values, frame, n_frames=4)
    assert out.shape == (4,) and math.isnan(out[3])
    with pytest.raises(ValueError):
        dg.per_frame(values, frame, how="median")


def test_sigma_force_spearman_atoms_uses_sqrt_of_summed_variance():
    forces = np.array([[3.0, 0.0, 0.0], [2.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # |F| = 3, 2, 1
    # sigma = sqrt(sum var) = 2.0, 1.73, 1.0 -> same order as |F|: Spearman 1.
    # A sum of per-component stds (2, 3, 1) would give Spearman 0.5 instead.
    var = np.array([[4.0, 0.0, 0.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert dg.sigma_force_spearman_atoms(var, forces) == pytest.approx(1.0)
    assert dg.sigma_force_spearman_atoms(var[::-1], forces) == pytest.approx(-1.0)


def test_sigma_force_spearman_frames_is_max_over_atoms():
    # three frames of two atoms; frame max |F| = 1, 2, 3 and frame max sigma = 1, 1.5, 3
    # (Spearman 1), but frame mean sigma = 0.95, 0.75, 1.5 (a mean would give 0.5)
    forces = np.array([[1, 0, 0], [0.5, 0, 0], [2, 0, 0], [0, 0, 0], [3, 0, 0], [0, 0, 0]], float)
    sigma = np.array([1.0, 0.9, 1.5, 0.0, 3.0, 0.0])
    var = np.zeros((6, 3))
    var[:, 1] = sigma**2
    frame = [0, 0, 1, 1, 2, 2]
    assert dg.sigma_force_spearman_frames(var, forces, frame) == pytest.approx(1.0)


def _partial_by_residuals(x, y, z):
    """Independent route: Pearson correlation of rank residuals after regressing on rank(z)."""
    from scipy.stats import rankdata

    rx, ry, rz = rankdata(x), rankdata(y), rankdata(z)
    design = np.column_stack([np.ones_like(rz), rz])
    res_x = rx - design @ np.linalg.lstsq(design, rx, rcond=None)[0]
    res_y = ry - design @ np.linalg.lstsq(design, ry, rcond=None)[0]
    return float(np.corrcoef(res_x, res_y)[0, 1])


def test_partial_spearman_known_value():
    expected = (0.8 - 0.9 * 0.6) / math.sqrt((1 - 0.81) * (1 - 0.36))  # 0.74560...
    assert dg.partial_spearman(X, Y, Z) == pytest.approx(expected)
    assert dg.partial_spearman(X, Y, Z) == pytest.approx(_partial_by_residuals(X, Y, Z))


def test_partial_spearman_removes_the_shared_driver_and_ignores_monotone_maps():
    rng = np.random.default_rng(0)
    z = rng.normal(size=4000)  # |F_pred|: drives both sigma and the error
    x = z + 0.3 * rng.normal(size=4000)  # sigma = |F| + independent noise
    y = z + 0.3 * rng.normal(size=4000)  # error = |F| + independent noise
    assert (
        spearman_corr(x, y, nan_policy="omit") > 0.8
    )  # plain Spearman sees a strong (spurious) link
    assert abs(dg.partial_spearman(x, y, z)) < 0.05  # nothing beyond |F|
    # rank-based: invariant under monotone maps of each input (a Pearson partial is not)
    w = 0.5 * z + rng.normal(size=4000)
    value = dg.partial_spearman(x, w, z)
    assert dg.partial_spearman(np.exp(3 * x), w**3, np.exp(z)) == pytest.approx(value)
    assert value == pytest.approx(_partial_by_residuals(x, w, z), abs=1e-9)
    # sigma informative beyond |F|: x carries the part of the error that z does not
    informative = y - z
    assert dg.partial_spearman(informative + 0.1 * rng.normal(size=4000), y, z) > 0.8


def test_partial_spearman_degenerate_cases_are_nan():
    assert math.isnan(dg.partial_spearman(X, Y, X))  # control ranks x perfectly
    assert math.isnan(dg.partial_spearman(X[:3], Y[:3], Z[:3]))  # too few points


def test_sigma_over_force_auroc_known_value():
    # in-domain: sigma 1, 2 with |F| 10 -> ratio 0.1, 0.2; OOD: sigma 0.3 with |F| 1, 2 ->
    # ratio 0.3, 0.15; OOD above in-domain in 3 of 4 pairs. sigma alone would give AUROC 0.
    sigma = [1.0, 2.0, 0.3, 0.3]
    force = [10.0, 10.0, 1.0, 2.0]
    labels = [0, 0, 1, 1]
    assert dg.sigma_over_force_auroc(sigma, force, labels) == pytest.approx(0.75)
    # sigma proportional to |F|: the ratio is constant and says nothing
    assert dg.sigma_over_force_auroc(
        [2.0, 4.0, 6.0, 8.0], [1.0, 2.0, 3.0, 4.0], labels
    ) == pytest.approx(0.5)
    # a zero predicted force with some sigma ranks as the most suspicious frame
    assert dg.sigma_over_force_auroc([1.0, 1.0, 1.0], [1.0, 2.0, 0.0], [0, 0, 1]) == pytest.approx(
        1.0
    )


def test_std_over_rmse_is_root_mean_variance_over_rmse():
    var = np.full((4, 3), 0.25)
    err = np.ones((4, 3))
    assert dg.std_over_rmse(var, err) == pytest.approx(0.5)
    # heterogeneous variances: sqrt(mean var) = sqrt(2), not mean std = 1
    assert dg.std_over_rmse([0.0, 4.0], [1.0, -1.0]) == pytest.approx(math.sqrt(2.0))
    # errors enter squared (RMSE), not as a mean absolute error: rmse([0, 2]) = sqrt 2
    assert dg.std_over_rmse([1.0, 1.0], [0.0, 2.0]) == pytest.approx(1.0 / math.sqrt(2.0))
    assert math.isnan(dg.std_over_rmse([1.0], [0.0]))
    with pytest.raises(ValueError):
        dg.std_over_rmse(np.ones((2, 3)), np.ones(5))


def test_frame_ranking_known_values():
    ood = ([6.0, 7.0, 0.5], [9.0, 9.0, 9.0], [1.0, 1.0, 1.0])
    out = dg.frame_ranking(X, Y, Z, *ood)
    assert out["spearman_frame_in_domain"] == pytest.approx(0.8)
    assert out["partial_spearman_given_force"] == pytest.approx(dg.partial_spearman(X, Y, Z))
    assert out["auroc_ood"] == pytest.approx(
        10 / 15
    )  # OOD 6, 7 above all 5 in-domain; 0.5 below all
    # score / force: in-domain 1, 1, 1, 0.8, 1.25; OOD 6, 7, 0.5 -> also 10 of 15 pairs
    assert out["auroc_sigma_over_force"] == pytest.approx(10 / 15)
    assert out["spearman_frame_pooled"] == pytest.approx(
        spearman_corr([*X, 6, 7, 0.5], [*Y, 9, 9, 9], nan_policy="omit")
    )
    # OOD frames ranked by the ratio, not the score: large score, larger force -> low ratio
    flipped = dg.frame_ranking(X, Y, Z, [6.0, 7.0], [9.0, 9.0], [100.0, 100.0])
    assert flipped["auroc_ood"] == pytest.approx(1.0) and flipped[
        "auroc_sigma_over_force"
    ] == pytest.approx(0.0)
    alone = dg.frame_ranking(X, Y, Z)
    assert math.isnan(alone["auroc_ood"]) and alone["spearman_frame_pooled"] == pytest.approx(0.8)
