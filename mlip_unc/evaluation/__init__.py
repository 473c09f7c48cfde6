"""mlip_unc.evaluation: a potential run over a dataset, and what is measured on it.

- predictions.py: :func:`predict` (a model over a dataset, arrays in eV, eV/A, eV/A^3) and
  :class:`Predictions`;
- frames.py: the per-frame table, its CSV and the extxyz of predictions;
- evaluate.py: :func:`potential_metrics` (accuracy and calibration) and
  :func:`evaluate_potential` (``mlip-unc eval``).

Imports flow one way: frames imports predictions, evaluate imports both. Above the models
(:mod:`mlip_unc.models`), below the post-hoc fits and training, which use it.
"""
