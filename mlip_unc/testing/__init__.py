"""Contract tests for a new backbone or oracle: plain functions, with or without pytest.

A backbone or an oracle added through :mod:`mlip_unc.registry` passes these before anything
trains on it or labels with it; the project's own backbones and oracles pass the same
(``tests/nn/test_backbones.py``, ``tests/active/test_oracles.py``)::

    from mlip_unc.testing import check_backbone, check_oracle

    def test_my_backbone():
        check_backbone("toy", options={"width": 8})

    def test_my_oracle():
        check_oracle({"name": "morse", "epsilon": 0.5}, elements=("Cu",))

Each function returns the names of the checks it ran and raises :class:`ContractError` (an
``AssertionError``, so pytest shows it as a failure) on the first one that fails, naming it
and by how much it failed.

:func:`check_backbone` (float64, on small random molecules and a periodic cell):

- ``contract``: an int ``latent_dim``, a cutoff within the graphs', latents ``(n_atoms,
  latent_dim)`` finite and in the module's dtype (float64 and float32);
- ``options`` (a registered name): the options model's fields are constructor keywords, with
  the constructor's defaults;
- ``latent_invariance``: the latents are invariant under rotation and translation, and
  permuting the atoms permutes them;
- ``periodic_images``: in a periodic cell, shifting every atom by a vector and wrapping it back
  into the cell (other cell shifts) leaves the latents unchanged;
- on a :class:`~mlip_unc.models.potential.BayesianPotential` built on it:
  ``finite_difference_forces`` (molecule and periodic cell; forces not all zero),
  ``finite_difference_stress`` (periodic cell), ``energy_invariance`` (rotation, translation
  and permutation; forces rotate and permute with the atoms), ``batch_equals_singles``,
  ``smooth_cutoff`` (a dimer's energy continuous and its forces vanishing at ``r_max``; optional)
  and ``isolated_atoms`` (a free atom's energy is its offset, no force);
- ``reset_parameters`` (if it has one) draws new weights (for some parameter at least);
- ``checkpoint``: ``backbone_name`` and plain-data ``config()`` rebuild the backbone with
  ``build_backbone`` (the same latents, bit for bit), and a potential saved to a file and
  loaded back gives the same energies.

:func:`check_oracle` (on a small cluster and, with ``periodic``, a rattled fcc cell):
``shapes`` (a finite energy, finite ``(n_atoms, 3)`` forces), ``consistency`` (the same
structure gives the same answer again, after another structure in between, and
:func:`~mlip_unc.active.oracles.label_structures` stores it), ``finite_difference_forces``,
``finite_difference_stress`` (periodic, when it implements stress) and ``invariance``
(translation, permutation, and rotation of a molecule).
"""

from mlip_unc.testing.backbones import check_backbone
from mlip_unc.testing.common import ContractError
from mlip_unc.testing.oracles import check_oracle, oracle_test_structures

__all__ = ["ContractError", "check_backbone", "check_oracle", "oracle_test_structures"]
