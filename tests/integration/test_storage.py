"""Object storage and concurrent writers: S3 through a local moto server, on 127.0.0.1."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from deltaflow import ops
from deltaflow.config.pipeline import load_pipelines
from deltaflow.delta import commit
from deltaflow.errors import TableNotFoundError
from deltaflow.io.storage import filesystem
from deltaflow.metrics import metrics
from deltaflow.service.daemon import run_pipelines
from deltaflow.sources.generator import generate
from tests.fixtures.tables import objects, referenced_files, stored_data_files

ROOT = Path(__file__).resolve().parents[2]


def _specs(tmp_path: Path, text: str, **env: str):
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(text))
    return load_pipelines(path, env={"DIR": str(tmp_path), **env}).pipelines


def test_a_pipeline_writes_s3_and_maintenance_and_readers_work_there(spark, s3, tmp_path):
    uri = s3.uri("events")
    specs = _specs(
        tmp_path,
        """
        pipelines:
          - id: to-s3
            source: {type: generator, total_rows: 4000, rows_per_batch: 500, partitions: 3}
            checkpoint_location: "${DIR}/checkpoint"
            sinks:
              - table_uri: "${URI}"
                partition_columns: [country]
                auto_compact: false
                storage_options:
                  AWS_ENDPOINT_URL: "${ENDPOINT}"
                  AWS_ACCESS_KEY_ID: testing
                  AWS_SECRET_ACCESS_KEY: testing
                  AWS_REGION: us-east-1
                  AWS_ALLOW_HTTP: "true"
        """,
        URI=uri,
        ENDPOINT=s3.endpoint,
    )
    run_pipelines(spark, specs, available_now=True)
    options = s3.storage_options
    table = DeltaTable(uri, storage_options=options)
    assert sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == list(range(4000))
    assert table.transaction_version("to-s3") == 7  # 8 batches, one commit each
    before = len(table.file_uris())
    assert before >= 8 * 3  # several files per batch: 3 tasks wrote in parallel, 8 countries

    # Other readers with the same options.
    assert pl.read_delta(uri, storage_options=options).height == 4000

    # Maintenance on S3: compact, then vacuum exactly the replaced files.
    result = ops.optimize(uri, storage_options=options)
    assert result.files_removed == before and result.files_added == 8  # one per country
    plan = ops.vacuum(uri, retention_hours=0, force=True, storage_options=options)
    assert len(plan.files) == before
    ops.vacuum(uri, retention_hours=0, force=True, dry_run=False, storage_options=options)
    table = DeltaTable(uri, storage_options=options)
    assert stored_data_files(uri, options) == referenced_files(table)
    assert table.to_pyarrow_table().num_rows == 4000
    described = ops.describe(uri, storage_options=options)
    assert described["files"]["count"] == 8


def test_the_cli_takes_credentials_from_the_aws_environment(s3, tmp_path):
    """No storage_options anywhere: the driver, delta-rs and the executors' pyarrow read AWS_*."""
    uri = s3.uri("env")
    path = tmp_path / "p.yaml"
    path.write_text(
        textwrap.dedent(
            f"""
            spark: {{master: "local[2]"}}
            pipelines:
              - id: env-creds
                source: {{type: generator, total_rows: 1000, rows_per_batch: 500}}
                checkpoint_location: "{tmp_path}/checkpoint"
                sinks: [{{table_uri: "{uri}"}}]
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DELTAFLOW_TEST_"))}
    env.update(s3.env())
    done = subprocess.run(
        [sys.executable, "-m", "deltaflow.cli", "run", str(path), "--once"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "env-creds: 1,000 row(s) committed to " in done.stdout
    assert "(1,000 row(s) read in 2 batch(es))" in done.stdout
    table = DeltaTable(uri, storage_options=s3.storage_options)
    assert sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == list(range(1000))


@pytest.mark.parametrize("where", ["local", "s3"])
def test_two_pipelines_and_compaction_write_one_table_at_once(spark, s3, tmp_path, where):
    """Two pipelines (own ids, own checkpoints) append to one table while their auto-compaction
    and a compaction job rewrite files beside them: every row exactly once, no pipeline fails."""
    uri = s3.uri("shared") if where == "s3" else str(tmp_path / "shared")
    options = s3.storage_options if where == "s3" else {}
    sink = {
        "table_uri": uri,
        "partition_columns": ["country"],
        "auto_compact_min_files": 3,
        "storage_options": options,
    }

    def pipeline(pid: str, seed: int) -> str:
        return f"""
          - id: {pid}
            source: {{type: generator, total_rows: 3000, rows_per_batch: 300, seed: {seed},
                     fields: {{writer: "'{pid}'"}}}}
            checkpoint_location: "{tmp_path}/ckpt-{pid}"
            sinks: [{sink}]
        """

    specs = _specs(tmp_path, "pipelines:" + pipeline("writer-a", 1) + pipeline("writer-b", 2))
    retries_before = _metric_sum("deltaflow_sink_commit_retries_total", uri)

    # And a compaction job (what `deltaflow optimize` runs) in a loop beside them.
    stop, optimized, failed = threading.Event(), [], []

    def compaction_job() -> None:
        while not stop.wait(0.3):
            try:
                optimized.append(ops.optimize(uri, storage_options=options, lock_timeout_s=60))
            except TableNotFoundError:
                pass  # not created yet
            except Exception as exc:  # noqa: BLE001 - kept for the assertion's message; the job goes on
                failed.append(repr(exc))

    job = threading.Thread(target=compaction_job)
    job.start()
    try:
        summaries = run_pipelines(spark, specs, available_now=True)
    finally:
        stop.set()
        job.join(120)
    assert {s.messages for s in summaries.values()} == {3000}
    assert any(r.files_removed for r in optimized), failed  # the job compacted while the streams wrote

    from deltaflow.ops.compaction import compactors

    for compactor in compactors():
        compactor.wait_idle(60)
    table = DeltaTable(uri, storage_options=options or None)
    rows = table.to_pyarrow_table(columns=["writer", "id", "user_id"])
    for pid, seed in (("writer-a", 1), ("writer-b", 2)):
        mine = rows.filter(pc.equal(rows["writer"], pid)).sort_by("id")
        assert mine["id"].to_pylist() == list(range(3000))  # all, once
        want = pa.Table.from_batches([generate(0, 3000, 0, 1000.0, seed)])["user_id"].to_pylist()
        assert mine["user_id"].to_pylist() == want
        assert table.transaction_version(pid) == 9
    operations = [h["operation"] for h in table.history()]
    assert "OPTIMIZE" in operations  # the compaction ran beside the appends
    # Retries, if the writers collided, are counted (never a failed batch).
    assert _metric_sum("deltaflow_sink_commits_failed_total", uri) == 0
    assert _metric_sum("deltaflow_sink_commit_retries_total", uri) >= retries_before


def _metric_sum(name: str, table: str) -> float:
    total = 0.0
    for family in metrics.registry.collect():
        for sample in family.samples:
            if sample.name == name and sample.labels.get("table", "").rstrip("/") == table.rstrip("/"):
                total += sample.value
    return total


@pytest.mark.parametrize("where", ["local", "s3"])
def test_writers_racing_to_create_a_table_agree_on_one(s3, tmp_path, where):
    uri = s3.uri("race") if where == "s3" else str(tmp_path / "race")
    options = s3.storage_options if where == "s3" else {}
    schema = pa.schema([("id", pa.int64())])
    tables: list[DeltaTable] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def create() -> None:
        start.wait()
        try:
            tables.append(
                commit.create_table(uri, schema, partition_by=(), properties={}, storage_options=options)
            )
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    threads = [threading.Thread(target=create) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert len(tables) == 6
    final = DeltaTable(uri, storage_options=options or None)
    assert final.version() == 0  # exactly one CREATE
    assert {t.metadata().id for t in tables} == {final.metadata().id}  # everyone adopted it


class _Restarts(logging.Handler):
    """Sets ``seen`` when the daemon logs that it restarts a query after a transient failure."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "restarting in" in record.getMessage():
            self.messages.append(record.getMessage())
            self.seen.set()


def test_storage_errors_are_retried_and_an_outage_heals_exactly(spark, s3, tmp_path):
    from deltaflow.testing import FaultyHttpProxy

    proxy = FaultyHttpProxy(s3.endpoint)
    restarts = _Restarts()
    logging.getLogger("deltaflow.service.daemon").addHandler(restarts)
    try:
        uri = s3.uri("faults")

        def specs(total: int):  # type: ignore[no-untyped-def]
            return _specs(
                tmp_path,
                f"""
                pipelines:
                  - id: faulty
                    source: {{type: generator, total_rows: {total}, rows_per_batch: 1000}}
                    checkpoint_location: "{tmp_path}/checkpoint"
                    sinks:
                      - table_uri: "{uri}"
                        storage_options:
                          AWS_ENDPOINT_URL: "{proxy.endpoint}"
                          AWS_ACCESS_KEY_ID: testing
                          AWS_SECRET_ACCESS_KEY: testing
                          AWS_REGION: us-east-1
                          AWS_ALLOW_HTTP: "true"
                """,
            )

        # Throttling on data files (executors, pyarrow) and 5xx on commits (driver, delta-rs).
        proxy.fail("PUT", r"\.parquet", 503, times=3)
        proxy.fail("PUT", r"_delta_log/\d{20}\.json$", 500, times=2)
        run_pipelines(spark, specs(2000), available_now=True)
        assert proxy.injected == 5
        table = DeltaTable(uri, storage_options=s3.storage_options)
        assert sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == list(range(2000))
        assert not restarts.seen.is_set()

        # The store becomes unreachable (every connection reset) after the restart's claim and the
        # next batch's commit landed, and comes back once the daemon has restarted the query for
        # it: the query resumes, exactly once.
        commits_before = sum(1 for m, p in proxy.requests if m == "PUT" and "_delta_log/0" in p)

        def outage() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if (
                    sum(1 for m, p in list(proxy.requests) if m == "PUT" and "_delta_log/0" in p)
                    > commits_before
                ):
                    break
                time.sleep(0.01)
            proxy.outage()
            restarts.seen.wait(120)
            proxy.heal()

        breaker = threading.Thread(target=outage, daemon=True)
        breaker.start()
        run_pipelines(spark, specs(6000), available_now=True)
        breaker.join(5)
        assert restarts.seen.is_set(), "the outage never reached the daemon"
        assert "transient" in restarts.messages[0]
        assert proxy.counts["reset"] > 0
        table = DeltaTable(uri, storage_options=s3.storage_options)
        assert sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == list(range(6000))
        assert table.transaction_version("faulty") == 5
        missing = referenced_files(table) - objects(uri, s3.storage_options)
        assert missing == set()
    finally:
        logging.getLogger("deltaflow.service.daemon").removeHandler(restarts)
        proxy.close()


def test_a_pipeline_writes_azure_blob_storage(spark, azurite, tmp_path):
    uri = azurite.uri("events")
    specs = _specs(
        tmp_path,
        """
        pipelines:
          - id: to-azure
            source: {type: generator, total_rows: 2000, rows_per_batch: 1000, partitions: 2}
            checkpoint_location: "${DIR}/checkpoint"
            sinks:
              - table_uri: "${URI}"
                partition_columns: [event_type]
                storage_options:
                  AZURE_STORAGE_USE_EMULATOR: "true"
                  AZURE_ENDPOINT: "${ENDPOINT}"
                  allow_http: "true"
        """,
        URI=uri,
        ENDPOINT=azurite.endpoint,
    )
    run_pipelines(spark, specs, available_now=True)
    options = azurite.storage_options
    table = DeltaTable(uri, storage_options=options)
    assert sorted(table.to_pyarrow_table(columns=["id"]).column("id").to_pylist()) == list(range(2000))
    assert table.transaction_version("to-azure") == 1
    files = stored_data_files(uri, options)
    assert files == referenced_files(table) and len(files) >= 2  # the executors' files, all committed
    result = ops.optimize(uri, storage_options=options)
    assert result.files_added == 4  # one per event type
    assert DeltaTable(uri, storage_options=options).to_pyarrow_table().num_rows == 2000


def test_arrow_ingest_writes_azure_blob_storage(kafka, azurite, tmp_path):
    """``deltaflow ingest`` on the Arrow engine into Azure (azurite), settings from the
    environment as a deployment gives them: the tasks write both tables' files to the blob
    store, the driver commits them; every message is in one of the two tables once."""
    from deltalake import write_deltalake

    from tests.fixtures.ingest_messages import SCHEMA, TRANSFORMS, _assert_split, _message

    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [_message(i) for i in range(200)], partitions=2, batched=True)
    uri, dlq_uri = azurite.uri("ingest"), azurite.uri("ingest-dlq")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "DELTAFLOW_TEST_"))}
    env.update({"AZURE_STORAGE_USE_EMULATOR": "true", "AZURITE_BLOB_STORAGE_URL": azurite.endpoint})
    args = [sys.executable, "-m", "deltaflow.cli", "ingest", topic, uri, "--kafka", kafka.bootstrap]
    args += ["--app_id", "to-azure", "--schema", SCHEMA, "--engine", "arrow", "--ends-at-latest-offsets"]
    args += ["--dlq-table-location", dlq_uri, "--max-messages-per-batch", "80"]
    args += ["--checkpoint-location", str(tmp_path / "cp")]
    for t in TRANSFORMS:
        args += ["-t", t]
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "; arrow engine)" in done.stderr

    options = azurite.storage_options
    local = {"t": tmp_path / "t", "dlq": tmp_path / "dlq"}
    for name, table_uri in (("t", uri), ("dlq", dlq_uri)):  # a local copy for the shared checks
        table = DeltaTable(table_uri, storage_options=options)
        assert stored_data_files(table_uri, options) == referenced_files(table)  # the tasks' files, committed
        write_deltalake(str(local[name]), table.to_pyarrow_table())
    _assert_split(local["t"], local["dlq"], 200, partitions=2)


