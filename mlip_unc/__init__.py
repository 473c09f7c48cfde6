"""mlip-unc: Bayesian output layers with closed-form, density-aware uncertainty for GNNs."""

__version__ = "0.1.0"
