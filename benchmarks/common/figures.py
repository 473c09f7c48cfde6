"""Figures of the results pages, saved small: plots use few colours, so a 256-colour palette
(no dithering) looks the same at about a third of the bytes (the results folder has a budget)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any


def save_png(fig: Any, path: Path, *, dpi: int = 100) -> Path:
    """``fig`` (a matplotlib Figure) as a palette PNG at ``path``; returns ``path``."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    image = Image.open(buffer).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        path, format="PNG", optimize=True
    )
    return path
