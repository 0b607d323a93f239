"""Unknown commit outcomes: every commit lands and then reports an error (a lost response).

On S3 (a moto server) the :class:`~deltaflow.testing.FaultyHttpProxy` forwards the ``PUT`` of
each Delta log entry and answers the client with ``500``; on local disk, where no proxy can sit,
``deltaflow.io.faults.lose_commit_responses`` raises a connection reset right after each commit
landed. Either way the writer must find its commit in the log: the table stays readable, every
batch is in it exactly once, and the writer reports what the log holds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

import deltaflow
from deltaflow.config.ingest import IngestConfig
from deltaflow.config.pipeline import load_pipelines
from deltaflow.delta import commit
from deltaflow.io.faults import lose_commit_responses
from deltaflow.pipeline.ingest import ingest
from deltaflow.service.daemon import run_pipelines
from deltaflow.testing import FaultyHttpProxy
from tests.fixtures.frames import settled
from tests.fixtures.readers import duckdb_delta
from tests.fixtures.tables import objects, referenced_files, stored_data_files

ROOT = Path(__file__).resolve().parents[2]
#: The PUT that writes a Delta log entry: the commit itself.
LOG_ENTRY = r"_delta_log/\d{20}\.json$"


@pytest.fixture
def proxy(s3) -> Iterator[FaultyHttpProxy]:  # type: ignore[no-untyped-def]
    with FaultyHttpProxy(s3.endpoint) as p:
        yield p


def _via(proxy: FaultyHttpProxy, s3) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {**s3.storage_options, "AWS_ENDPOINT_URL": proxy.endpoint}


def _assert_sound(uri: str, options: dict[str, str]) -> DeltaTable:
    """Every file the log references exists, and independent readers open the table."""
    table = DeltaTable(uri, storage_options=options or None)
    assert referenced_files(table) - objects(uri, options) == set()
    table.to_pyarrow_table()  # delta-rs reads every file
    return table


def _entries(uri: str, options: dict[str, str]) -> list[commit.LogEntry]:
    table = DeltaTable(uri, storage_options=options or None)
    return commit.read_entries(uri, options, 0, table.version())


def test_lost_responses_on_s3_creating_and_writing_a_table(spark, s3, proxy):
    uri = s3.uri("lost")
    df = spark.range(300).selectExpr("id", "CAST(id % 3 AS STRING) AS part")
    proxy.lose_response("PUT", LOG_ENTRY, 500, times=-1)  # every commit: the create, the write

    version = deltaflow.write(
        df, uri, storage_options=_via(proxy, s3), pipeline_id="p", txn_version=1, partition_columns=["part"]
    )

    assert proxy.counts["lose_response"] >= 2
    table = _assert_sound(uri, s3.storage_options)
    assert version == table.version() == 1  # the create, then the batch: each once
    assert sorted(table.to_pyarrow_table(columns=["id"])["id"].to_pylist()) == list(range(300))
    assert table.transaction_version("p") == 1
    entries = _entries(uri, s3.storage_options)
    assert len({e.info[commit.COMMIT_TOKEN_KEY] for e in entries}) == len(entries) == 2
    duck = duckdb_delta(s3.endpoint)
    try:
        scan = f"SELECT count(*), count(DISTINCT id) FROM delta_scan('{uri}')"
        assert duck.execute(scan).fetchone() == (300, 300)
    finally:
        duck.close()

    # The same txn again (a retried job): skipped, whatever the responses do.
    again = deltaflow.write(
        df, uri, storage_options=_via(proxy, s3), pipeline_id="p", txn_version=1, partition_columns=["part"]
    )
    assert again == 1
    assert DeltaTable(uri, storage_options=s3.storage_options).version() == 1


def test_a_lost_response_of_a_merge_on_s3(spark, s3, proxy, tmp_path):
    uri = s3.uri("merge")
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "1.json").write_text("".join(f'{{"id": {i}, "name": "n{i}", "seq": 1}}\n' for i in range(50)))
    settled(landing / "1.json")
    path = tmp_path / "p.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            pipelines:
              - id: upserts
                source: {{type: files, path: "{landing}", format: json,
                          schema: "id INT, name STRING, seq INT",
                          rescued_data_column: null, max_files_per_trigger: 1}}
                checkpoint_location: "{tmp_path}/checkpoint"
                sinks:
                  - table_uri: "{uri}"
                    write_mode: merge
                    key_columns: [id]
                    sequence_by: seq
                    storage_options: {_via(proxy, s3)}
            """
        )
    )
    specs = load_pipelines(path).pipelines
    proxy.lose_response("PUT", LOG_ENTRY, 500, times=-1)
    run_pipelines(spark, specs, available_now=True)
    (landing / "2.json").write_text(
        "".join(f'{{"id": {i}, "name": "m{i}", "seq": 2}}\n' for i in range(40, 60))
    )
    settled(landing / "2.json")
    run_pipelines(spark, specs, available_now=True)

    assert proxy.counts["lose_response"] >= 4  # create, claims, merges
    table = _assert_sound(uri, s3.storage_options)
    rows = sorted(tuple(r.values()) for r in table.to_pyarrow_table(columns=["id", "name"]).to_pylist())
    assert rows == [(i, f"n{i}") for i in range(40)] + [(i, f"m{i}") for i in range(40, 60)]
    assert table.transaction_version("upserts") == 1
    merges = [e for e in _entries(uri, s3.storage_options) if e.txns.get("upserts") is not None]
    assert [e.txns["upserts"] for e in merges] == [0, 1]  # each batch merged once


