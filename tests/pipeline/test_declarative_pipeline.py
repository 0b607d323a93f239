"""Spark Declarative Pipelines (``spark-pipelines``, over Spark Connect) with deltaflow's sink and
Delta source: the example in ``examples/declarative_pipeline`` runs as shipped, apart from its
paths, and lands every row once across a restart. pyspark finds the formats by itself (the
``pyspark_deltaflow*`` modules): nothing calls ``deltaflow.register``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from deltalake import DeltaTable

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "declarative_pipeline"


def _make_bronze(path: Path, start: int, rows: int) -> None:
    """The example's own script, as the README runs it."""
    command = [sys.executable, str(EXAMPLE / "make_bronze.py"), str(path), "--start", str(start)]
    done = subprocess.run([*command, "--rows", str(rows)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]


def test_the_readme_creates_the_bronze_table_and_names_spark_pipelines_on_path():
    # The README ran spark-pipelines on the example alone: its bronze table did not exist, and
    # nothing said where spark-pipelines comes from.
    readme = (EXAMPLE.parents[1] / "README.md").read_text()
    section = readme[readme.index("### Spark Declarative Pipelines") :]
    block = section[section.index("```bash") : section.index("```", section.index("```bash") + 7)]
    lines = [line.split("#")[0].strip() for line in block.splitlines()[1:] if line.strip()]
    assert lines == [
        "python examples/declarative_pipeline/make_bronze.py /tmp/deltaflow-example/bronze",
        'spark-pipelines run --spec examples/declarative_pipeline/spark-pipeline.yml --remote "local[*]"',
    ]
    assert "must be on `PATH`" in section[: section.index("```bash")]
    spec = yaml.safe_load((EXAMPLE / "spark-pipeline.yml").read_text())
    assert spec["configuration"]["deltaflow.example.source"] == "/tmp/deltaflow-example/bronze"


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

    _make_bronze(bronze, 0, 20)
    first = _run(spec_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "Run is COMPLETED" in first.stdout + first.stderr

    _make_bronze(bronze, 20, 15)
    second = _run(spec_path)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]

    table = DeltaTable(str(silver))
    rows = table.to_pyarrow_table().to_pylist()
    expected = [i for i in range(35) if i % 5 - 1 > 0]
    assert sorted(r["id"] for r in rows) == expected  # every kept row once
    assert table.metadata().partition_columns == ["day"]
    assert {r["day"] for r in rows} == {"2026-11-20", "2026-11-21", "2026-11-22"}
    assert table.transaction_version("silver-from-bronze") == 1  # one batch per run
