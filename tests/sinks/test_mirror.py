"""Folding a batch of PostgreSQL changes into a mirror's rows: what the log says replaced them."""

from __future__ import annotations

import json

import pyarrow as pa

from deltaflow.sinks.mirror import fold


def _events(*changes: tuple[str, dict, int]) -> pa.Table:
    return pa.table(
        {
            "event_type": [kind for kind, _, _ in changes],
            "data": [json.dumps(doc) for _, doc, _ in changes],
            "lsn": pa.array([lsn for _, _, lsn in changes], pa.int64()),
            "seq": pa.array(range(len(changes)), pa.int64()),
        }
    )


def test_a_first_snapshot_is_not_called_a_truncate():
    snapshot = fold(_events(("snapshot", {"id": 1}, 5), ("snapshot", {"id": 2}, 5)), ["id"], ["id"])
    assert snapshot.truncated_below is not None  # rows from before the snapshot go
    assert (snapshot.truncates, snapshot.snapshot) == (0, True)
    assert snapshot.replaced() == " as a snapshot (rows not in it removed)"

    truncate = fold(
        _events(("insert", {"id": 1}, 7), ("truncate", {}, 8), ("insert", {"id": 3}, 9)), ["id"], ["id"]
    )
    assert truncate.replaced() == " after a truncate"
    assert [r.image["id"] for r in truncate.rows] == [3]

    plain = fold(_events(("insert", {"id": 1}, 7), ("delete", {"id": 1}, 8)), ["id"], ["id"])
    assert plain.truncated_below is None and plain.replaced() == ""
