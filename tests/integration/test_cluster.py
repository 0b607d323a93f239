"""The same pipeline on a multi-process Spark cluster: ``local-cluster[2,1,1024]`` from the pyspark
wheel starts a master-less cluster with two executors, each its own JVM with its own Python
workers. The files of one batch are written by both executors in parallel; the driver commits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[2]
ROWS = 40_000


def test_a_pipeline_submitted_to_two_executors_commits_files_from_both_exactly_once(tmp_path):
    """``spark-submit deltaflow/cli.py run FILE``: the master and settings come from spark-submit."""
    path = tmp_path / "p.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            pipelines:
              - id: on-cluster
                source: {{type: generator, total_rows: {ROWS}, rows_per_batch: 20000, partitions: 4}}
                sinks: [{{table_uri: "{tmp_path}/t", write_path: arrow, partition_columns: [country]}}]
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFLOW_")}
    env["PYSPARK_PYTHON"] = sys.executable  # what executors run: the interpreter with deltaflow
    import deltaflow.cli

    submit = Path(sys.executable).with_name("spark-submit")
    done = subprocess.run(
        [
            str(submit),
            "--master",
            "local-cluster[2,1,1024]",
            "--conf",
            "spark.executor.memory=1g",
            "--conf",
            "spark.cores.max=2",  # what the ratio below counts against (unset, it waits for nothing)
            "--conf",
            "spark.scheduler.minRegisteredResourcesRatio=1.0",  # wait for both executors
            "--conf",
            "spark.scheduler.maxRegisteredResourcesWaitingTime=180s",  # however long they take
            str(Path(deltaflow.cli.__file__).with_name("__main__.py")),
            "run",
            str(path),
            "--once",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "session on local-cluster[2,1,1024]" in done.stderr + done.stdout
    table = DeltaTable(str(tmp_path / "t"))
    ids = table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == list(range(ROWS))
    commits = [h for h in table.history() if "deltaflow.epoch" in h]
    assert sorted(h["deltaflow.epoch"] for h in commits) == [0, 1]
    # A batch's files came from both executors (4 tasks over 2 single-core executors).
    assert max(h.get("deltaflow.writers", 0) for h in commits) == 2, commits


def test_arrow_ingest_on_two_executors_commits_files_from_both_exactly_once(tmp_path, kafka):
    """``spark-submit ... deltaflow ingest --engine arrow`` on ``local-cluster``: each executor's
    tasks read, decode, transform and write their partitions' files, dead letters included; a
    commit holds files of both executors, and every message is in one of the two tables once."""
    from tests.fixtures.ingest_messages import SCHEMA, TRANSFORMS, _assert_split, _message

    # Three partitions, not four: message i goes to partition i % n and the bad ones are i % 10 in
    # (3, 5, 7), all odd, so with four partitions only partitions 1 and 3 hold dead letters and
    # the dead-letter commits hold files of both executors only when those two tasks happen to
    # run on different executors (CI saw all four batches on one). With three every partition
    # holds dead letters, and each batch's first tasks go one to each idle executor.
    partitions = 3
    topic = kafka.create_topic(partitions=partitions)
    produced = 400
    kafka.produce(topic, [_message(i) for i in range(produced)], partitions=partitions, batched=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFLOW_")}
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONPATH"] = str(ROOT)  # the driver and its planners run the code under test
    import deltaflow.cli

    submit = Path(sys.executable).with_name("spark-submit")
    args = [str(submit), "--master", "local-cluster[2,1,1024]", "--conf", "spark.executor.memory=1g"]
    # Both executors before the first batch (on a loaded machine they take long to start). A
    # standalone cluster's ratio counts against spark.cores.max: unset, it waits for nothing.
    args += ["--conf", "spark.cores.max=2", "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0"]
    args += ["--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=180s"]
    args += ["--conf", f"spark.executorEnv.PYTHONPATH={ROOT}"]  # the executors run the code under test
    args += [str(Path(deltaflow.cli.__file__).with_name("__main__.py")), "ingest", topic, str(tmp_path / "t")]
    args += ["--kafka", kafka.bootstrap, "--engine", "arrow", "--ends-at-latest-offsets", "--schema", SCHEMA]
    args += ["--dlq-table-location", str(tmp_path / "dlq"), "--max-messages-per-batch", "100"]
    args += ["--min-task-messages", "1"]  # a task per partition (by default small ones share one)
    args += ["--checkpoint-location", str(tmp_path / "cp")]
    for t in TRANSFORMS:
        args += ["-t", t]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "session on local-cluster[2,1,1024]" in done.stderr + done.stdout
    assert "; arrow engine)" in done.stderr + done.stdout
    _assert_split(tmp_path / "t", tmp_path / "dlq", produced, partitions=partitions)
    for table in ("t", "dlq"):
        commits = [h for h in DeltaTable(str(tmp_path / table)).history() if "deltaflow.epoch" in h]
        assert sorted(h["deltaflow.epoch"] for h in commits) == [0, 1, 2, 3], commits
        assert max(h.get("deltaflow.writers", 0) for h in commits) == 2, commits


def test_many_topics_on_two_executors_spread_one_batch_over_both(tmp_path, kafka):
    """``deltaflow ingest --topic_pattern`` on ``local-cluster``: the topic-partitions of one
    batch are cut into tasks by messages and spread over both executors (the large topic's
    commit holds files of both), and every topic lands in its own table exactly once."""
    import json
    import uuid

    prefix = f"c{uuid.uuid4().hex[:6]}"
    sizes = {f"{prefix}.a": (2, 200), f"{prefix}.b": (1, 20), f"{prefix}.c": (1, 20)}
    for topic, (partitions, count) in sizes.items():
        kafka.create_topic(partitions=partitions, name=topic)
        values = [json.dumps({"id": i}).encode() for i in range(count)]
        kafka.produce(topic, values, partitions=partitions, batched=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFLOW_")}
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYTHONPATH"] = str(ROOT)
    import deltaflow.cli

    submit = Path(sys.executable).with_name("spark-submit")
    args = [str(submit), "--master", "local-cluster[2,1,1024]", "--conf", "spark.executor.memory=1g"]
    args += ["--conf", "spark.cores.max=2", "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0"]
    args += ["--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=180s"]
    args += ["--conf", f"spark.executorEnv.PYTHONPATH={ROOT}"]
    args += [str(Path(deltaflow.cli.__file__).with_name("__main__.py")), "ingest"]
    args += ["--topic-pattern", rf"{prefix}\.(.*)", str(tmp_path / "lake" / "{1}")]
    args += ["--kafka", kafka.bootstrap, "--ends-at-latest-offsets", "--schema", "id LONG"]
    args += ["--min-task-messages", "1", "--checkpoint-location", str(tmp_path / "cp")]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for topic, (_, count) in sizes.items():
        table = DeltaTable(str(tmp_path / "lake" / topic.rsplit(".", 1)[1]))
        ids = sorted(r["id"] for r in table.to_pyarrow_table().to_pylist())
        assert ids == sorted(i for i in range(count)), topic
    large = DeltaTable(str(tmp_path / "lake" / "a"))
    commits = [h for h in large.history() if "deltaflow.epoch" in h]
    assert max(h.get("deltaflow.writers", 0) for h in commits) == 2, commits
