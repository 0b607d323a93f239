"""Spark Declarative Pipelines (``spark-pipelines``, over Spark Connect) with deltaflow's sink and
Delta source: the example in ``examples/declarative_pipeline`` runs as shipped, apart from its
paths, and lands every row once across a restart. pyspark finds the formats by itself (the
``pyspark_deltaflow*`` modules): nothing calls ``deltaflow.register``."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import yaml
from deltalake import DeltaTable, write_deltalake

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "declarative_pipeline"


def _bronze(ids: range) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), pa.int64()),
            "amount": [float(i % 5 - 1) for i in ids],  # every fifth row is filtered out (<= 0)
            "at": pa.array(
                [dt.datetime(2026, 11, 20 + i % 3, 8, tzinfo=dt.UTC) for i in ids],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )


def _run(spec: Path) -> subprocess.CompletedProcess[str]:
    command = [
        str(Path(sys.executable).parent / "spark-pipelines"),
        "run",
        "--spec",
        str(spec),
        "--remote",
        "local[2]",
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_the_example_pipeline_lands_every_row_once_across_a_restart(tmp_path, connect_server_turn):
    project = tmp_path / "declarative_pipeline"
    shutil.copytree(EXAMPLE, project)
    spec_path = project / "spark-pipeline.yml"
    spec = yaml.safe_load(spec_path.read_text())
    bronze, silver = tmp_path / "bronze", tmp_path / "silver"
    spec["storage"] = (tmp_path / "pipeline-storage").as_uri()
    spec["configuration"] = {"deltaflow.example.source": str(bronze), "deltaflow.example.target": str(silver)}
    spec_path.write_text(yaml.safe_dump(spec))

    write_deltalake(str(bronze), _bronze(range(0, 20)))
    first = _run(spec_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Run is COMPLETED" in first.stdout + first.stderr

    write_deltalake(str(bronze), _bronze(range(20, 35)), mode="append")
    second = _run(spec_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]

    table = DeltaTable(str(silver))
    rows = table.to_pyarrow_table().to_pylist()
    expected = [i for i in range(35) if i % 5 - 1 > 0]
    assert sorted(r["id"] for r in rows) == expected  # every kept row once
    assert table.metadata().partition_columns == ["day"]
    assert {r["day"] for r in rows} == {"2026-11-20", "2026-11-21", "2026-11-22"}
    assert table.transaction_version("silver-from-bronze") == 1  # one batch per run
