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
the pipeline runner evaluates :attr:`TimePartitionColumn.spark_format` with Spark's
``date_format``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["DIRECTIVES", "TimePartitionColumn", "parse_time_pattern"]

#: strftime directives a pattern may use: (column name, Spark datetime pattern).
DIRECTIVES: dict[str, tuple[str, str]] = {
    "Y": ("year", "yyyy"),
    "m": ("month", "MM"),
    "d": ("day", "dd"),
    "H": ("hour", "HH"),
    "M": ("minute", "mm"),
    "S": ("second", "ss"),
    "j": ("day_of_year", "DDD"),
    "F": ("date", "yyyy-MM-dd"),
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class TimePartitionColumn:
    """One partition column made from the event time.

    Attributes:
        name: The column's name.
        strftime: Its segment of the pattern (``%H``).
        spark_format: The same as a Spark datetime pattern (``HH``), literal text quoted.
    """

    name: str
    strftime: str
    spark_format: str


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
        names, spark, literal, i = [], "", "", 0
        while i < len(body):
            if body[i] != "%":
                literal += body[i]
                i += 1
                continue
            code = body[i + 1 : i + 2]
            if code == "%":
                literal += "%"
            elif code in DIRECTIVES:
                spark += _quote(literal)
                literal = ""
                names.append(DIRECTIVES[code][0])
                spark += DIRECTIVES[code][1]
            else:
                raise ValueError(
                    f"time_partition_pattern {pattern!r}: %{code} is not supported; use {supported} "
                    "(and %% for a percent sign)"
                )
            i += 2
        spark += _quote(literal)
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
        columns.append(TimePartitionColumn(column, body, spark))
    return tuple(columns)


def _quote(literal: str) -> str:
    """Literal text inside a Spark datetime pattern."""
    return "'" + literal.replace("'", "''") + "'" if literal else ""
