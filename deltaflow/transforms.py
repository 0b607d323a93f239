"""kafka-delta-ingest style transforms, compiled to Spark column expressions (never Python per row).

A transform is ``"target: source"``. ``target`` is a dotted column path (nested structs are
created as needed). ``source`` is one of:

* ``kafka.partition``, ``kafka.offset``, ``kafka.topic``, ``kafka.timestamp``, ``kafka.key``,
  ``kafka.headers``: the message's coordinates and metadata;
* a field path of the decoded JSON value, e.g. ``meta.producer.timestamp``;
* ``substr(path, `start`, `end`)``: characters ``[start, end)`` of a string field;
* ``epoch_seconds_to_iso8601(path)`` / ``epoch_millis_to_iso8601(path)``: an epoch number as an
  ISO-8601 UTC string;
* ``sql: <expression>``: any Spark SQL expression over the decoded fields and ``kafka``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deltaflow.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["KAFKA_FIELDS", "Transform", "apply_transforms", "parse_transform"]

KAFKA_FIELDS = ("partition", "offset", "topic", "timestamp", "key", "headers")

_PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_SUBSTR = re.compile(rf"^substr\(\s*({_PATH})\s*,\s*`?(\d+)`?\s*,\s*`?(\d+)`?\s*\)$")
_EPOCH = re.compile(rf"^epoch_(seconds|millis)_to_iso8601\(\s*({_PATH})\s*\)$")
_FIELD = re.compile(rf"^{_PATH}$")
#: ``kafka.<field>`` anywhere in a source (backticks allowed), and ``kafka`` on its own.
_KAFKA_FIELD = re.compile(r"(?<![\w.`])`?kafka`?\s*\.\s*`?(\w+)", re.IGNORECASE)
_NOT_UNDERSTOOD = (
    "transform source {src!r} is not understood; use kafka.<" + "|".join(KAFKA_FIELDS) + ">, a field "
    "path, substr(path, `start`, `end`), epoch_seconds_to_iso8601(path), epoch_millis_to_iso8601(path) "
    "or 'sql: <Spark SQL expression>'"
)
_WHOLE_KAFKA = re.compile(r"(?<![\w.`])`?kafka`?(?![`\w]|\s*\.)", re.IGNORECASE)


@dataclass(frozen=True)
class Transform:
    """One ``target: source`` mapping."""

    target: tuple[str, ...]
    source: str

    def column(self) -> Column:
        """The Spark column computing the source (over decoded fields plus ``kafka``)."""
        from pyspark.sql import functions as F  # noqa: N812

        src = self.source
        if src.startswith("sql:"):
            return F.expr(src[len("sql:") :].strip())
        if (m := _SUBSTR.match(src)) is not None:
            start, end = int(m.group(2)), int(m.group(3))
            return F.substring(_field(m.group(1)), start + 1, max(0, end - start))
        if (m := _EPOCH.match(src)) is not None:
            seconds = _field(m.group(2)).try_cast("double")
            if m.group(1) == "millis":
                seconds = seconds / 1000
            pattern = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX" if m.group(1) == "millis" else "yyyy-MM-dd'T'HH:mm:ssXXX"
            return F.date_format(F.timestamp_seconds(seconds), pattern)
        if _FIELD.match(src):
            return _field(src)
        raise ConfigError(_NOT_UNDERSTOOD.format(src=src), transform=src)

    def check(self) -> None:
        """Raise :class:`ConfigError` when the source has none of the accepted forms (no Spark)."""
        src = self.source
        if src.startswith("sql:"):
            if not src[len("sql:") :].strip():
                raise ConfigError(f"transform {'.'.join(self.target)!r}: 'sql:' needs an expression")
            return
        if not (_SUBSTR.match(src) or _EPOCH.match(src) or _FIELD.match(src)):
            raise ConfigError(_NOT_UNDERSTOOD.format(src=src), transform=src)

    def kafka_fields(self) -> frozenset[str]:
        """The ``kafka`` struct's fields this transform reads, wherever the source names them
        (``kafka.key``, ``substr(kafka.key, ...)``, SQL); the whole struct: every field."""
        src = self.source.removeprefix("sql:")
        if _WHOLE_KAFKA.search(src):
            return frozenset(KAFKA_FIELDS)
        return frozenset(m.lower() for m in _KAFKA_FIELD.findall(src)) & frozenset(KAFKA_FIELDS)

    def failure(self) -> Column | None:
        """A column holding why this transform failed for a row (else null), where it can fail.

        The epoch conversions fail on a value that is not a number; the row then goes to the
        dead-letter table instead of landing with a null.
        """
        from pyspark.sql import functions as F  # noqa: N812

        if (m := _EPOCH.match(self.source)) is not None:
            value = _field(m.group(2))
            target = ".".join(self.target)
            return F.when(
                value.isNotNull() & value.try_cast("double").isNull(),
                F.concat(
                    F.lit(f"transform {target!r}: {m.group(2)} is not a number: "), value.cast("string")
                ),
            )
        return None


def _field(path: str) -> Column:
    from pyspark.sql import functions as F  # noqa: N812

    return F.col(".".join(f"`{p}`" for p in path.split(".")))


def parse_transform(text: str) -> Transform:
    """Parse ``"target: source"`` (kafka-delta-ingest's ``--transform`` syntax)."""
    target, sep, source = text.partition(":")
    target, source = target.strip(), source.strip()
    if not sep or not target or not source or not _FIELD.match(target):
        raise ConfigError(
            f"transform {text!r} must look like 'target.path: source', e.g. 'meta.offset: kafka.offset'",
            transform=text,
        )
    return Transform(tuple(target.split(".")), source)


def apply_transforms(df: DataFrame, transforms: Sequence[Transform]) -> DataFrame:
    """Add or replace each target column (in order) of ``df``; missing structs are created."""
    for t in transforms:
        df = _set_path(df, t.target, t.column())
    return df


def _set_path(df: DataFrame, path: tuple[str, ...], value: Column) -> DataFrame:
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StructType

    root = path[0]
    if len(path) == 1 or root not in df.columns:
        for name in reversed(path[1:]):
            value = F.struct(value.alias(name))
        return df.withColumn(root, value)
    # Walk down the structs that exist; withField creates only the last level itself.
    depth, dtype = 1, df.schema[root].dataType
    while depth < len(path) - 1 and isinstance(dtype, StructType) and path[depth] in dtype.fieldNames():
        dtype = dtype[path[depth]].dataType
        depth += 1
    for name in reversed(path[depth + 1 :]):
        value = F.struct(value.alias(name))
    return df.withColumn(root, F.col(root).withField(".".join(path[1 : depth + 1]), value))
