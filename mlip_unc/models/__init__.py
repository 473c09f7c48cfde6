"""mlip_unc.models: models on top of the nn layers, and their checkpoints.

- potential.py: :class:`BayesianPotential` (energy, forces, stress) with backbones.py (the
  backbone contract and registry), derivatives.py (one forward state, forces and stress),
  potential_uncertainty.py (energy, force and stress variances) and potential_checkpoint.py
  (plain-data (de)serialisation); committee.py: several potentials as one; loading.py:
  ``load_potential``, one checkpoint or several (a committee).
- property.py: graph regression with a (Bayesian) head; baselines.py: MC dropout, ensembles,
  MVE, Laplace; factory.py: ``build_model`` from a config and :class:`PropertyPredictor`.
- checkpoint.py: atomic, weights-only checkpoint files (what the calculator and CLI load through);
  devices.py: whether a device is available, and batches moved to a model's device.

Imports flow one way: baselines imports property, factory imports both; potential imports
backbones, derivatives, potential_uncertainty and potential_checkpoint, committee imports
potential, loading imports committee. Nothing here imports :mod:`mlip_unc.train`.
"""