def _stream_rows(spark, folder: Path, files: int, rows: int):  # type: ignore[no-untyped-def]
    folder.mkdir()
    for f in range(files):
        spark.range(f * rows, (f + 1) * rows).selectExpr(
            "id", "CAST(id % 2 AS STRING) AS part"
        ).write.parquet(str(folder / f"f{f}"))
    return (
        spark.readStream.schema("id LONG, part STRING")
        .option("maxFilesPerTrigger", 2)
        .parquet(str(folder / "*"))
    )


def test_lost_responses_of_a_stream_on_local_disk_spark_path(spark, tmp_path):
    """Spark's own Parquet writer (``foreachBatch``, commits in this process)."""
    source = _stream_rows(spark, tmp_path / "in", 3, 100)
    uri = str(tmp_path / "t")
    with lose_commit_responses(times=-1) as lost:
        query = deltaflow.write_stream(
            source,
            uri,
            pipeline_id="lossy",
            partition_columns=["part"],
            write_path="spark",
            checkpoint_location=str(tmp_path / "ckpt"),
            trigger={"availableNow": True},
        )
        assert query.awaitTermination(300)
    assert query.exception() is None
    assert any(w.startswith("batch 0 of 'lossy'") for w in lost.lost), lost.lost
    _assert_stream(uri, {}, 300)


def test_lost_responses_of_a_stream_on_s3_arrow_path(spark, s3, proxy, tmp_path):
    """The deltaflow data source (executors write with pyarrow; its commit runs in a Python
    worker of Spark's, out of this process's reach: the proxy loses the responses)."""
    source = _stream_rows(spark, tmp_path / "in", 3, 100)
    uri = s3.uri("lossy")
    proxy.lose_response("PUT", LOG_ENTRY, 500, times=-1)
    query = deltaflow.write_stream(
        source,
        uri,
        pipeline_id="lossy",
        partition_columns=["part"],
        write_path="arrow",
        storage_options=_via(proxy, s3),
        checkpoint_location=str(tmp_path / "ckpt"),
        trigger={"availableNow": True},
    )
    assert query.awaitTermination(300)
    assert query.exception() is None
    assert proxy.counts["lose_response"] >= 4  # create, claim, batches
    _assert_stream(uri, s3.storage_options, 300)


def _assert_stream(uri: str, options: dict[str, str], rows: int) -> None:
    table = _assert_sound(uri, options)
    assert sorted(table.to_pyarrow_table(columns=["id"])["id"].to_pylist()) == list(range(rows))
    batches = [e.txns["lossy"] for e in _entries(uri, options) if "lossy" in e.txns]
    assert batches == sorted(set(batches)) and batches[-1] == table.transaction_version("lossy")
    # No file of a batch is left outside the log (nothing was skipped: each batch committed once).
    assert stored_data_files(uri, options) == referenced_files(table)


