"""Transforms (:mod:`deltaflow.config.transforms`) compiled to Spark column expressions.

Never Python per row: each transform becomes one column expression of the micro-batch's plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from deltaflow.config.transforms import Transform

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["apply_transforms", "column", "failure"]


def column(t: Transform) -> Column:
    """The Spark column computing ``t``'s source (over decoded fields plus ``kafka``)."""
    from pyspark.sql import functions as F  # noqa: N812

    if (sql := t.sql) is not None:
        return F.expr(sql)
    if (sub := t.substr) is not None:
        text, start, end = sub
        return F.substring(_field(text), start + 1, max(0, end - start))
    if (epoch := t.epoch) is not None:
        unit, number = epoch
        seconds = _field(number).try_cast("double")
        if unit == "millis":
            seconds = seconds / 1000
        pattern = "yyyy-MM-dd'T'HH:mm:ss.SSSXXX" if unit == "millis" else "yyyy-MM-dd'T'HH:mm:ssXXX"
        return F.date_format(F.timestamp_seconds(seconds), pattern)
    if (path := t.field) is not None:
        return _field(path)
    raise t.not_understood()


def failure(t: Transform) -> Column | None:
    """A column holding why ``t`` failed for a row (else null), where it can fail.

    The epoch conversions fail on a value that is not a number; the row then goes to the
    dead-letter table instead of landing with a null.
    """
    from pyspark.sql import functions as F  # noqa: N812

    if (epoch := t.epoch) is not None:
        value = _field(epoch[1])
        target = ".".join(t.target)
        return F.when(
            value.isNotNull() & value.try_cast("double").isNull(),
            F.concat(F.lit(f"transform {target!r}: {epoch[1]} is not a number: "), value.cast("string")),
        )
    return None


def _field(path: str) -> Column:
    from pyspark.sql import functions as F  # noqa: N812

    return F.col(".".join(f"`{p}`" for p in path.split(".")))


def apply_transforms(df: DataFrame, transforms: Sequence[Transform]) -> DataFrame:
    """Add or replace each target column (in order) of ``df``; missing structs are created."""
    for t in transforms:
        df = _set_path(df, t.target, column(t))
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
