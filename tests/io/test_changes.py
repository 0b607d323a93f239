"""Row changes folded into the last state per key (the Debezium mirrors' combiner), and staged."""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from deltaflow.io.changes import (
    OP_COLUMN,
    PRESENT_PREFIX,
    SEQUENCE_COLUMN,
    TRUNCATED_METADATA,
    ChangeFold,
)

SCHEMA = pa.schema([("id", pa.int32()), ("name", pa.string()), ("n", pa.int64())])


def _rows(table: pa.Table) -> dict:
    out = {}
    for row in table.to_pylist():
        out[row["id"]] = row
    return out


def test_an_update_without_a_column_keeps_what_the_fold_knew_and_flags_what_it_did_not():
    fold = ChangeFold(["id"], SCHEMA)
    fold.add("upsert", ["id"], (1,), {"id": 1, "name": "a", "n": 1}, 10)
    fold.add("upsert", ["id"], (1,), {"id": 1, "n": 2}, 11)  # name not sent
    fold.add("upsert", ["id"], (2,), {"id": 2, "n": 5}, 12)  # name not sent, nothing known of it
    table = fold.to_table(SCHEMA)
    rows = _rows(table)
    assert rows[1]["name"] == "a" and rows[1]["n"] == 2
    assert rows[1][PRESENT_PREFIX + "name"] is True
    assert rows[2][PRESENT_PREFIX + "name"] is False  # the merge keeps the table's value
    assert PRESENT_PREFIX + "n" not in table.column_names  # every row carries n
    assert rows[1][SEQUENCE_COLUMN] == Decimal(11)
    assert table.schema.field("id").type == pa.int32()


def test_deletes_reinserts_and_older_changes():
    fold = ChangeFold(["id"], SCHEMA)
    fold.add("upsert", ["id"], (1,), {"id": 1, "name": "a", "n": 1}, 10)
    fold.add("delete", ["id"], (1,), None, 11)
    fold.add("upsert", ["id"], (2,), {"id": 2, "name": "b", "n": 1}, 12)
    fold.add("delete", ["id"], (2,), {"id": 2}, 13)
    fold.add("upsert", ["id"], (2,), {"id": 2, "name": "b again", "n": 2}, 14)
    fold.add("upsert", ["id"], (2,), {"id": 2, "name": "older", "n": 0}, 9)  # a late, older change
    rows = _rows(fold.to_table(SCHEMA))
    assert rows[1][OP_COLUMN] == "delete"
    assert rows[2][OP_COLUMN] == "upsert" and rows[2]["name"] == "b again"


def test_a_truncate_drops_the_older_states_and_is_staged_for_the_table():
    fold = ChangeFold(["id"], SCHEMA)
    fold.add("upsert", ["id"], (1,), {"id": 1, "name": "a", "n": 1}, 10)
    fold.add("truncate", (), (), None, 20)
    fold.add("upsert", ["id"], (2,), {"id": 2, "name": "b", "n": 1}, 30)
    table = fold.to_table(SCHEMA)
    assert sorted(_rows(table)) == [2]
    assert table.schema.metadata[TRUNCATED_METADATA] == b"20"
    only = ChangeFold(["id"], SCHEMA)
    only.add("truncate", (), (), None, 5)
    assert only and not only.rows()


def test_two_tasks_folds_combine_in_sequence_order_whatever_their_order():
    early, late = ChangeFold(["id"], SCHEMA), ChangeFold(["id"], SCHEMA)
    early.add("upsert", ["id"], (1,), {"id": 1, "name": "a", "n": 1}, 10)
    early.add("upsert", ["id"], (3,), {"id": 3, "name": "c", "n": 3}, 11)
    late.add("upsert", ["id"], (1,), {"id": 1, "n": 2}, 20)  # name not sent: the earlier one holds
    late.add("truncate", (), (), None, 12)  # after 3's insert (in the other task's file)
    late.add("upsert", ["id"], (4,), {"id": 4, "name": "d", "n": 4}, 21)
    for order in ([early, late], [late, early]):
        combined = ChangeFold()
        combined.add_staged([f.to_table(SCHEMA) for f in order])
        rows = _rows(combined.to_table(SCHEMA))
        assert rows == {
            1: {"id": 1, "name": "a", "n": 2, OP_COLUMN: "upsert", SEQUENCE_COLUMN: Decimal(20)},
            4: {"id": 4, "name": "d", "n": 4, OP_COLUMN: "upsert", SEQUENCE_COLUMN: Decimal(21)},
        }
        assert combined.truncated_below == 12


def test_what_cannot_join_the_fold_says_why():
    fold = ChangeFold(["id"], SCHEMA)
    wide = pa.schema([("id", pa.int32()), ("n", pa.string())])
    assert "column 'n' is string in this change, and the mirror's column is int64" in (
        fold.check(["id"], {"id": 1, "n": "seven"}, wide) or ""
    )
    assert fold.check(["id"], {"id": 1, "n": 7}, pa.schema([("id", pa.int32()), ("n", pa.int32())])) is None
    assert "key columns ['name']" in (fold.check(["name"], {"name": "x"}, None) or "")


def test_a_change_without_a_schema_whose_value_does_not_fit_its_column_says_why():
    """Without schemas (JSON's own types) a value must fit the column too: else the task that
    stages it fails the query (``ArrowTypeError``) instead of making it a dead letter."""
    fold = ChangeFold(["id"], SCHEMA)
    assert "column 'n' has no schema in this change, and the mirror's column is int64" in (
        fold.check(["id"], {"id": 1, "n": "seven"}, None) or ""
    )
    assert fold.check(["id"], {"id": 1, "n": 7, "name": None}, None) is None


def test_a_schema_that_agrees_with_the_mirror_is_looked_at_once_until_a_column_becomes_known():
    fold = ChangeFold(["id"], pa.schema([("id", pa.int32()), ("name", pa.string())]))
    agreeing = pa.schema([("id", pa.int32()), ("name", pa.string()), ("n", pa.int64())])
    assert fold.check(["id"], {"id": 1, "name": "a", "n": 1}, agreeing) is None
    assert fold._agreeing is agreeing
    other = pa.schema([("id", pa.int32()), ("n", pa.string())])  # n arrives as text first
    assert fold.check(["id"], {"id": 2, "n": "x"}, other) is None
    fold.add("upsert", ["id"], (2,), {"id": 2, "n": "x"}, 1, other)
    assert fold._agreeing is None  # n's type is known now: the agreeing schema is looked at again
    assert "column 'n' is int64 in this change, and the mirror's column is string" in (
        fold.check(["id"], {"id": 3, "n": 5}, agreeing) or ""
    )