@pytest.mark.parametrize("form", ["az", "abfss"])
def test_add_files_registers_files_in_azure_under_either_uri_form(azurite, form):
    """Files landed in the blob store are registered where they are, whether the table is named
    ``az://container/path`` or ``abfss://container@account.dfs.core.windows.net/path``."""
    import pyarrow.parquet as pq

    name = azurite.uri("landed").removeprefix(f"az://{azurite.container}/")
    uri = {
        "az": f"az://{azurite.container}/{name}",
        "abfss": f"abfss://{azurite.container}@devstoreaccount1.dfs.core.windows.net/{name}",
    }[form]
    options = azurite.storage_options
    fs, root = filesystem(uri, options)
    for day in ("2026-11-01", "2026-11-02"):
        fs.create_dir(f"{root}/day={day}")
        with fs.open_output_stream(f"{root}/day={day}/landed.parquet") as out:
            pq.write_table(pa.table({"id": [1, 2, 3]}), out)

    result = ops.add_files(uri, [uri], storage_options=options)
    assert result.files_added == 2
    table = DeltaTable(uri, storage_options=options)
    paths = sorted(pa.table(table.get_add_actions(flatten=True))["path"].to_pylist())
    assert paths == ["day=2026-11-01/landed.parquet", "day=2026-11-02/landed.parquet"]
    assert table.metadata().partition_columns == ["day"]
    assert table.to_pyarrow_table().num_rows == 6
    again = ops.add_files(uri, [uri], storage_options=options)
    assert (again.files_added, again.files_skipped) == (0, 2)  # registered once
