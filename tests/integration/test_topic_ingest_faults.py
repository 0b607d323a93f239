"""Ingest of many topics in one query (``deltaflow ingest --topic_pattern REGEX TEMPLATE``) under
faults, against the real broker: six topics of two partitions, each into its own table, three of
them with dead letters into one shared dead-letter table.

* SIGKILL of the whole process group in a task and between two tables' commits of one batch
  (the ``between_tables`` crash point), each time restarted on the kept Spark checkpoint;
* a batch committed to some tables and not to others (their commits fail), then the Spark
  checkpoint deleted: the tables' progress, which differs from table to table (the dead-letter
  table's ahead of some main tables'), is all there is;
* every commit's response lost on S3 (:class:`~deltaflow.testing.FaultyHttpProxy` in front of
  moto), the tables ``s3://.../{topic}``, the checkpoint local.

After each: every table holds exactly its topic's messages once (delta-rs and DuckDB), the shared
dead-letter table every failed message once, each table's txns are its partitions' last offsets,
and every file a table references is there.

The crashes run ``deltaflow ingest`` as a process group of its own (``tests/jobs/ingest_job``);
every other run is in this process's Spark session, which saves a JVM start each.
"""

from __future__ import annotations

import base64
import json
import shutil
import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from deltalake import DeltaTable

from deltaflow.config.ingest import IngestConfig
from deltaflow.pipeline.topic_ingest import start
from deltaflow.testing import FaultyHttpProxy
from tests.fixtures.readers import duckdb_delta
from tests.fixtures.tables import objects, referenced_files, stored_data_files
from tests.jobs import run_job

TOPICS = 6
PARTITIONS = 2
SCHEMA = "id LONG, name STRING"
TRANSFORMS = ("source_topic: kafka.topic", "src_partition: kafka.partition", "src_offset: kafka.offset")
#: Messages per micro-batch: about ten of each topic, so every batch touches every table.
BATCH = 60
#: The PUT that writes a Delta log entry: the commit itself.
LOG_ENTRY = r"_delta_log/\d{20}\.json$"


def _bad(k: int, i: int) -> bool:
    """Topics 0, 2, 4 have dead letters: every fifth message."""
    return k % 2 == 0 and i % 5 == 4


def _message(topic: str, k: int, i: int) -> bytes:
    if _bad(k, i):
        if i % 10 == 4:
            return b'{"id": %d, "name": ' % i  # broken JSON
        return json.dumps({"id": f"x{i}", "name": "?"}).encode()  # an id that is no number
    return json.dumps({"id": i, "name": f"{topic}-{i}"}).encode()


@dataclass
class Lake:
    """Where one test's tables are, and what went into the topics."""

    prefix: str
    table_template: str
    dlq: str
    #: Messages produced per topic (message i of a topic: partition i % 2, offset i // 2).
    produced: dict[str, int] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)
    s3_endpoint: str | None = None
    pipeline: str = "many"

    @property
    def pattern(self) -> str:
        return rf"{self.prefix}\.(.*)"

    def table(self, topic: str) -> str:
        return self.table_template.replace("{1}", topic.split(".", 1)[1]).replace("{topic}", topic)

    def delta(self, uri: str) -> DeltaTable:
        return DeltaTable(uri, storage_options=self.options or None)


def _topics(kafka, lake: Lake) -> None:  # type: ignore[no-untyped-def]
    """Six topics of 30, 34, ... 50 messages (each count its own, so a misrouted row shows)."""
    for k in range(TOPICS):
        topic = kafka.create_topic(partitions=PARTITIONS, name=f"{lake.prefix}.t{k}")
        count = 30 + 4 * k
        kafka.produce(topic, [_message(topic, k, i) for i in range(count)], partitions=PARTITIONS)
        lake.produced[topic] = count


def _local(tmp_path: Path) -> Lake:
    return Lake(
        prefix=f"many{uuid.uuid4().hex[:6]}",
        table_template=str(tmp_path / "lake" / "{1}"),
        dlq=str(tmp_path / "dead-letters"),
    )


