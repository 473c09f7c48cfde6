"""The benchmark suites of mlip-unc, run from the repository root as ``python -m benchmarks.<suite>``.

Suites: :mod:`~benchmarks.potential`, :mod:`~benchmarks.accuracy`,
:mod:`~benchmarks.force_uncertainty`, :mod:`~benchmarks.molecular`, :mod:`~benchmarks.speed`,
:mod:`~benchmarks.scale`, :mod:`~benchmarks.reliability`, :mod:`~benchmarks.exploration` and
:mod:`~benchmarks.mlearn_published`. Each writes ``benchmarks/results/<suite>.md`` (the table
first, then command, date, machine and versions) beside a JSON file with the full provenance.
:mod:`benchmarks.paper` holds the LPA paper study, :mod:`benchmarks.peers` the peer rows
(mace-torch users, metatrain) on the suites' frames, :mod:`benchmarks.common` what the suites
share (formatting, records, page footers and CSV tables, rerun commands, test-set evaluation,
the force-uncertainty frames and scoring, the mace-torch and n2p2 peers); no suite imports
another (tests/benchmarks/test_suite_imports.py).
"""
