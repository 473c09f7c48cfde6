"""Scale suite: streamed, sharded ``mlip-unc flag`` and data-parallel training throughput.

Run as ``python -m benchmarks.scale`` (screening, :mod:`~benchmarks.scale.suite`) and
``python -m benchmarks.scale.train`` (training throughput, :mod:`~benchmarks.scale.train`);
the first writes one page for both.
"""
