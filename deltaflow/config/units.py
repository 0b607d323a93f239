"""Sizes and durations as users write them: ``"128MB"``, ``"500ms"``, ``"2 min"``."""

from __future__ import annotations

import re
from typing import Any

from deltaflow.errors import ConfigError

__all__ = ["parse_seconds", "parse_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SECONDS = re.compile(
    r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|sec|secs|seconds?|m|min|mins|minutes?|h|hours?)?\s*$", re.I
)


def parse_size(text: str | int) -> int:
    """Bytes from ``"256MB"``, ``"1.5g"``, ``"512KiB"`` or a plain number (binary units, as
    Spark and Delta read them: 1 MB = 1024² bytes)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(text)
    if m is None:
        raise ConfigError(f"{text!r} is not a size; use a number of bytes or e.g. 128MB, 1GB", value=text)
    unit = (m.group(2) or "b").lower()[0]
    factor = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[unit]
    return int(float(m.group(1)) * factor)


def parse_seconds(value: Any) -> float:
    """Seconds from ``5``, ``"5 seconds"``, ``"500ms"``, ``"2 min"``, ``"1h"``."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    m = _SECONDS.match(str(value))
    if m is None:
        raise ValueError("must be a duration: seconds, or e.g. '5 seconds', '500ms', '2 min'")
    unit = (m.group(2) or "s").lower()
    factor = (
        0.001 if unit == "ms" else 60.0 if unit.startswith("m") else 3600.0 if unit.startswith("h") else 1
    )
    return float(m.group(1)) * factor
