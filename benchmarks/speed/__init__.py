"""Speed suite: calculator cost, training throughput and peak memory.

Run as ``python -m benchmarks.speed``; :mod:`~benchmarks.speed.suite` measures and writes the
page, :mod:`~benchmarks.speed.fixtures` builds the models and systems it times.
"""
