"""Inputs that the type checker showed could reach a None or a str where a value is needed:
each now fails with the module's own error and a message naming the problem."""

from __future__ import annotations

import ase.io
import pytest
import torch
from ase.build import molecule

from mlip_unc.active.biased_md import BiasError, bias_energy
from mlip_unc.data.errors import DataError
from mlip_unc.data.readers import read_structures
from mlip_unc.uncertainty import diagnostics as dg


def test_non_numeric_frame_index_is_a_data_error(tmp_path):
    path = tmp_path / "water.xyz"
    ase.io.write(path, [molecule("H2O"), molecule("H2O")], format="extxyz")
    assert len(read_structures(path, index="1", require_energy=False, require_forces=False)) == 1
    with pytest.raises(DataError, match="bad frame index 'abc'"):
        read_structures(path, index="abc", require_energy=False, require_forces=False)


def test_udd_bias_without_width_is_a_bias_error():
    with pytest.raises(BiasError, match="needs a width"):
        bias_energy(torch.ones(2), 3, "udd", 0.5, None)


def test_frame_ranking_needs_all_ood_arrays():
    in_domain = ([1.0, 2.0, 3.0], [0.1, 0.2, 0.3], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="needs error_ood and force_ood"):
        dg.frame_ranking(*in_domain, score_ood=[4.0], error_ood=[0.4])
