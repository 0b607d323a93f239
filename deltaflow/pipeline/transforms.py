"""Transforms (:mod:`deltaflow.config.transforms`) on Spark: columns where they compile, else
the per-message JMESPath evaluator in an Arrow UDF.

Field paths, ``kafka.<field>`` and the custom functions over a field path become column
expressions of the micro-batch's plan (:func:`column`), no Python per row; which forms do is
decided by :func:`deltaflow.io.arrow_transforms.vectorised`, as on the Arrow engine. Every other
JMESPath expression runs through :func:`deltaflow.io.jmespath_eval.evaluate` in an Arrow UDF
over the row, the same function the Arrow engine calls, so both engines give the same values
and the same failures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from deltaflow.config.transforms import Transform
from deltaflow.io.arrow_transforms import vectorised
from deltaflow.io.jmespath_eval import NUMBER, epoch_bounds, out_of_range

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = ["apply_transforms", "column", "failure"]

#: Columns the per-message evaluator does not see (the ingest frame's bookkeeping struct).
_HIDDEN_PREFIX = "_deltaflow"
#: The temporary column holding a per-message transform's ``struct<value, error>``.
_RESULT = "_deltaflow_transform_result"
_UNIT_MICROS = {"seconds": 1_000_000, "millis": 1000, "micros": 1, "millis_to_micro": 1000}


def column(t: Transform) -> Column:
    """The Spark column computing ``t``'s source, for the forms that compile to columns (over
    decoded fields plus ``kafka``); see :func:`apply_transforms` for the others."""
    from pyspark.sql import functions as F  # noqa: N812

    if (sql := t.sql) is not None:
        return F.expr(sql)
    if (sub := t.substr) is not None:
        path, skip, take = sub
        return F.substring(_field(path), skip + 1, take)
    if (epoch := t.epoch) is not None:
        unit, path = epoch
        return _epoch(_number(_field(path)), unit)
    if (names := t.field) is not None:
        return _field(names)
    raise t.not_understood("it is evaluated per message")


def _number(value: Column) -> Column:
    """A number or string column as a double where its text is a finite number (:data:`NUMBER`;
    Infinity and NaN give null, as on Arrow)."""
    from pyspark.sql import functions as F  # noqa: N812

    text = value.cast("string")
    # Cast only what holds a number (an ANSI cast of other text raises); a string such as
    # 1e400 holds one, but no finite double.
    number = F.when(text.rlike(NUMBER), F.trim(text).cast("double"))
    return F.when(~F.isnan(number) & (F.abs(number) < F.lit(float("inf"))), number)


def _within(number: Column, unit: str) -> Column:
    """Whether an ``epoch_*`` argument lies within :func:`~deltaflow.io.jmespath_eval.epoch_bounds`
    (the doubles the Arrow engine compares with)."""
    from pyspark.sql import functions as F  # noqa: N812

    low, high = epoch_bounds(unit)
    return (number > F.lit(low)) & (number < F.lit(high))


def _epoch(number: Column, unit: str) -> Column:
    from pyspark.sql import functions as F  # noqa: N812

    # Truncated toward zero; out of the bounds null (and the row fails: see failure()).
    micros = F.when(_within(number, unit), number.try_cast("long")) * F.lit(_UNIT_MICROS[unit])
    if unit == "millis_to_micro":
        return micros
    fraction = F.pmod(micros, F.lit(1_000_000))
    seconds = ((micros - fraction) / 1_000_000).cast("long")
    text = F.date_format(F.timestamp_seconds(seconds), "yyyy-MM-dd'T'HH:mm:ss")
    digits = (
        F.when(fraction == 0, F.lit(""))
        .when(
            fraction % 1000 == 0,
            F.concat(F.lit("."), F.lpad((fraction / 1000).cast("long").cast("string"), 3, "0")),
        )
        .otherwise(F.concat(F.lit("."), F.lpad(fraction.cast("string"), 6, "0")))
    )
    return F.concat(text, digits, F.lit("Z"))


def failure(t: Transform, schema: pa.Schema) -> Column | None:
    """A column holding why the compiled form of ``t`` failed for a row of ``schema`` (else
    null), where it can fail: an ``epoch_*`` function given a string that holds no number, or
    a number out of its bounds (the row then goes to the dead-letter table instead of landing
    with a null), as on the Arrow engine."""
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.io.arrow_transforms import field_type

    if (epoch := t.epoch) is None:
        return None
    unit, path = epoch
    value = _field(path)
    target = ".".join(t.target)
    function = t.ast["value"]
    number = _number(value)
    outside = F.when(
        number.isNotNull() & ~_within(number, unit),
        F.lit(f"transform {target!r}: {out_of_range(function, unit)}"),
    )
    if not pa.types.is_string(field_type(schema, path)):
        return outside
    text = value.cast("string")
    return F.when(
        value.isNotNull() & ~text.rlike(NUMBER),
        F.concat(F.lit(f"transform {target!r}: {function}: not a number: "), text),
    ).otherwise(outside)


def _field(path: Sequence[str]) -> Column:
    from pyspark.sql import functions as F  # noqa: N812

    return F.col(".".join("`" + p.replace("`", "``") + "`" for p in path))


def apply_transforms(
    df: DataFrame,
    transforms: Sequence[Transform],
    *,
    table_schema: pa.Schema | None = None,
    errors: str | None = None,
) -> DataFrame:
    """Add or replace each target column (in order) of ``df``; missing structs are created.

    Args:
        df: The decoded rows with the ``kafka`` struct.
        transforms: Applied in order, each seeing the earlier ones' targets.
        table_schema: The table's schema, if it exists: a per-message result is coerced into
            its type at the target (else :func:`~deltaflow.io.arrow_transforms.result_type`).
        errors: A string column of ``df`` into which each row's first transform failure is
            coalesced (without it, a failing transform leaves a null).
    """
    from pyspark.sql import functions as F  # noqa: N812

    from deltaflow.delta.schema import spark_to_arrow

    pending = list(transforms)
    while pending:
        schema = spark_to_arrow(df.schema)
        t = pending[0]
        if t.sql is not None or vectorised(t, schema):
            pending.pop(0)
            failed = failure(t, schema)
            if errors is not None and failed is not None:
                df = df.withColumn(errors, F.coalesce(F.col(errors), failed))
            df = _set_path(df, t.target, column(t))
            continue
        # A run of per-message transforms: one UDF (one pass through Python) for all of them.
        run = []
        while pending and pending[0].sql is None and not vectorised(pending[0], schema):
            run.append(pending.pop(0))
        df = _per_message(df, run, table_schema, errors)
    return df


def _per_message(
    df: DataFrame, run: list[Transform], table_schema: pa.Schema | None, errors: str | None
) -> DataFrame:
    """``run`` applied by an Arrow UDF that calls the Arrow engine's
    :func:`~deltaflow.io.arrow_transforms.apply` on each batch of rows: the same code, so
    the same values and failures on both engines."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.pandas.functions import arrow_udf
    from pyspark.sql.pandas.types import from_arrow_type
    from pyspark.sql.types import StringType, StructField, StructType

    from deltaflow.delta.schema import spark_to_arrow
    from deltaflow.io.arrow_transforms import check

    inputs = [c for c in df.columns if not c.startswith(_HIDDEN_PREFIX)]
    schema = spark_to_arrow(df.select(*(_quoted(c) for c in inputs)).schema)
    produced = check(schema, run, table_schema)
    roots = list(dict.fromkeys(t.target[0] for t in run))
    returns = StructType(
        [
            *(
                StructField(f"v{i}", from_arrow_type(produced.field(root).type))
                for i, root in enumerate(roots)
            ),
            StructField("error", StringType()),
        ]
    )
    targets, sources = [t.target for t in run], [t.source for t in run]
    # Non-deterministic: Spark evaluates it once, not again for each reference to its result.
    udf = arrow_udf(_evaluator(targets, sources, roots, table_schema), returns).asNondeterministic()  # type: ignore[call-overload]
    df = df.withColumn(_RESULT, udf(F.struct(*(_quoted(c) for c in inputs))))
    if errors is not None:
        df = df.withColumn(errors, F.coalesce(F.col(errors), F.col(f"{_RESULT}.error")))
    for i, root in enumerate(roots):
        df = df.withColumn(root, F.col(f"{_RESULT}.v{i}"))
    return df.drop(_RESULT)


def _quoted(name: str) -> Column:
    from pyspark.sql import functions as F  # noqa: N812

    return F.col("`" + name.replace("`", "``") + "`")


def _evaluator(
    targets: list[tuple[str, ...]], sources: list[str], roots: list[str], table_schema: pa.Schema | None
) -> Callable[[pa.Array], pa.Array]:
    """The UDF's function (a closure: cloudpickle carries it to the Python workers)."""

    def run(rows: pa.Array) -> pa.Array:
        from deltaflow.config.transforms import Transform
        from deltaflow.io.arrow_transforms import apply

        assert isinstance(rows, pa.StructArray)
        transforms = [Transform(target, src) for target, src in zip(targets, sources, strict=True)]
        out, failed = apply(pa.Table.from_struct_array(rows), transforms, target_schema=table_schema)
        if failed is None:
            error = pa.nulls(len(rows), pa.string())
        else:
            error = failed.combine_chunks() if isinstance(failed, pa.ChunkedArray) else failed
        columns = [out.column(root).combine_chunks() for root in roots]
        names = [f"v{i}" for i in range(len(roots))]
        return pa.StructArray.from_arrays([*columns, error], names=[*names, "error"])

    return run


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