def _config(kafka, lake: Lake, **extra) -> IngestConfig:  # type: ignore[no-untyped-def]
    """The configuration :func:`_cli` gives ``deltaflow ingest`` (with ``extra`` on top)."""
    storage = {"storage_options": lake.options} if lake.options else {}
    values = {
        "topic_pattern": lake.pattern,
        "table_uri": lake.table_template,
        "brokers": kafka.bootstrap,
        "pipeline_id": lake.pipeline,
        "value_schema": SCHEMA,
        "transforms": TRANSFORMS,
        "dlq_table_location": lake.dlq,
        "max_messages_per_batch": BATCH,
        "ends_at_latest_offsets": True,
        "auto_compact": False,
        "table_options": storage,
        "dlq_table_options": storage,
    }
    return IngestConfig.build(**{**values, **extra})


def _cli(kafka, lake: Lake, crash_at: str) -> None:  # type: ignore[no-untyped-def]
    """``deltaflow ingest`` in a process group of its own, SIGKILLed at ``crash_at``."""
    args = ["--topic_pattern", lake.pattern, lake.table_template, "--kafka", kafka.bootstrap]
    args += ["--app_id", lake.pipeline, "--schema", SCHEMA, "--dlq_table_location", lake.dlq]
    args += ["--max_messages_per_batch", str(BATCH), "--ends_at_latest_offsets", "--no_auto_compact"]
    for t in TRANSFORMS:
        args += ["-t", t]
    crashed = run_job("ingest_job", *args, crash_at=crash_at)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]


def _run(spark, kafka, lake: Lake) -> None:  # type: ignore[no-untyped-def]
    """The restart, in this process's Spark session, to the newest offsets."""
    query = start(spark, _config(kafka, lake))
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()


# -- what the tables must hold ------------------------------------------------------------------


def _last_offset(count: int, partition: int) -> int:
    return (count - partition + PARTITIONS - 1) // PARTITIONS - 1


def _differences(actual: list, expected: list) -> str:  # type: ignore[type-arg]
    have, want = Counter(actual), Counter(expected)
    twice = sorted(k for k, n in have.items() if n > 1)
    missing = sorted((want - have).elements())
    foreign = sorted((have - want).elements())
    return f"twice {twice}, missing {missing}, not expected {foreign}"


def _assert_files_present(lake: Lake, uri: str, table: DeltaTable) -> None:
    missing = referenced_files(table) - objects(uri, lake.options)
    assert not missing, f"{uri} references files that are not there: {sorted(missing)}"


