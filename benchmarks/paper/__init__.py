"""The LPA paper study: property models trained at growing data fractions, with and without
interventions, and the latent-posterior alignment of the force Jacobian (docs/method.md s.4-7).

Library: :mod:`~benchmarks.paper.lpa` (variants, training, one record per model),
:mod:`~benchmarks.paper.report` (aggregates, acceptance, markdown),
:mod:`~benchmarks.paper.posterior_optimum` (ELBO-optimal last-layer widths for fixed features),
:mod:`~benchmarks.paper.force_lpa_page` (the force-LPA page and its section on the summary).
Scripts: ``python -m benchmarks.paper.study`` (one dataset), ``python -m
benchmarks.paper.summary`` (the page over datasets), ``python -m benchmarks.paper.optimum``
(the study's models at their optimal widths), ``python -m benchmarks.paper.force_lpa``.
"""
