"""``python -m benchmarks.active_learning``: the on-the-fly active-learning benchmark
(``onthefly.py``); the earlier fixed-labels-per-round protocol is
``python -m benchmarks.active_learning.benchmark``."""

from benchmarks.active_learning.onthefly import main

main()
