"""Devices: whether one can be used here, said in one line before any work (no torch traceback
about a truncated checkpoint or a missing driver when the machine simply has no CUDA), and
batches moved to a model's device (:func:`module_device`, :func:`to_device`: training,
evaluation and the post-hoc fits)."""

from __future__ import annotations

from typing import TypeVar

import torch
from torch import nn

__all__ = ["module_device", "require_available", "to_device"]

T = TypeVar("T")


def _cuda_missing() -> str:
    """Why CUDA cannot be used here: this torch is a CPU-only build, or no GPU is visible."""
    if torch.version.cuda is None:
        return f"CUDA is not available here (torch {torch.__version__} is a CPU-only build)"
    return f"CUDA is not available here (torch {torch.__version__}: no GPU visible)"


def require_available(device: str | torch.device, *, name: str = "device") -> torch.device:
    """``device`` as a ``torch.device``; ValueError naming CUDA when it asks for a GPU that this
    machine lacks (before a checkpoint is mapped or a model moved there, which fail deep in torch).

    Args:
        device: ``cpu``, ``cuda``, ``cuda:N`` or a ``torch.device``.
        name: how the caller's setting is spelled in the message (``--device``, ``device``).
    """
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(f"{name} {str(device)!r} is not a device (cpu, cuda or cuda:N)") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name} {str(device)!r}: {_cuda_missing()}; use {name} cpu")
    return resolved


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (or buffer); CPU for a module with neither."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def to_device(batch: T, device: torch.device) -> T:
    """``batch.to(device)`` (a PyG ``Batch``/``Data`` or a tensor); as it is for the CPU, where
    the loaders build it."""
    return batch if device.type == "cpu" else batch.to(device)  # type: ignore[attr-defined]
