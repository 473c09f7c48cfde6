"""Number formatting for results pages (and numbers read back); JSON-safe values for results:
:func:`mlip_unc.train.text_files.json_safe`."""

from __future__ import annotations

import math
import re
from typing import Any

# a number, not a part of a name (molecules_27, 3bpa: none); a sign only where it is not a dash
# between two numbers (0.80-0.96: 0.80 and 0.96); "1.50x" reads 1.50
NUMBER = re.compile(r"(?:(?<![\w.])[-+])?(?<![\w.])\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![A-Za-wyz_])")


def numbers(text: str) -> list[float]:
    """The numbers written in ``text``, in order (what a test of a page line checks)."""
    return [float(x) for x in NUMBER.findall(text)]


def missing(value: Any) -> bool:
    """True for a value a table shows as ``n/a``: None or NaN."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def fmt(value: Any, spec: str = "{:.2f}") -> str:
    """``spec.format(value)``, or ``n/a`` for None and NaN."""
    return "n/a" if missing(value) else spec.format(value)


def fmt2(value: Any) -> str:
    """Two decimals below 100, no decimals from 100 on (``n/a`` for None)."""
    return "n/a" if value is None else f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"


def fmt3(value: Any) -> str:
    """Three decimals (``n/a`` for None): for targets that are met or missed at that level."""
    return "n/a" if value is None else f"{value:.3f}"


def fmt_sig3(value: Any, spread: Any = None) -> str:
    """Three significant digits (no decimals from 100 on), with ``± spread`` when one is given."""
    if value is None:
        return "n/a"
    text = f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return text if spread is None else f"{text} ± {spread:.2g}"
