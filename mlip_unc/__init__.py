"""mlip-unc: Bayesian output layers with closed-form uncertainty for GNN property models and interatomic potentials."""

__version__ = "0.1.0"

__all__ = ["UncertaintyCalculator", "__version__"]


def __getattr__(name: str):
    """Lazy attributes: ``mlip_unc.UncertaintyCalculator`` imports torch only when used."""
    if name == "UncertaintyCalculator":
        from mlip_unc.calculator import UncertaintyCalculator

        return UncertaintyCalculator
    raise AttributeError(f"module 'mlip_unc' has no attribute {name!r}")