def _assert_at_most_once(lake: Lake) -> None:
    """After a crash: no message in two rows, none in another topic's table."""
    for k, (topic, count) in enumerate(lake.produced.items()):
        uri = lake.table(topic)
        table = lake.delta(uri)
        rows = table.to_pyarrow_table(columns=["id", "source_topic", "src_partition", "src_offset"])
        coords = [(r["src_partition"], r["src_offset"]) for r in rows.to_pylist()]
        allowed = {(i % PARTITIONS, i // PARTITIONS) for i in range(count) if not _bad(k, i)}
        twice = sorted(c for c, n in Counter(coords).items() if n > 1)
        assert not twice and set(coords) <= allowed, (uri, twice, sorted(set(coords) - allowed))
        assert set(rows["source_topic"].to_pylist()) <= {topic}, uri
        _assert_files_present(lake, uri, table)
    letters = lake.delta(lake.dlq).to_pyarrow_table(columns=["topic", "partition", "offset"]).to_pylist()
    twice = sorted(
        c for c, n in Counter((r["topic"], r["partition"], r["offset"]) for r in letters).items() if n > 1
    )
    assert not twice, f"dead letters twice: {twice}"


def _assert_exact(lake: Lake) -> None:
    """Each table exactly its topic's good messages, once; the dead-letter table exactly the bad
    ones, once; the progress of each partition in its table; every referenced file present."""
    duck = duckdb_delta(lake.s3_endpoint)
    try:
        dead_letters = lake.delta(lake.dlq)
        letters = dead_letters.to_pyarrow_table().to_pylist()
        for k, (topic, count) in enumerate(lake.produced.items()):
            uri = lake.table(topic)
            good = [i for i in range(count) if not _bad(k, i)]
            table = lake.delta(uri)
            rows = table.to_pyarrow_table().to_pylist()
            ids = [r["id"] for r in rows]
            assert sorted(ids) == good, f"{uri} ({topic}): {_differences(ids, good)}"
            assert {r["source_topic"] for r in rows} == {topic}
            assert all(r["name"] == f"{topic}-{r['id']}" for r in rows)
            coords = sorted((r["src_partition"], r["src_offset"]) for r in rows)
            assert coords == sorted((i % PARTITIONS, i // PARTITIONS) for i in good), uri
            read = sorted(r[0] for r in duck.execute(f"SELECT id FROM delta_scan('{uri}')").fetchall())
            assert read == good, f"DuckDB on {uri}: {_differences(read, good)}"
            for p in range(PARTITIONS):
                assert table.transaction_version(f"{lake.pipeline}-{topic}-{p}") == _last_offset(count, p)
            _assert_files_present(lake, uri, table)

            bad = [i for i in range(count) if _bad(k, i)]
            mine = [r for r in letters if r["topic"] == topic]
            got = [(r["partition"], r["offset"]) for r in mine]
            want = [(i % PARTITIONS, i // PARTITIONS) for i in bad]
            assert sorted(got) == sorted(want), f"dead letters of {topic}: {_differences(got, want)}"
            for r in mine:  # the raw bytes, intact
                i = r["offset"] * PARTITIONS + r["partition"]
                assert base64.b64decode(r["value_base64"]) == _message(topic, k, i)
            for p in range(PARTITIONS):  # the dead letters' progress covers every dead letter
                held = dead_letters.transaction_version(f"{lake.pipeline}-dlq-{topic}-{p}")
                newest = max((o for q, o in got if q == p), default=-1)
                assert held is not None and newest <= held <= _last_offset(count, p), (topic, p, held)
        assert len(letters) == sum(
            sum(_bad(k, i) for i in range(n)) for k, n in enumerate(lake.produced.values())
        )
        (dead,) = duck.execute(f"SELECT count(*) FROM delta_scan('{lake.dlq}')").fetchone()
        assert dead == len(letters)
        _assert_files_present(lake, lake.dlq, lake.delta(lake.dlq))
    finally:
        duck.close()


def _epochs(lake: Lake, uri: str) -> list[int]:
    """The batches committed to a table (from its commit info), in log order."""
    return sorted(h["deltaflow.epoch"] for h in lake.delta(uri).history() if "deltaflow.epoch" in h)


def _holding(lake: Lake, batch: int) -> list[str]:
    """The topics whose main table holds ``batch``."""
    return [t for t in lake.produced if batch in _epochs(lake, lake.table(t))]


# -- the tests --------------------------------------------------------------------------------


def test_killed_in_a_task_and_between_tables_then_restarted(spark, kafka, tmp_path):
    """Two SIGKILLs of the whole process group in batch 1, the second run restarting from the
    kept checkpoint (so it replays batch 1, with the same offsets) and dying further along it:
    in a task (files of several tables written, nothing returned); right after one main table's
    commit landed (the dead letters and that table hold batch 1, five do not). (A kill before
    the commit is ingest of one topic's, tests/sources/test_kafka_ingest.py.) Then a restart to
    the end: every table exact, each batch in each table once."""
    lake = _local(tmp_path)
    _topics(kafka, lake)
    tables = [lake.dlq, *map(lake.table, lake.produced)]

    _cli(kafka, lake, "write:1")
    _assert_at_most_once(lake)
    assert not any(1 in _epochs(lake, uri) for uri in tables)

    third = lake.table(f"{lake.prefix}.t2").removeprefix(str(tmp_path))
    _cli(kafka, lake, f"between_tables:1:{third}")  # t2 commits alone, then the kill
    _assert_at_most_once(lake)
    assert 1 in _epochs(lake, lake.dlq)
    assert _holding(lake, 1) == [f"{lake.prefix}.t2"]

    _run(spark, kafka, lake)
    _assert_exact(lake)
    for uri in tables:
        epochs = _epochs(lake, uri)
        assert len(epochs) == len(set(epochs)), f"{uri}: a batch committed twice: {epochs}"


class InjectedCommitError(RuntimeError):
    pass


def test_tables_at_different_progress_then_the_checkpoint_is_lost(spark, kafka, tmp_path, monkeypatch):
    """Batch 1 lands in the dead-letter table and in three of the six main tables; the commits
    of the other three fail (injected), which stops the query. Then the Spark checkpoint is
    deleted: the new query starts each partition after its own table's progress, and the dead
    letters the shared table holds already are not written again. Then more messages for half
    of the topics, and the checkpoint deleted once more after a clean end: each table goes on
    from its progress."""
    from pyspark.errors import StreamingQueryException

    from deltaflow.sinks.datasource import _DeltaSink

    lake = _local(tmp_path)
    _topics(kafka, lake)
    checkpoint = tmp_path / "lake" / "_deltaflow" / "checkpoints" / lake.pipeline
    failing = tuple(f"/t{k}" for k in (3, 4, 5))
    commit_batch = _DeltaSink.commit_batch

    def commit_or_fail(self, messages, batch_id, **kwargs):  # type: ignore[no-untyped-def]
        if batch_id == 1 and self.table_uri.rstrip("/").endswith(failing):
            raise InjectedCommitError(f"batch 1 of {self.table_uri} is not committed")
        return commit_batch(self, messages, batch_id, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(_DeltaSink, "commit_batch", commit_or_fail)
        query = start(spark, _config(kafka, lake))
        with pytest.raises(StreamingQueryException, match="InjectedCommitError"):
            query.awaitTermination(300)
    _assert_at_most_once(lake)
    assert 1 in _epochs(lake, lake.dlq)
    assert _holding(lake, 1) == [f"{lake.prefix}.t{k}" for k in range(3)]
    shutil.rmtree(checkpoint)

    _run(spark, kafka, lake)
    _assert_exact(lake)

    for k, topic in enumerate(lake.produced):
        if k % 2 == 0:  # offsets go on where they stood: message i at i % 2, i // 2
            count = lake.produced[topic]
            more = [_message(topic, k, i) for i in range(count, count + 12)]
            kafka.produce(topic, more, partitions=PARTITIONS)
            lake.produced[topic] = count + 12
    shutil.rmtree(checkpoint)
    _run(spark, kafka, lake)
    _assert_exact(lake)


@pytest.fixture
def proxy(s3) -> Iterator[FaultyHttpProxy]:  # type: ignore[no-untyped-def]
    with FaultyHttpProxy(s3.endpoint) as p:
        yield p


def test_lost_commit_responses_on_s3(spark, kafka, s3, proxy, tmp_path):
    """Every Delta log PUT lands and is answered with 500: the tables' creation, the writer
    claims, every batch's commit to each of the six tables and to the dead-letter table. Each is
    resolved by reading the log; every table exact, every referenced file there, and no data
    file left outside the log."""
    root = s3.uri("many")
    lake = Lake(
        prefix=f"many{uuid.uuid4().hex[:6]}",
        table_template=f"{root}/{{topic}}",
        dlq=f"{root}/dead-letters",
        # object_store retries a PUT answered 500, and each retry's answer is lost too: one
        # retry, not ten (3.5 s of backoff per commit).
        options={**s3.storage_options, "AWS_ENDPOINT_URL": proxy.endpoint, "max_retries": "1"},
        s3_endpoint=s3.endpoint,
    )
    _topics(kafka, lake)
    proxy.lose_response("PUT", LOG_ENTRY, 500, times=-1)
    # Two batches (each commit costs a round trip more here, and every table commits in both).
    config = _config(kafka, lake, checkpoint_location=str(tmp_path / "cp"), max_messages_per_batch=2 * BATCH)
    query = start(spark, config)
    assert query.awaitTermination(300)
    assert query.exception() is None, query.exception()
    batches = len([p for p in query.recentProgress if p["numInputRows"]])
    # The creates and claims of 7 tables, then per batch at least the 6 main tables' commits.
    assert proxy.counts["lose_response"] >= 14 + 6 * batches, (proxy.counts, batches)

    lake.options = dict(s3.storage_options)  # read past the proxy
    _assert_exact(lake)
    for uri in [lake.dlq, *map(lake.table, lake.produced)]:
        on_store = stored_data_files(uri, lake.options)
        assert on_store == referenced_files(lake.delta(uri)), f"{uri}: data files outside the log"
