"""mlip_unc.posthoc: fits on a trained potential, after its weights are fixed.

- posterior.py: the full-covariance last-layer posterior and its calibration
  (:func:`fit_full_posterior`, :func:`gaussian_scale_fit`);
- levels.py: :func:`uncertainty_levels`, the mean uncertainties on validation data that the
  calculator's relative thresholds multiply;
- attach.py: :func:`attach_uncertainty` (``mlip-unc attach``), both fits for a MACE model
  someone already trained.

Training calls the first two at the end of a run (``mlip_unc.train.potential``); they use
:mod:`mlip_unc.evaluation` and the models, never :mod:`mlip_unc.train`.
"""
