"""Synthetic clickstream events as a Spark streaming source (``deltaflow-generator``).

Every value is a function of the row id and the seed, so a replayed micro-batch produces the
same rows (exactly-once tests and benchmarks can check the result). Offsets are
``{"rows": <rows produced so far>, "started_ms": <first start, epoch ms>}``; ``event_time`` of
row ``id`` is ``started_ms + id / rows_per_second`` seconds.

Rows appear at ``rows_per_second`` from the moment the reader starts (no burst of everything
"missed" while the pipeline was down). ``total_rows`` ends production; with it, an
``availableNow`` trigger produces all remaining rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np
import pyarrow as pa
from pydantic import Field
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from deltaflow.config.models import SparkOptions
from deltaflow.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["FORMAT_NAME", "GENERATOR_SCHEMA", "GeneratorDataSource", "generate"]

FORMAT_NAME = "deltaflow-generator"

GENERATOR_SCHEMA = (
    "id BIGINT, event_time TIMESTAMP, user_id BIGINT, session_id STRING, event_type STRING, "
    "page STRING, country STRING, amount DOUBLE"
)
EVENT_TYPES = ("view", "click", "add_to_cart", "purchase")
COUNTRIES = ("DE", "FR", "US", "GB", "ES", "IT", "NL", "PL")
#: Rows per Arrow batch a task yields.
CHUNK_ROWS = 65_536

Offset = dict[str, int]


@dataclass(frozen=True)
class _Range(InputPartition):
    start: int
    end: int
    started_ms: int
    rows_per_second: float
    seed: int


class GeneratorOptions(SparkOptions):
    """Options of the generator source."""

    what: ClassVar[str] = "the generator source"

    rows_per_second: float = Field(default=1000.0, gt=0)
    total_rows: int | None = Field(default=None, ge=0)
    rows_per_batch: int | None = Field(default=None, ge=1)
    partitions: int = Field(default=2, ge=1)
    seed: int = 0


class GeneratorDataSource(DataSource):
    """Options: ``rows_per_second``, ``total_rows``, ``rows_per_batch``, ``partitions``, ``seed``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return GENERATOR_SCHEMA

    def streamReader(self, schema: StructType) -> GeneratorStreamReader:  # noqa: N802
        o = GeneratorOptions.from_spark_options(self.options)
        return GeneratorStreamReader(
            rows_per_second=o.rows_per_second,
            total_rows=o.total_rows,
            rows_per_batch=o.rows_per_batch,
            partitions=o.partitions,
            seed=o.seed,
        )


class GeneratorStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(
        self,
        *,
        rows_per_second: float,
        total_rows: int | None,
        rows_per_batch: int | None,
        partitions: int,
        seed: int,
    ) -> None:
        if rows_per_second <= 0 or partitions < 1:
            raise ConfigError("generator: rows_per_second must be > 0 and partitions >= 1")
        self._rate = rows_per_second
        self._total = total_rows
        self._per_batch = rows_per_batch
        self._partitions = partitions
        self._seed = seed
        self._clock: tuple[int, float] | None = None  # (rows at the first plan, monotonic time)
        self._available_now = False

    def initialOffset(self) -> Offset:  # noqa: N802
        return {"rows": 0, "started_ms": int(time.time() * 1000)}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        if self._total is None:
            raise ConfigError(
                "the generator source produces rows forever: set total_rows to run it with "
                "--once/--available-now"
            )
        self._available_now = True

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self._per_batch) if self._per_batch else ReadAllAvailable()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802
        rows = int(start["rows"])
        if self._available_now:
            end = int(self._total or 0)
        else:
            if self._clock is None:
                self._clock = (rows, time.monotonic())
            base, since = self._clock
            end = base + int((time.monotonic() - since) * self._rate)
            if self._total is not None:
                end = min(end, self._total)
        end = max(end, rows)
        if isinstance(limit, ReadMaxRows):
            end = min(end, rows + limit.max_rows)
        return {"rows": end, "started_ms": int(start["started_ms"])}

    def partitions(self, start: Offset, end: Offset) -> list[_Range]:
        first, last = int(start["rows"]), int(end["rows"])
        count = last - first
        if count <= 0:
            return []
        n = min(self._partitions, count)
        bounds = [first + count * i // n for i in range(n + 1)]
        return [
            _Range(bounds[i], bounds[i + 1], int(end["started_ms"]), self._rate, self._seed) for i in range(n)
        ]

    def commit(self, end: Offset) -> None:
        pass

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Range)
        for lo in range(partition.start, partition.end, CHUNK_ROWS):
            hi = min(partition.end, lo + CHUNK_ROWS)
            yield generate(lo, hi, partition.started_ms, partition.rows_per_second, partition.seed)


def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """A splitmix64 step: well-spread 64-bit values from ids (wrapping uint64 arithmetic)."""
    z = x + np.uint64((0x9E3779B97F4A7C15 * (salt + 1)) & 0xFFFFFFFFFFFFFFFF)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def generate(start: int, end: int, started_ms: int, rows_per_second: float, seed: int) -> pa.RecordBatch:
    """Rows ``[start, end)``: the same values for the same ids and seed, always."""
    ids = np.arange(start, end, dtype=np.int64)
    u = ids.astype(np.uint64) + np.uint64(seed * 1_000_003)
    h = [_mix(u, k) for k in range(6)]
    kind = (h[2] % np.uint64(100)).astype(np.int64)
    event_index = np.select([kind < 60, kind < 85, kind < 95], [0, 1, 2], default=3)
    event_us = started_ms * 1000 + (ids * 1_000_000 / rows_per_second).astype(np.int64)
    amount = np.where(event_index == 3, (h[5] % np.uint64(100_000)).astype(np.float64) / 100, 0.0)
    pages = np.char.add("/p/", (h[3] % np.uint64(500)).astype(str))
    sessions = np.char.add("s-", np.char.zfill((h[1] % np.uint64(1_000_000)).astype(str), 6))
    return pa.RecordBatch.from_arrays(
        [
            pa.array(ids),
            pa.array(event_us, type=pa.timestamp("us", tz="UTC")),
            pa.array((h[0] % np.uint64(10_000)).astype(np.int64)),
            pa.array(sessions.astype(object), type=pa.string()),
            pa.array(np.array(EVENT_TYPES, dtype=object)[event_index], type=pa.string()),
            pa.array(pages.astype(object), type=pa.string()),
            pa.array(np.array(COUNTRIES, dtype=object)[(h[4] % np.uint64(len(COUNTRIES))).astype(np.int64)]),
            pa.array(amount),
        ],
        names=["id", "event_time", "user_id", "session_id", "event_type", "page", "country", "amount"],
    )
