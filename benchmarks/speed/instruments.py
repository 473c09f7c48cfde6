"""Per-call instruments of the size part: peak resident memory and the number of backward vectors.

Peak memory: Linux keeps a process's resident-set high-water mark (``VmHWM`` in
``/proc/self/status``); writing ``5`` to ``/proc/self/clear_refs`` resets it to the current
resident set. Before each call the heap's free memory is handed back to the OS (glibc
``malloc_trim``) and the mark is reset, so the peak read after the call is that call's own, in
one process that holds every model. (``ru_maxrss`` cannot be reset, tracemalloc does not see
torch's allocations.)

Backward vectors: ``torch.autograd.grad`` is wrapped while a call runs and counts the
vector-Jacobian products it is asked for (the batch size of ``is_grads_batched`` calls, 1
otherwise): the ``K`` of the floor ``(f + K b) / (f + b)``, counted rather than assumed, so a
new uncertainty mode gets its own ``K``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

_STATUS = Path("/proc/self/status")
_MEMINFO = Path("/proc/meminfo")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@functools.lru_cache(maxsize=1)
def _libc() -> Any | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def _status_mib(field: str) -> float | None:
    """``VmRSS`` / ``VmHWM`` of this process in MiB (None where /proc is not there)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        return None
    return None


@functools.lru_cache(maxsize=1)
def peak_resettable() -> bool:
    """True where the high-water mark can be reset (Linux >= 4.0, /proc writable)."""
    try:
        _CLEAR_REFS.write_text("5")
    except OSError:
        return False
    return _status_mib("VmHWM") is not None


def start_peak() -> float | None:
    """Trim the heap, reset the high-water mark; the resident set now (MiB) or None."""
    if not peak_resettable():
        return None
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
    _CLEAR_REFS.write_text("5")
    return _status_mib("VmRSS")


def read_peak() -> float | None:
    """The high-water mark since :func:`start_peak` (MiB) or None."""
    return _status_mib("VmHWM") if peak_resettable() else None


class VectorCounter:
    """Vector-Jacobian products asked of ``torch.autograd.grad`` since the last :meth:`reset`."""

    def __init__(self) -> None:
        self.count = 0

    def reset(self) -> None:
        self.count = 0

    def wrap(self, grad: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(grad)
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count += _batch_size(args, kwargs)
            return grad(*args, **kwargs)

        return counted


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """Vectors of one ``torch.autograd.grad`` call: the leading size of batched
    ``grad_outputs``, else 1."""
    if not kwargs.get("is_grads_batched", False):
        return 1
    outputs = kwargs.get("grad_outputs", args[2] if len(args) > 2 else None)
    first = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
    return int(first.shape[0]) if isinstance(first, torch.Tensor) else 1


@contextlib.contextmanager
def counting_vectors() -> Iterator[VectorCounter]:
    """Count the backward vectors of every ``torch.autograd.grad`` call inside the block."""
    counter = VectorCounter()
    original = torch.autograd.grad
    torch.autograd.grad = counter.wrap(original)
    try:
        yield counter
    finally:
        torch.autograd.grad = original


def available_mib() -> float | None:
    """``MemAvailable`` of the machine in MiB (None where /proc/meminfo is not there)."""
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None
