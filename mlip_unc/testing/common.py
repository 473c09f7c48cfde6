"""What the contract checks share: the failure and the comparison that raises it."""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["ContractError", "close", "max_abs", "to_numpy", "random_rotation"]


class ContractError(AssertionError):
    """A contract check failed: the message names the check and by how much it failed."""


def max_abs(a: Any) -> float:
    """The largest absolute entry (0 for an empty array)."""
    return float(np.max(np.abs(np.asarray(a)))) if np.size(a) else 0.0


def close(check: str, what: str, actual: Any, expected: Any, *, atol: float, rtol: float) -> None:
    """Raise :class:`ContractError` unless ``|actual - expected| <= atol + rtol |expected|``."""
    a = np.asarray(to_numpy(actual), dtype=np.float64)
    e = np.asarray(to_numpy(expected), dtype=np.float64)
    if a.shape != e.shape:
        raise ContractError(f"{check}: {what}: shape {a.shape}, expected {e.shape}")
    excess = np.abs(a - e) - (atol + rtol * np.abs(e))
    if np.any(excess > 0) or not np.all(np.isfinite(a)):
        worst = max_abs(a - e)
        raise ContractError(
            f"{check}: {what} differ by up to {worst:.3g} (tolerance {atol:.3g} + "
            f"{rtol:.3g} x |expected|)"
        )


def to_numpy(x: Any) -> Any:
    """A tensor as a NumPy array; anything else as it is."""
    detach = getattr(x, "detach", None)
    return detach().cpu().numpy() if detach is not None else x


def random_rotation(rng: np.random.Generator) -> np.ndarray:
    """A uniformly random proper rotation matrix (3, 3)."""
    q, r = np.linalg.qr(rng.normal(size=(3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q
