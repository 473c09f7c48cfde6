"""``python -m benchmarks.active_learning``: the active-learning benchmark (``benchmark.py``)."""

from benchmarks.active_learning.benchmark import main

main()