@pytest.mark.parametrize(
    ("engine", "write_path"),
    [("spark", "spark"), ("spark", "arrow"), ("arrow", "auto")],
    ids=["spark-engine-spark-writes", "spark-engine-arrow-writes", "arrow-engine"],
)
def test_lost_responses_with_kafka_offsets_and_dead_letters(spark, kafka, tmp_path, engine, write_path):
    topic = kafka.create_topic(partitions=2)
    good = [b'{"id": %d}' % i for i in range(200)]
    messages = [m if i % 10 else b"not json" for i, m in enumerate(good)]
    kafka.produce(topic, messages, partitions=2)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="lossy-kafka",
        value_schema="id LONG",
        dlq_table_location=str(tmp_path / "dlq"),
        ends_at_latest_offsets=True,
        max_messages_per_batch=60,
        write_path=write_path,
        engine=engine,
    )
    with lose_commit_responses(times=-1) as lost:
        assert ingest(spark, config).awaitTermination(300)
    assert any("dlq" in w for w in lost.lost) and any("lossy-kafka'" in w for w in lost.lost)

    main = _assert_sound(str(tmp_path / "t"), {})
    dlq = _assert_sound(str(tmp_path / "dlq"), {})
    assert sorted(main.to_pyarrow_table()["id"].to_pylist()) == [i for i in range(200) if i % 10]
    assert dlq.to_pyarrow_table().num_rows == 20
    for p in range(2):  # the last offset of each partition, in both tables
        assert main.transaction_version(f"lossy-kafka-{topic}-{p}") == 99
        assert dlq.transaction_version(f"lossy-kafka-dlq-{topic}-{p}") == 99


def test_schema_evolution_with_every_commit_response_lost(spark, kafka, tmp_path):
    """Arrow engine, schema evolution, every commit's response lost after it landed (the
    add-columns commit too): each is resolved by reading the log, the query restarts with
    the new columns, and every message is in the table once with its new fields."""
    import json

    from deltaflow.service.daemon import run_until_stopped

    topic = kafka.create_topic(partitions=2)
    values = [json.dumps({"id": i, **({"tag": f"t{i}"} if i >= 10 else {})}).encode() for i in range(30)]
    kafka.produce(topic, values, partitions=2)
    config = IngestConfig(
        topic=topic,
        table_uri=str(tmp_path / "t"),
        brokers=kafka.bootstrap,
        pipeline_id="lossy-evolve",
        value_schema="id LONG",
        schema_evolution=True,
        ends_at_latest_offsets=True,
        max_messages_per_batch=10,
        engine="arrow",
        checkpoint_location=str(tmp_path / "cp"),
    )
    with lose_commit_responses(times=-1) as lost:
        summary = run_until_stopped(lambda: ingest(spark, config), name="lossy-evolve", poll_s=1)
    assert any("adding column(s) ['tag']" in w for w in lost.lost), lost.lost
    assert any("lossy-evolve'" in w for w in lost.lost)
    assert summary.signal is None

    table = _assert_sound(str(tmp_path / "t"), {})
    assert table.schema().to_arrow().names == ["id", "tag"]
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [r["id"] for r in rows] == list(range(30))
    assert [r["tag"] for r in rows] == [None] * 10 + [f"t{i}" for i in range(10, 30)]
    for p in range(2):
        assert table.transaction_version(f"lossy-evolve-{topic}-{p}") == 14
    # The batch that met the new field wrote files and deleted them uncommitted: none is left.
    assert stored_data_files(str(tmp_path / "t"), {}) == referenced_files(table)


