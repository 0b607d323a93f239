"""``deltaflow.ops.optimize``: compaction and Z-order on real Delta tables, read back by other engines."""

from __future__ import annotations

import random

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow import ops
from deltaflow.errors import ConfigError
from tests.fixtures.tables import ids as _ids
from tests.fixtures.tables import small_file_table as _small_file_table


def _overlapping_files(path, low: int, high: int) -> int:
    adds = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True)).to_pylist()
    return sum(1 for a in adds if not (a["max.x"] < low or a["min.x"] > high))


def test_optimize_compacts_small_files_and_every_reader_sees_the_same_rows(tmp_path, duck):
    table = tmp_path / "t"
    _small_file_table(table)
    before = DeltaTable(str(table))
    assert len(before.file_uris()) == 24  # 12 appends x 2 partitions

    result = ops.optimize(str(table))
    assert (result.files_removed, result.files_added, result.partitions_optimized) == (24, 2, 2)
    assert result.bytes_removed > 0 and result.bytes_added > 0
    after = DeltaTable(str(table))
    assert len(after.file_uris()) == 2
    assert after.version() == before.version() + 1
    assert after.history(1)[0]["operation"] == "OPTIMIZE"
    expected = list(range(600))
    assert _ids(table) == expected
    assert sorted(pl.read_delta(str(table))["id"].to_list()) == expected
    got = duck.execute(f"SELECT id FROM delta_scan('{table}') ORDER BY id").fetchall()
    assert [r[0] for r in got] == expected
    assert after.transaction_version("pipe") == 11  # a stream's progress survives compaction
    # Idempotent: nothing left to compact.
    assert ops.optimize(str(table)).files_removed == 0


def test_optimize_where_compacts_only_the_selected_partition(tmp_path):
    table = tmp_path / "t"
    _small_file_table(table)
    result = ops.optimize(str(table), where="day = '2026-11-21'")
    assert (result.files_removed, result.files_added) == (12, 1)
    adds = pa.table(DeltaTable(str(table)).get_add_actions(flatten=True)).to_pylist()
    per_day: dict[str, int] = {}
    for a in adds:
        per_day[a["partition.day"]] = per_day.get(a["partition.day"], 0) + 1
    assert per_day == {"2026-11-20": 12, "2026-11-21": 1}
    assert _ids(table) == list(range(600))


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("v = 1", "'v' in --where is not a partition column; partition columns: day"),
        ("day ~ 'x'", "cannot read"),
        ("day IN 'x'", "IN needs a list in parentheses"),
        ("day = 'x", "unbalanced quote"),
    ],
)
def test_optimize_where_errors_name_the_problem(tmp_path, where, message):
    table = tmp_path / "t"
    _small_file_table(table, batches=1)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ops.optimize(str(table), where=where)


@pytest.mark.parametrize(
    ("where", "message"),
    [("day = 'x' AND", "cannot read the value"), ("day = x y", "cannot read the value")],
)
def test_partition_predicate_leftovers_are_refused(where, message):
    with pytest.raises(ConfigError, match=message):
        ops.parse_partition_predicate(where, ["day"])


def test_partition_predicate_parsing():
    assert ops.parse_partition_predicate("day == '2026-11-22'", ["day"]) == [("day", "=", "2026-11-22")]
    parsed = ops.parse_partition_predicate(
        "day = 'a and b' AND `day` IN ('x', 'it''s') and day != 3 AND day NOT IN ('q')", ["day"]
    )
    assert parsed == [
        ("day", "=", "a and b"),
        ("day", "in", ["x", "it's"]),
        ("day", "!=", "3"),
        ("day", "not in", ["q"]),
    ]


def test_zorder_lets_a_range_predicate_skip_more_files(tmp_path):
    table = tmp_path / "t"
    rng = random.Random(7)
    for _ in range(8):
        n = 25_000
        write_deltalake(
            str(table),
            pa.table(
                {
                    "x": [rng.randrange(1_000_000) for _ in range(n)],
                    "y": [rng.randrange(1_000_000) for _ in range(n)],
                }
            ),
            mode="append",
        )
    low, high = 100_000, 150_000
    assert _overlapping_files(table, low, high) == 8  # random data: every file may hold the range
    result = ops.optimize(str(table), zorder=["x", "y"], target_size="256KB")
    assert result.mode == "zorder" and result.files_added > 8
    total = len(DeltaTable(str(table)).file_uris())
    overlapping = _overlapping_files(table, low, high)
    assert overlapping < total / 2, (overlapping, total)
    data = DeltaTable(str(table)).to_pyarrow_table()
    assert data.num_rows == 200_000
    with pytest.raises(ConfigError, match="'z' is not in the table"):
        ops.optimize(str(table), zorder=["z"])
