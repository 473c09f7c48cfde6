import numpy as np
import pytest
from ase.build import bulk

from mlip_unc.active.selection import distance_histograms, farthest_point_sampling, select


def test_top_k_and_threshold():
    s = np.array([0.1, 0.5, 0.3, 0.9, 0.2])
    assert select(s, top_k=2).tolist() == [3, 1]
    assert select(s, threshold=0.25).tolist() == [3, 1, 2]
    assert select(s, threshold=0.25, top_k=1).tolist() == [3]
    with pytest.raises(ValueError, match="top_k, threshold"):
        select(s)


def test_diverse_skips_near_duplicates():
    s = np.array([1.0, 0.99, 0.98, 0.5])
    feats = np.array([[0.0], [0.001], [5.0], [0.002]])
    assert select(s, top_k=2, features=feats).tolist() == [0, 2]
    assert farthest_point_sampling(feats, 3, start=0).tolist()[:2] == [0, 2]


def test_distance_histogram_tells_hot_from_cold():
    cold = bulk("Cu", "fcc", a=3.6, cubic=True) * (2, 2, 2)
    hot = cold.copy()
    hot.rattle(0.2, seed=1)
    h = distance_histograms([cold, cold.copy(), hot])
    assert h.shape == (3, 32)
    assert np.allclose(h[0], h[1]) and not np.allclose(h[0], h[2])
