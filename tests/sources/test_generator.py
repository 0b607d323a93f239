"""``deltaflow.sources.generator``: deterministic rows, pacing, admission control, availableNow."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from deltaflow.errors import ConfigError
from deltaflow.sources.generator import COUNTRIES, EVENT_TYPES, GeneratorStreamReader, generate


def test_rows_are_a_function_of_id_and_seed():
    whole = pa.Table.from_batches([generate(0, 1000, 0, 100.0, 7)])
    split = pa.Table.from_batches([generate(0, 400, 0, 100.0, 7), generate(400, 1000, 0, 100.0, 7)])
    assert whole.equals(split)  # a replayed or re-split range is the same rows
    other_seed = pa.Table.from_batches([generate(0, 1000, 0, 100.0, 8)])
    assert not whole.column("user_id").equals(other_seed.column("user_id"))
    assert whole.column("id").to_pylist() == list(range(1000))
    assert set(whole.column("event_type").to_pylist()) == set(EVENT_TYPES)
    assert set(whole.column("country").to_pylist()) <= set(COUNTRIES)
    # event_time of row id is started_ms + id / rows_per_second
    times = whole.column("event_time").cast(pa.int64()).to_pylist()
    assert times[0] == 0 and times[100] == 1_000_000
    purchases = whole.filter(pc.equal(whole.column("event_type"), "purchase"))
    assert pc.min(purchases.column("amount")).as_py() >= 0 and purchases.num_rows > 0
    others = whole.filter(pc.not_equal(whole.column("event_type"), "purchase"))
    assert set(others.column("amount").to_pylist()) == {0.0}


def _reader(**kw):
    base = {"rows_per_second": 1000.0, "total_rows": None, "rows_per_batch": None, "partitions": 3, "seed": 0}
    return GeneratorStreamReader(**{**base, **kw})


def test_available_now_produces_every_remaining_row_capped_by_the_read_limit():
    reader = _reader(total_rows=1000, rows_per_batch=300)
    assert isinstance(reader, DataSourceStreamReader)
    reader.prepareForTriggerAvailableNow()
    start = reader.initialOffset()
    ends = []
    while not ends or ends[-1]["rows"] < 1000:
        end = reader.latestOffset(start if not ends else ends[-1], reader.getDefaultReadLimit())
        ends.append(end)
    assert [e["rows"] for e in ends] == [300, 600, 900, 1000]
    parts = reader.partitions({"rows": 900, "started_ms": 5}, ends[-1])
    assert [(p.start, p.end) for p in parts] == [(900, 933), (933, 966), (966, 1000)]
    assert reader.latestOffset(ends[-1], ReadAllAvailable())["rows"] == 1000  # then nothing more


def test_rows_appear_at_the_rate_from_the_first_plan_not_in_a_burst():
    reader = _reader(rows_per_second=1e9)
    start = {"rows": 5_000, "started_ms": 0}  # restarted after downtime
    first = reader.latestOffset(start, ReadMaxRows(10))
    assert 5_000 <= first["rows"] <= 5_010  # capped, and no catch-up of the downtime


def test_endless_generator_refuses_available_now_and_bad_settings():
    with pytest.raises(ConfigError, match="set total_rows"):
        _reader().prepareForTriggerAvailableNow()
    with pytest.raises(ConfigError, match="rows_per_second must be > 0"):
        _reader(rows_per_second=0)


def test_a_stream_of_the_generator_lands_every_row_once(spark, tmp_path):
    from deltalake import DeltaTable

    import deltaflow

    deltaflow.register(spark)
    df = (
        spark.readStream.format("deltaflow-generator")
        .option("rows_per_second", "1000")
        .option("total_rows", "2500")
        .option("rows_per_batch", "1000")
        .load()
    )
    query = deltaflow.write_stream(df, str(tmp_path / "t"), pipeline_id="gen", trigger={"availableNow": True})
    query.awaitTermination()
    ids = DeltaTable(str(tmp_path / "t")).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(2500))
    assert DeltaTable(str(tmp_path / "t")).version() >= 3  # claim + batches of at most 1000 rows
