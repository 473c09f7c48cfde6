"""``python -m benchmarks.scale``: see :mod:`benchmarks.scale.suite`."""

from benchmarks.scale.suite import main

main()
