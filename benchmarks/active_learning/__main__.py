"""``python -m benchmarks.active_learning``: the on-the-fly active-learning benchmark
(``onthefly.py``); the earlier fixed-labels-per-round protocol's code is retired (in git
history, see ``benchmarks/results/active_learning/rounds_protocol.md``)."""

from benchmarks.active_learning.onthefly import main

main()
