"""Where training runs: ``train.device`` resolved to a ``torch.device``, and batches moved there.

``train.device`` is ``cpu`` (the default, as in MACE), ``cuda``, ``cuda:N`` or ``auto`` (CUDA
when available, else CPU). Under torchrun a bare ``cuda`` (or ``auto`` with CUDA) means
``cuda:LOCAL_RANK``: one GPU per process, the one :func:`mlip_unc.train.distributed.init_from_env`
made current. The training core moves the model there before it builds the optimiser, every
batch before the step, and draws the posterior samples from a generator on that device; the
post-hoc fits (last-layer Laplace, full posterior, uncertainty levels) move their batches to
the model's device with :func:`to_device`. Checkpoints are written from CPU copies (and read
with ``map_location="cpu"``), so a run trained on a GPU resumes or predicts on a CPU.
"""

from __future__ import annotations

import os
from typing import TypeVar

import torch
from torch import nn

__all__ = ["module_device", "resolve_device", "to_device"]

T = TypeVar("T")


def resolve_device(
    spec: str, *, cuda_available: bool | None = None, local_rank: int | None = None
) -> torch.device:
    """``train.device`` as a ``torch.device``; ValueError naming the setting when it cannot run here.

    Args:
        spec: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``.
        cuda_available: default ``torch.cuda.is_available()`` (a parameter for tests).
        local_rank: default ``$LOCAL_RANK`` (torchrun), else 0; the GPU of a bare ``cuda``.
    """
    cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if local_rank is None:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    text = spec.strip().lower()
    if text == "auto":
        text = "cuda" if cuda_available else "cpu"
    try:
        device = torch.device(text)
    except RuntimeError:
        raise ValueError(
            f"train.device: {spec!r} is not a device (cpu, cuda, cuda:N or auto)"
        ) from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type != "cuda":
        raise ValueError(f"train.device: {spec!r}: only cpu and cuda are supported")
    if not cuda_available:
        raise ValueError(
            f"train.device: {spec!r} but CUDA is not available here (torch {torch.__version__}, "
            "a CPU build or no GPU visible); use train.device=cpu or auto"
        )
    return torch.device("cuda", local_rank if device.index is None else device.index)


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter (or buffer); CPU for a module with neither."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def to_device(batch: T, device: torch.device) -> T:
    """``batch.to(device)`` (a PyG ``Batch``/``Data`` or a tensor); as it is for the CPU, where
    the loaders build it."""
    return batch if device.type == "cpu" else batch.to(device)  # type: ignore[attr-defined]
