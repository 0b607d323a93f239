"""The central test: kill the pipeline at every step of the commit sequence, restart it, and
check that the table holds every source row exactly once.

Each run is a separate driver process (own JVM) started in its own session; the sink's crash
hook SIGKILLs that whole process group, as a machine failure would.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from deltalake import DeltaTable

from tests.fixtures.tables import referenced_files, stored_data_files
from tests.jobs import run_job

FILES = 5  # one micro-batch per file
ROWS = 200


def _landing(path: Path) -> Path:
    path.mkdir()
    for f in range(FILES):
        rows = [
            {"id": f * ROWS + i, "name": f"row-{f * ROWS + i}", "part": ["a", "b c", "d:e"][i % 3]}
            for i in range(ROWS)
        ]
        (path / f"batch-{f:02d}.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def _run(landing: Path, table: Path, write_path: str, crash_at: str | None):
    return run_job("stream_job", str(landing), str(table), write_path, crash_at=crash_at)


@pytest.mark.parametrize(
    ("write_path", "crash_at", "committed_before_restart"),
    [
        # arrow (the deltaflow format's executors): every step
        ("arrow", "write:0", None),  # an executor wrote its files, first batch, nothing committed
        ("arrow", "before_commit:1", 0),  # every file of batch 1 written, nothing in the log for it
        ("arrow", "after_commit:1", 1),  # batch 1 in the Delta log, Spark has not recorded it
        ("arrow", "write:3", 2),  # during the next batch after 0..2 were fully done
        # spark (foreachBatch): the same commit sequence; the steps where its own file handling
        # (staging, the replay check before writing) matters
        ("spark", "write:0", None),
        ("spark", "after_commit:1", 1),
    ],
    ids=[
        "arrow-during-first-write",
        "arrow-files-written-before-commit",
        "arrow-after-commit-before-spark",
        "arrow-next-batch",
        "spark-during-first-write",
        "spark-after-commit-before-spark",
    ],
)
def test_sigkill_at_each_step_then_restart_is_exactly_once(
    tmp_path, write_path, crash_at, committed_before_restart
):
    landing = _landing(tmp_path / "landing")
    table_dir = tmp_path / "table"

    crashed = _run(landing, table_dir, write_path, crash_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    if committed_before_restart is None:
        assert DeltaTable(str(table_dir)).transaction_version("crash-test") is None
    else:
        assert DeltaTable(str(table_dir)).transaction_version("crash-test") == committed_before_restart

    restarted = _run(landing, table_dir, write_path, None)
    assert restarted.returncode == 0, restarted.stderr[-3000:]

    table = DeltaTable(str(table_dir))
    ids = table.to_pyarrow_table().column("id").to_pylist()
    assert len(ids) == FILES * ROWS
    assert sorted(ids) == list(range(FILES * ROWS))  # every row, exactly once
    assert table.transaction_version("crash-test") == FILES - 1
    epochs = [h["deltaflow.epoch"] for h in table.history() if "deltaflow.epoch" in h]
    assert sorted(epochs) == list(range(FILES))  # one commit per batch, none twice

    # Files of the killed attempt that never reached the log are orphans (vacuum's job);
    # files of a replay that was skipped were deleted by the sink.
    on_disk = stored_data_files(str(table_dir), {})
    orphans = on_disk - referenced_files(table)
    assert len(on_disk) - len(orphans) == len(table.file_uris())
    if crash_at.startswith("after_commit"):
        assert orphans == set()  # the replay was skipped before writing (spark) or cleaned (arrow)
    assert all(Path(o).name.split("-")[1] == f"b{int(crash_at.split(':')[1]):06d}" for o in orphans)
