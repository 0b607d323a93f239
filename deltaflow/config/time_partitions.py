"""Time-based partitioning: Arroyo's ``time_partition_pattern`` as real Delta partition columns.

Arroyo formats each row's event time with a strftime pattern (``'%Y/%m/%d/%H'``) and writes the
row under that directory. A Delta table needs ``column=value`` directories backed by partition
columns in the log, so that readers prune on them; deltaflow turns the pattern into columns:

* each ``/``-separated segment of the pattern is one partition column, in the pattern's order
  (before any ``partition_columns``: Arroyo writes ``<time>/<fields>``);
* its name is the text before ``=`` when the segment is written Hive style (``year=%Y``), else
  the names of its directives joined by ``_`` (``%Y`` -> ``year``, ``%Y-%m-%d`` ->
  ``year_month_day``, ``%F`` -> ``date``);
* its value is a string: the segment formatted from the event time in UTC (``2026``, ``03``,
  ``2026-03-08``), whatever Spark's session time zone.

Nothing here imports Spark: :func:`parse_time_pattern` validates a pattern for ``validate``;
the pipeline runner joins :attr:`TimePartitionColumn.parts`: each field extracted from the event
time's UTC wall clock (a TIMESTAMP_NTZ: ``year()``, ``hour()``... read no time zone), zero-padded,
and the pattern's literal text. Spark's ``date_format`` is not used: it formats through the
session time zone even for a TIMESTAMP_NTZ, and gets hours in that zone's DST gap wrong (02:30
UTC on 2026-03-08 came out as hour 03 under America/New_York).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["DIRECTIVES", "TimePartitionColumn", "parse_time_pattern"]

#: strftime directives a pattern may use: the field each formats (also its column name).
DIRECTIVES: dict[str, str] = {
    "Y": "year",
    "m": "month",
    "d": "day",
    "H": "hour",
    "M": "minute",
    "S": "second",
    "j": "day_of_year",
    "F": "date",  # %Y-%m-%d
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TimePartitionColumn:
    """One partition column made from the event time.

    Attributes:
        name: The column's name.
        strftime: Its segment of the pattern (``%H``).
        parts: The segment as ``("field", <a DIRECTIVES value>)`` and ``("text", <literal>)``
            parts, in order (``h=%H:%M`` -> field hour, text ``:``, field minute).
    """

    name: str
    strftime: str
    parts: tuple[tuple[Literal["field", "text"], str], ...]


def parse_time_pattern(pattern: str) -> tuple[TimePartitionColumn, ...]:
    """The partition columns of a strftime ``pattern`` (rules in the module docstring).

    Raises:
        ValueError: an empty segment, a segment without a directive, a directive other than
            those of :data:`DIRECTIVES`, a bad column name or a name used twice.
    """
    supported = ", ".join(f"%{d}" for d in DIRECTIVES)
    columns: list[TimePartitionColumn] = []
    for segment in pattern.strip().strip("/").split("/"):
        name, sep, body = segment.partition("=")
        if not sep:
            name, body = "", segment
        if not body:
            raise ValueError(f"time_partition_pattern {pattern!r}: empty segment {segment!r}")
        names: list[str] = []
        parts: list[tuple[Literal["field", "text"], str]] = []
        literal, i = "", 0
        while i < len(body):
            if body[i] != "%":
                literal += body[i]
                i += 1
                continue
            code = body[i + 1 : i + 2]
            if code == "%":
                literal += "%"
            elif code in DIRECTIVES:
                if literal:
                    parts.append(("text", literal))
                literal = ""
                names.append(DIRECTIVES[code])
                parts.append(("field", DIRECTIVES[code]))
            else:
                raise ValueError(
                    f"time_partition_pattern {pattern!r}: %{code} is not supported; use {supported} "
                    "(and %% for a percent sign)"
                )
            i += 2
        if literal:
            parts.append(("text", literal))
        if not names:
            raise ValueError(
                f"time_partition_pattern {pattern!r}: segment {segment!r} has no time directive ({supported})"
            )
        column = name.strip() or "_".join(names)
        if not _NAME.match(column):
            raise ValueError(f"time_partition_pattern {pattern!r}: {column!r} is not a column name")
        if any(c.name.lower() == column.lower() for c in columns):
            raise ValueError(
                f"time_partition_pattern {pattern!r}: two segments make the column {column!r}; "
                "name them Hive style (name=%H)"
            )
        columns.append(TimePartitionColumn(column, body, tuple(parts)))
    return tuple(columns)
