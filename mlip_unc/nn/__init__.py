"""mlip_unc.nn: layers, backbones, the Bayesian layer, the rotation intervention.

Importing this package registers ``slice`` as a safe global of ``torch.load(weights_only=True)``
(once, before any module of the package imports e3nn): e3nn 0.4.4, the version mace-torch pins,
loads its constant tables with ``torch.load`` and a ``slice`` inside them, which torch >= 2.6
refuses by default. ``slice`` is a builtin value type, not code, so allowing it keeps
weights-only loading safe; mace-torch's own workaround (an environment variable that turns
weights-only loading off) is not used here.
"""

import torch as _torch

_serialization = _torch.serialization
# torch >= 2.4 has the allow-list (older torch loads slices anyway); register once
if (
    hasattr(_serialization, "add_safe_globals")
    and slice not in getattr(_serialization, "get_safe_globals", list)()
):
    _serialization.add_safe_globals([slice])
