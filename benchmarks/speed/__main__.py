"""``python -m benchmarks.speed``: see :mod:`benchmarks.speed.suite`."""

from benchmarks.speed.suite import main

main()
