"""mlip_unc.uncertainty: closed-form moments, calibration metrics, recalibration, LPA metrics,
density proxies, plots. Pure functions on tensors and arrays; nothing here trains a model
(the LPA study that does lives in the repository's ``benchmarks/paper/``).

Metric functions take ``(y_pred, y_std, y_true)`` in that order (uncertainty-toolbox's).
matplotlib, RDKit and ASE are imported lazily inside the functions that need them.
"""

from mlip_unc.uncertainty.alignment import (
    LogUDecomposition,
    ThreeFactorSplit,
    alignment_index,
    effective_rank,
    log_variance_decomposition,
    low_variance_energy_fraction,
    lpa_summary,
    mean_log_factors,
    permutation_baseline,
    rho_lpa,
    three_factor_split,
)
from mlip_unc.uncertainty.calibration import (
    STD_FLOOR,
    auroc,
    calibration_curve,
    coverage,
    crps,
    ence,
    mae,
    miscalibration_area,
    nll,
    regression_metrics,
    rmse,
    sharpness,
    spearman,
    spearman_corr,
)
from mlip_unc.uncertainty.density import (
    atom_latent_knn_distance,
    descriptor_knn_distance,
    latent_knn_distance,
    structural_calibration,
    structure_descriptor,
    tanimoto_max_similarity,
)
from mlip_unc.uncertainty.moments import alignment_kappa, latent_variance
from mlip_unc.uncertainty.plots import (
    plot_calibration_curve,
    plot_error_vs_std,
    plot_lpa_vs_fraction,
    plot_std_vs_density,
)
from mlip_unc.uncertainty.recalibration import (
    CalibratorKind,
    IdentityCalibrator,
    IsotonicRecalibration,
    ZScaling,
    calibrator_from_state_dict,
    make_calibrator,
)
from mlip_unc.uncertainty.sample_size import MIN_CALIBRATION_SIZE, CalibrationWarning

__all__ = [
    # calibration
    "STD_FLOOR",
    "rmse",
    "mae",
    "nll",
    "calibration_curve",
    "miscalibration_area",
    "ence",
    "spearman",
    "coverage",
    "crps",
    "sharpness",
    "auroc",
    "regression_metrics",
    "spearman_corr",
    # recalibration
    "CalibratorKind",
    "IdentityCalibrator",
    "ZScaling",
    "IsotonicRecalibration",
    "make_calibrator",
    "calibrator_from_state_dict",
    # sample size
    "MIN_CALIBRATION_SIZE",
    "CalibrationWarning",
    # moments
    "latent_variance",
    "alignment_kappa",
    # alignment
    "ThreeFactorSplit",
    "LogUDecomposition",
    "three_factor_split",
    "alignment_index",
    "rho_lpa",
    "low_variance_energy_fraction",
    "permutation_baseline",
    "mean_log_factors",
    "log_variance_decomposition",
    "effective_rank",
    "lpa_summary",
    # density
    "latent_knn_distance",
    "atom_latent_knn_distance",
    "tanimoto_max_similarity",
    "structure_descriptor",
    "descriptor_knn_distance",
    "structural_calibration",
    # plots
    "plot_calibration_curve",
    "plot_error_vs_std",
    "plot_std_vs_density",
    "plot_lpa_vs_fraction",
]
