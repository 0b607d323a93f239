"""The line every benchmark prints about where it ran (BENCHMARKS.md quotes it)."""

from __future__ import annotations

import datetime as dt
import os
import platform


def describe(*extra: str) -> str:
    """``machine: <arch>, <cores> cores, Python <version>[, extra...]; <date>``."""
    parts = [platform.machine(), f"{os.cpu_count()} cores", f"Python {platform.python_version()}", *extra]
    return f"machine: {', '.join(parts)}; {dt.date.today()}"
