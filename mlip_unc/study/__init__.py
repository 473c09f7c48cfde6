"""mlip_unc.study: experiments that train models and measure them (the LPA paper study).

Above :mod:`mlip_unc.train` in the layering: :mod:`~mlip_unc.study.lpa` builds the variants,
trains them and turns one trained model into one flat record; :mod:`~mlip_unc.study.report`
aggregates records into acceptance lines and a markdown report (docs/method.md s.4-7).
"""

from mlip_unc.study.lpa import (
    INTERVENTIONS,
    RECORD_KEYS,
    VARIANTS,
    VariantSpec,
    fit_property_model,
    study_record,
    variant_config,
)
from mlip_unc.study.report import TABLES, acceptance, aggregate, render_markdown

__all__ = [
    "VARIANTS",
    "INTERVENTIONS",
    "VariantSpec",
    "RECORD_KEYS",
    "variant_config",
    "fit_property_model",
    "study_record",
    "aggregate",
    "acceptance",
    "render_markdown",
    "TABLES",
]
