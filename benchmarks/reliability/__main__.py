"""``python -m benchmarks.reliability``: see :mod:`benchmarks.reliability.suite`."""

from benchmarks.reliability.suite import main

main()