def test_lost_responses_of_arrow_ingest_on_s3(kafka, s3, proxy, tmp_path):
    """``deltaflow ingest`` on the Arrow engine into S3, every Delta log PUT answered with 500
    after it landed: its tasks write both tables' files through the proxy, its driver commits
    them; each commit is resolved by reading the log, and every message is in one of the two
    tables once."""
    topic = kafka.create_topic(partitions=2)
    messages = [b'{"id": %d}' % i if i % 10 else b"not json" for i in range(200)]
    kafka.produce(topic, messages, partitions=2, batched=True)
    uri, dlq_uri = s3.uri("arrow-lossy"), s3.uri("arrow-lossy-dlq")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DELTAFLOW_TEST_"))}
    env.update({**s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint})  # the tasks' writes too
    proxy.lose_response("PUT", LOG_ENTRY, 500, times=-1)
    args = [sys.executable, "-m", "deltaflow.cli", "ingest", topic, uri, "--kafka", kafka.bootstrap]
    args += ["--app_id", "lossy-s3", "--schema", "id LONG", "--engine", "arrow", "--ends-at-latest-offsets"]
    # Two batches (120 + 80 messages), the second after the first's lost responses: each commit
    # here costs object_store's retries of the 500 (~3.5 s of backoff), which this process's
    # environment cannot bound.
    args += ["--dlq-table-location", dlq_uri, "--max-messages-per-batch", "120"]
    args += ["--checkpoint-location", str(tmp_path / "cp")]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "in 2 batch(es)" in done.stdout, done.stdout
    assert proxy.counts["lose_response"] >= 8  # 2 creates, 2 claims, each batch's two commits

    main = _assert_sound(uri, s3.storage_options)
    dlq = _assert_sound(dlq_uri, s3.storage_options)
    assert sorted(main.to_pyarrow_table()["id"].to_pylist()) == [i for i in range(200) if i % 10]
    assert dlq.to_pyarrow_table().num_rows == 20
    for p in range(2):
        assert main.transaction_version(f"lossy-s3-{topic}-{p}") == 99
        assert dlq.transaction_version(f"lossy-s3-dlq-{topic}-{p}") == 99
    for table, options_uri in ((main, uri), (dlq, dlq_uri)):  # no file left outside the log
        assert stored_data_files(options_uri, s3.storage_options) == referenced_files(table)


