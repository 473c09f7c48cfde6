"""The benchmark suites of mlip-unc, run from the repository root as ``python -m benchmarks.<suite>``.

Suites: :mod:`~benchmarks.potential`, :mod:`~benchmarks.accuracy`,
:mod:`~benchmarks.force_uncertainty`, :mod:`~benchmarks.molecular`, :mod:`~benchmarks.speed`,
:mod:`~benchmarks.scale`, :mod:`~benchmarks.reliability`, :mod:`~benchmarks.exploration` and
:mod:`~benchmarks.mlearn_published`. Each writes ``benchmarks/results/<suite>.md`` (the table
first, then command, date, machine and versions) beside a JSON file with the full provenance.
:mod:`benchmarks.paper` holds the LPA paper study, :mod:`benchmarks.peers` the adaptors of peer
codes, :mod:`benchmarks.common` the helpers the suites share.
"""
