"""mlip_unc.uncertainty: calibration metrics, recalibration, LPA metrics, density proxies, plots.

Metric functions take ``(y_pred, y_std, y_true)`` in that order (uncertainty-toolbox's).
matplotlib, RDKit and ASE are imported lazily inside the functions that need them.
"""

from mlip_unc.uncertainty.alignment import (
    LogUDecomposition,
    ThreeFactorSplit,
    alignment_index,
    effective_rank,
    latent_variance,
    log_variance_decomposition,
    low_variance_energy_fraction,
    lpa_summary,
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
    rankdata,
    regression_metrics,
    rmse,
    sharpness,
    spearman,
    spearman_corr,
)
from mlip_unc.uncertainty.density import (
    descriptor_knn_distance,
    latent_knn_distance,
    structural_calibration,
    structure_descriptor,
    tanimoto_max_similarity,
)
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
    pava,
)

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
    "rankdata",
    "spearman_corr",
    # recalibration
    "CalibratorKind",
    "IdentityCalibrator",
    "ZScaling",
    "IsotonicRecalibration",
    "make_calibrator",
    "calibrator_from_state_dict",
    "pava",
    # alignment
    "ThreeFactorSplit",
    "LogUDecomposition",
    "latent_variance",
    "three_factor_split",
    "alignment_index",
    "rho_lpa",
    "low_variance_energy_fraction",
    "permutation_baseline",
    "log_variance_decomposition",
    "effective_rank",
    "lpa_summary",
    # density
    "latent_knn_distance",
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
