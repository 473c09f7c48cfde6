"""Reliability suite: faults injected into the real commands, and whether each was survived.

Run as ``python -m benchmarks.reliability``; :mod:`~benchmarks.reliability.suite` runs the
groups and writes the page, :mod:`~benchmarks.reliability.checks` holds the in-process checks
and :mod:`~benchmarks.reliability.harness` the child process that is paused and killed.
"""