def _ingest(kafka, topic: str, uri: str, checkpoint: Path, env: dict[str, str]) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    args = [sys.executable, "-m", "deltaflow.cli", "ingest", topic, uri, "--kafka", kafka.bootstrap]
    args += ["--app_id", "zombie", "--schema", "id LONG", "--checkpoint_location", str(checkpoint)]
    args += ["--allowed_latency", "1", "--max_messages_per_batch", "40"]
    return subprocess.Popen(
        args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for(condition, what: str, processes: list[subprocess.Popen[str]], timeout_s: float = 240) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        for p in processes:
            if p.poll() is not None:
                pytest.fail(f"{what}: process {p.pid} exited with {p.returncode}: {p.stderr.read()[-3000:]}")  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_zombie_writer_is_fenced_and_nothing_is_doubled(kafka, s3, tmp_path, where):
    """An old driver that has not died yet and a new deployment of the same pipeline (its own
    checkpoint, as on a new machine) run at once: the old one stops at its next commit with an
    error naming the new one; every message is in the table exactly once."""
    topic = kafka.create_topic(partitions=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DELTAFLOW_TEST_"))}
    if where == "s3":
        uri, options = s3.uri("zombie"), dict(s3.storage_options)
        env.update(s3.env())
    else:
        uri, options = str(tmp_path / "t"), {}

    def txn(app: str) -> int | None:
        try:
            return DeltaTable(uri, storage_options=options or None).transaction_version(app)
        except TableNotFoundError:
            return None

    def consumed(n: int) -> bool:  # both partitions' progress in the table covers n messages
        return all((txn(f"zombie-{topic}-{p}") or -1) >= n // 2 - 1 for p in range(2))

    kafka.produce(topic, [b'{"id": %d}' % i for i in range(100)], partitions=2)
    old = _ingest(kafka, topic, uri, tmp_path / "ckpt-old", env)
    new: subprocess.Popen[str] | None = None
    try:
        _wait_for(lambda: consumed(100), "the first writer's commits", [old])
        new = _ingest(kafka, topic, uri, tmp_path / "ckpt-new", env)
        _wait_for(lambda: txn(commit.fence_app_id("zombie")) == 2, "the second writer's claim", [old, new])

        kafka.produce(topic, [b'{"id": %d}' % i for i in range(100, 200)], partitions=2)
        _, err = old.communicate(timeout=240)
        assert old.returncode == 2, err[-3000:]
        assert "WriterFencedError" in err or "was taken over" in err, err[-3000:]
        assert f":{new.pid} (writer epoch 2" in err, err[-3000:]  # names the process that won

        _wait_for(lambda: consumed(200), "the second writer's commits", [new])
    finally:
        for p in (old, new):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(30)

    table = DeltaTable(uri, storage_options=options or None)
    ids = table.to_pyarrow_table(columns=["id"])["id"].to_pylist()
    assert sorted(ids) == list(range(200))  # nothing lost, nothing twice
    assert referenced_files(table) - objects(uri, options) == set()


def test_a_missing_bucket_stops_at_once_and_says_what_to_check(spark, s3):
    from deltaflow.errors import StorageAccessError, TerminalError

    df = spark.range(3)
    with pytest.raises(StorageAccessError, match="check the storage settings") as err:
        deltaflow.write(df, "s3://no-such-bucket/t", storage_options=s3.storage_options)
    assert isinstance(err.value, TerminalError)
    assert "404" in str(err.value) or "NoSuchBucket" in str(err.value)


def test_lost_responses_of_debezium_mirrors_on_s3(kafka, s3, proxy, tmp_path):
    """``deltaflow ingest --cdc debezium`` into mirrors on S3, every Delta log PUT answered with
    500 after it landed (creates, claims, the recorded truncate, MERGEs, progress): each commit
    is resolved by reading the log; every mirror equals what the database holds, and no staged
    file is left. The CLI runs in a process of its own: delta-rs' ``set_table_properties`` holds
    the GIL while it waits on the store, and in this process the proxy's threads answer it (tried
    in-process: both deadlocked)."""
    import uuid

    from tests.fixtures.debezium import FLOAT64, INT32, STRING, ChangeTopic, Sequencer

    prefix = f"lossy{uuid.uuid4().hex[:6]}"
    sequencer = Sequencer()
    columns = [("id", INT32), ("name", STRING), ("score", FLOAT64)]
    topics = {n: ChangeTopic(kafka, f"{prefix}.public.{n}", columns, sequencer=sequencer) for n in ("a", "b")}
    for topic in topics.values():
        for k in range(30):
            topic.insert({"id": k, "name": f"n{k}", "score": float(k)})
        sequencer.commit()
        for k in range(0, 30, 3):
            topic.update({"id": k, "name": f"updated {k}", "score": -1.0})
        for k in range(1, 30, 7):
            topic.delete([k])
        sequencer.commit()
    topics["b"].truncate(partition=0)
    sequencer.commit()
    topics["b"].insert({"id": 100, "name": "after the truncate", "score": 0.5})
    for topic in topics.values():
        topic.send()
    root = s3.uri("mirrors")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DELTAFLOW_TEST_"))}
    env.update({**s3.env(), "AWS_ENDPOINT_URL": proxy.endpoint})  # the tasks' staged files too
    proxy.lose_response("PUT", LOG_ENTRY, 500, times=-1)
    args = [sys.executable, "-m", "deltaflow.cli", "ingest", "--topic_pattern", rf"{prefix}\.public\.(.*)"]
    args += [f"{root}/{{1}}", "--kafka", kafka.bootstrap, "--app_id", "lossy-mirrors", "--cdc", "debezium"]
    args += ["--ends-at-latest-offsets", "--max-messages-per-batch", "40"]
    args += ["--checkpoint-location", str(tmp_path / "cp")]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert proxy.counts["lose_response"] >= 8
    for name, topic in topics.items():
        uri = f"{root}/{name}"
        table = _assert_sound(uri, s3.storage_options)
        rows = table.to_pyarrow_table(columns=["id", "name", "score"]).to_pylist()
        assert {r["id"]: r for r in rows} == {k[0]: v for k, v in topic.rows.items()}, name
        assert not any(p.startswith("_deltaflow_staging/") for p in objects(uri, s3.storage_options))
