"""The ``deltaflow`` command line. Thin: parsing and output only; the work lives in modules.

pyspark is imported inside the commands that need it, so ``--help`` is instant.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from deltaflow._version import __version__
from deltaflow.errors import DeltaflowError, TerminalError

__all__ = ["main"]

#: Exit codes: 0 ok, 1 a failure that may pass on retry, 2 bad input or configuration.
EXIT_TRANSIENT = 1
EXIT_TERMINAL = 2


class _Lines(click.types.StringParamType):
    """A repeatable option whose environment variable holds one value per line (transforms and
    settings contain spaces, so click's default whitespace split would cut them apart)."""

    name = "text"
    envvar_list_splitter = "\n"

    def split_envvar_value(self, rv: str) -> list[str]:
        return [line.strip() for line in (rv or "").splitlines() if line.strip()]


LINES = _Lines()

_METRICS_PORT = click.option(
    "--metrics_port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    envvar="METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on this port (/metrics): rows, bytes, files, commits, retries, "
    "latency, dead letters, unknown fields, lag per partition, rates.",
)
_STATUS_PORT = click.option(
    "--status_port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    envvar="STATUS_PORT",
    show_envvar=True,
    help="Serve a read-only status page on this port (/ and /status.json): state, last batch, "
    "throughput and lag over the last 15 minutes, table health.",
)

#: How often the daemon loop checks for a stop signal while a query runs.
STOP_POLL_S = 1


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="deltaflow")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    envvar="DELTAFLOW_VERBOSE",
    show_envvar=True,
    help="Debug logging and full tracebacks.",
)
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """deltaflow: exactly-once streaming into Delta Lake tables with PySpark."""
    ctx.obj = {"verbose": verbose}
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@cli.command()
@click.option(
    "--source",
    type=click.Choice(["kafka", "files"]),
    default="kafka",
    envvar="DELTAFLOW_DEMO_SOURCE",
    show_envvar=True,
    help="kafka: an embedded broker and `deltaflow ingest`; files: a landing folder of JSON files.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-output"),
    envvar="DELTAFLOW_DEMO_WORKDIR",
    show_envvar=True,
    help="Folder for the landing files and the Delta tables (recreated).",
)
@click.option(
    "--events",
    type=click.IntRange(min=1),
    default=None,
    envvar="DELTAFLOW_DEMO_EVENTS",
    show_envvar=True,
    help="JSON events to generate [default: 100,000 for kafka, 300,000 for files].",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=4,
    envvar="DELTAFLOW_DEMO_PARTITIONS",
    show_envvar=True,
    help="kafka: partitions of the demo topic.",
)
@click.option(
    "--files",
    type=click.IntRange(min=1),
    default=12,
    envvar="DELTAFLOW_DEMO_FILES",
    show_envvar=True,
    help="files: landing files to spread the events over.",
)
@click.option(
    "--files-per-batch",
    type=click.IntRange(min=1),
    default=3,
    envvar="DELTAFLOW_DEMO_FILES_PER_BATCH",
    show_envvar=True,
    help="files: landing files per micro-batch (Spark's maxFilesPerTrigger).",
)
@click.option(
    "--spark-master",
    default=None,
    envvar="DELTAFLOW_SPARK_MASTER",
    show_envvar=True,
    help="Spark master URL [default: local[*]].",
)
def demo(
    source: str,
    workdir: Path,
    events: int | None,
    partitions: int,
    files: int,
    files_per_batch: int,
    spark_master: str | None,
) -> None:
    """The main job on embedded defaults: clickstream events into a local Delta table."""
    from deltaflow.pipeline.demo import run_demo, run_kafka_demo

    if source == "kafka":
        outcome = run_kafka_demo(
            workdir, events=events or 100_000, partitions=partitions, master=spark_master, echo=click.echo
        )
        if not outcome.exactly_once:
            raise click.ClickException("the tables do not hold every message exactly once")
        return
    events = events or 300_000
    result = run_demo(
        workdir,
        events=events,
        files=files,
        files_per_batch=files_per_batch,
        master=spark_master,
        echo=click.echo,
    )
    if result.rows != events or result.distinct_ids != events:
        raise click.ClickException("the table does not hold every event exactly once")


class ProgressLine:
    """A one-line progress bar on a terminal (``--ends_at_latest_offsets`` backfills)."""

    WIDTH = 30

    def __init__(self) -> None:
        self._shown = False

    @classmethod
    def render(cls, done: int, left: int, rate: float) -> str:
        total = done + left
        fraction = done / total if total else 1.0
        filled = int(cls.WIDTH * fraction)
        eta = f", ~{left / rate:.0f} s left" if left and rate else ""
        return (
            f"[{'#' * filled}{'.' * (cls.WIDTH - filled)}] {fraction:4.0%} "
            f"{done:,}/{total:,} messages, {rate:,.0f} msgs/s{eta}"
        )

    def show(self, done: int, left: int, rate: float) -> None:
        click.echo("\r" + self.render(done, left, rate).ljust(100), nl=False, err=True)
        self._shown = True

    def close(self) -> None:
        if self._shown:
            click.echo("", err=True)


def _key_values(values: tuple[str, ...], flag: str) -> dict[str, str]:
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} must look like key=value", param_hint=flag)
        out[key.strip()] = value.strip()
    return out


@cli.command()
@click.argument("topic", envvar="KAFKA_TOPIC")
@click.argument("table_uri", envvar="TABLE_URI")
@click.option(
    "--kafka",
    "brokers",
    default="localhost:9092",
    envvar="KAFKA_BROKERS",
    show_envvar=True,
    help="Kafka bootstrap servers.",
)
@click.option(
    "--app_id",
    default="kafka_delta_ingest",
    envvar="APP_ID",
    show_envvar=True,
    help="Stable pipeline id: the Delta txn prefix <app_id>-<topic>-<partition> and checkpoint name.",
)
@click.option(
    "--consumer_group_id",
    "--consumer_group",
    "consumer_group",
    default=None,
    envvar="KAFKA_CONSUMER_GROUP_ID",
    show_envvar=True,
    help="Kafka group.id of the reading consumers.",
)
@click.option(
    "--allowed_latency",
    type=click.FloatRange(min=0),
    default=10.0,
    envvar="ALLOWED_LATENCY",
    show_envvar=True,
    help="Seconds a message may wait for its commit: a micro-batch starts this long after the "
    "previous one started, or at once when --max_messages_per_batch messages wait (a backlog "
    "drains batch after batch without pauses).",
)
@click.option(
    "--max_messages_per_batch",
    type=click.IntRange(min=0),
    default=500_000,
    envvar="MAX_MESSAGES_PER_BATCH",
    show_envvar=True,
    help="Admission control per micro-batch (0 = no limit).",
)
@click.option(
    "--auto_offset_reset",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    envvar="AUTO_OFFSET_RESET",
    show_envvar=True,
    help="Where to start when the table holds no progress for a partition.",
)
@click.option(
    "--seek_offsets",
    default=None,
    envvar="SEEK_OFFSETS",
    show_envvar=True,
    help="""Start offsets per partition as JSON, e.g. '{"0":123}'.""",
)
@click.option(
    "-t",
    "--transform",
    "transforms",
    multiple=True,
    type=LINES,
    envvar="TRANSFORMS",
    show_envvar=True,
    help="'target.path: source' (repeatable; in the env var one per line): "
    "kafka.<partition|offset|topic|timestamp|key|headers>, "
    "a JSON field path, substr(path, `0`, `10`), epoch_seconds_to_iso8601(path), "
    "epoch_millis_to_iso8601(path), or 'sql: <expr>'.",
)
@click.option(
    "-K",
    "--kafka_setting",
    "kafka_settings",
    multiple=True,
    type=LINES,
    envvar="KAFKA_SETTINGS",
    show_envvar=True,
    help="librdkafka setting key=value (repeatable).",
)
@click.option(
    "--ends_at_latest_offsets",
    is_flag=True,
    envvar="ENDS_AT_LATEST_OFFSETS",
    show_envvar=True,
    help="Read up to the offsets at start, commit, exit 0.",
)
@click.option(
    "--checkpoints",
    is_flag=True,
    envvar="CHECKPOINTS",
    show_envvar=True,
    help="Write Delta log checkpoints (always done: every 10 commits, at delta-rs' interval).",
)
@click.option(
    "--json", "value_format", flag_value="json", default=True, help="Values are JSON objects (default)."
)
@click.option("--raw", "value_format", flag_value="raw", help="Store the value bytes as they are.")
@click.option(
    "--avro",
    default=None,
    envvar="AVRO",
    show_envvar=True,
    help="Values are Avro: a schema registry URL (Confluent wire format) or an .avsc file (bare datums).",
)
@click.option(
    "--decompress_gzip",
    is_flag=True,
    envvar="DECOMPRESS_GZIP",
    show_envvar=True,
    help="Values are gzip-compressed: decompress before decoding.",
)
@click.option(
    "--dlq_table_location",
    default=None,
    envvar="DLQ_TABLE_LOCATION",
    show_envvar=True,
    help="Delta table for messages that fail decoding or a transform (raw bytes in base64, error, "
    "coordinates). Without it they are counted, logged and skipped.",
)
@click.option(
    "--dlq_transform",
    "dlq_transforms",
    multiple=True,
    type=LINES,
    envvar="DLQ_TRANSFORMS",
    show_envvar=True,
    help="'target: source' transform of dead-letter rows (repeatable), over their columns "
    "(topic, partition, offset, kafka_timestamp, key_base64, value_base64, error, dead_lettered_at).",
)
@click.option(
    "--min_bytes_per_file",
    type=click.IntRange(min=1),
    default=None,
    envvar="MIN_BYTES_PER_FILE",
    show_envvar=True,
    help="Target size of the Parquet files written [default: 128 MiB]; commits still happen every "
    "--allowed_latency.",
)
@click.option(
    "--commit_to_group",
    is_flag=True,
    envvar="COMMIT_TO_GROUP",
    show_envvar=True,
    help="After each Delta commit, commit the offsets to --consumer_group_id too (lag monitoring "
    "with standard Kafka tools; progress is always read from the Delta log).",
)
@click.option(
    "--schema_evolution",
    is_flag=True,
    envvar="SCHEMA_EVOLUTION",
    show_envvar=True,
    help="New top-level JSON fields become table columns (typed from the messages; the query "
    "restarts to decode them). Without it they are reported, not stored.",
)
@_METRICS_PORT
@click.option(
    "--auto_compact/--no_auto_compact",
    default=True,
    envvar="AUTO_COMPACT",
    show_envvar=True,
    help="Compact a partition in the background once it holds --auto_compact_min_files small files.",
)
@click.option(
    "--auto_compact_min_files",
    type=click.IntRange(min=2),
    default=50,
    envvar="AUTO_COMPACT_MIN_FILES",
    show_envvar=True,
    help="Small files (below half the target file size) in one partition that trigger a compaction.",
)
@click.option(
    "--vacuum_interval_hours",
    type=click.FloatRange(min=0),
    default=0.0,
    envvar="VACUUM_INTERVAL_HOURS",
    show_envvar=True,
    help="Vacuum the tables this often in the background (0 = never); never below their retention.",
)
@_STATUS_PORT
@click.option(
    "--write_path",
    type=click.Choice(["auto", "spark", "arrow"]),
    default="auto",
    envvar="WRITE_PATH",
    show_envvar=True,
    help="Who writes the Parquet files: Spark (local tables) or pyarrow in the tasks (any storage).",
)
@click.option(
    "--schema",
    default=None,
    envvar="VALUE_SCHEMA",
    show_envvar=True,
    help="JSON value schema as Spark DDL ('id LONG, ts TIMESTAMP'); default: the table's, "
    "or inferred from the topic.",
)
@click.option(
    "--partition_by",
    multiple=True,
    envvar="PARTITION_BY",
    show_envvar=True,
    help="Partition column of a new table (repeatable).",
)
@click.option(
    "--checkpoint_location",
    default=None,
    envvar="CHECKPOINT_LOCATION",
    show_envvar=True,
    help="Spark checkpoint folder [default: <table>/_deltaflow/checkpoints/<app_id>].",
)
@click.option(
    "--spark_master",
    default=None,
    envvar="DELTAFLOW_SPARK_MASTER",
    show_envvar=True,
    help="Spark master URL [default: local[*]].",
)
def ingest(
    topic: str,
    table_uri: str,
    brokers: str,
    app_id: str,
    consumer_group: str | None,
    allowed_latency: float,
    max_messages_per_batch: int,
    auto_offset_reset: str,
    seek_offsets: str | None,
    transforms: tuple[str, ...],
    kafka_settings: tuple[str, ...],
    ends_at_latest_offsets: bool,
    checkpoints: bool,
    value_format: str,
    avro: str | None,
    decompress_gzip: bool,
    dlq_table_location: str | None,
    dlq_transforms: tuple[str, ...],
    min_bytes_per_file: int | None,
    commit_to_group: bool,
    schema_evolution: bool,
    metrics_port: int | None,
    status_port: int | None,
    auto_compact: bool,
    auto_compact_min_files: int,
    vacuum_interval_hours: float,
    write_path: str,
    schema: str | None,
    partition_by: tuple[str, ...],
    checkpoint_location: str | None,
    spark_master: str | None,
) -> None:
    """Ingest a Kafka TOPIC into the Delta table at TABLE_URI, exactly once.

    Each micro-batch is one Delta commit holding its rows and, per partition, the last
    offset written (txn <app_id>-<topic>-<partition>); a restart resumes from the table.
    """
    import json as _json
    import signal

    from deltaflow.pipeline.ingest import IngestConfig
    from deltaflow.pipeline.ingest import ingest as start_ingest

    try:
        seek = {str(k): int(v) for k, v in _json.loads(seek_offsets).items()} if seek_offsets else None
    except (ValueError, AttributeError) as exc:
        raise click.BadParameter(
            f"not a JSON object of partition -> offset: {exc}", param_hint="--seek_offsets"
        ) from None
    if avro:
        if value_format == "raw":
            raise click.BadParameter("--avro and --raw exclude each other", param_hint="--avro")
        value_format = "avro"
    config = IngestConfig(
        topic=topic,
        table_uri=table_uri,
        brokers=brokers,
        app_id=app_id,
        allowed_latency=allowed_latency,
        max_messages_per_batch=max_messages_per_batch,
        auto_offset_reset=auto_offset_reset,  # type: ignore[arg-type]
        seek_offsets=seek,
        transforms=transforms,
        value_format=value_format,  # type: ignore[arg-type]
        schema=schema,
        ends_at_latest_offsets=ends_at_latest_offsets,
        checkpoint_location=checkpoint_location,
        partition_by=partition_by,
        kafka_settings=_key_values(kafka_settings, "--kafka_setting"),
        consumer_group=consumer_group,
        avro=avro,
        decompress_gzip=decompress_gzip,
        dlq_table_location=dlq_table_location,
        dlq_transforms=dlq_transforms,
        min_bytes_per_file=min_bytes_per_file,
        commit_to_group=commit_to_group,
        schema_evolution=schema_evolution,
        write_path=write_path,  # type: ignore[arg-type]
        auto_compact=auto_compact,
        auto_compact_min_files=auto_compact_min_files,
        vacuum_interval_hours=vacuum_interval_hours,
    )  # validates every flag (and parses the transforms) before Spark starts
    import deltaflow
    from deltaflow.service.status import board

    board.register(app_id, table_uri=table_uri, source=f"kafka {topic} @ {brokers}")
    _serve(metrics_port, status_port)
    spark = deltaflow.spark_session(spark_master)
    from deltaflow.service.daemon import run_until_stopped

    try:
        # Restarts the query with backoff when the broker goes away; stops on SIGTERM/SIGINT.
        bar = ProgressLine() if ends_at_latest_offsets and sys.stderr.isatty() else None
        try:
            summary = run_until_stopped(
                lambda: start_ingest(spark, config),
                name=app_id,
                poll_s=STOP_POLL_S,
                on_progress=bar.show if bar else None,
            )
        finally:
            if bar:
                bar.close()
    finally:
        spark.stop()
    if summary.signal is not None:
        click.echo(f"stopped by {signal.Signals(summary.signal).name}", err=True)
    if summary.restarts:
        click.echo(f"the query was restarted {summary.restarts} time(s) after transient failures", err=True)
    click.echo(f"ingested {summary.messages:,} message(s) in {summary.batches} batch(es) into {table_uri}")


# ---------------------------------------------------------------------------------------------
# Declarative pipelines (deltaflow.config.pipeline, deltaflow.pipeline.runner).


@cli.command()
@click.argument("pipeline_file", type=click.Path(dir_okay=False))
@click.option("--show", is_flag=True, help="Print the resolved configuration (secrets masked).")
def validate(pipeline_file: str, show: bool) -> None:
    """Check PIPELINE_FILE without starting Spark: every problem with its YAML path."""
    from deltaflow.config.pipeline import load_pipelines
    from deltaflow.config.secrets import masked

    file = load_pipelines(pipeline_file)
    if show:
        import yaml

        dumped = masked(file.model_dump(mode="json", by_alias=True, exclude_defaults=True))
        click.echo(yaml.safe_dump(dumped, sort_keys=False).rstrip())
    _describe_pipelines(pipeline_file, file)


def _run_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options ``run`` and ``sql`` share."""
    for decorator in reversed(
        [
            click.option(
                "--pipeline",
                "pipeline_ids",
                multiple=True,
                help="Run only this pipeline (repeatable) [default: every enabled pipeline of the file].",
            ),
            click.option(
                "--available-now",
                "--once",
                "available_now",
                is_flag=True,
                help="Commit all input available now, then exit 0 (Spark's availableNow trigger).",
            ),
            _METRICS_PORT,
            _STATUS_PORT,
            click.option(
                "--spark_master",
                default=None,
                envvar="DELTAFLOW_SPARK_MASTER",
                show_envvar=True,
                help="Spark master URL [default: the file's spark.master, else local[*]].",
            ),
        ]
    ):
        command = decorator(command)
    return command


@cli.command()
@click.argument("pipeline_file", type=click.Path(dir_okay=False))
@_run_options
def run(
    pipeline_file: str,
    pipeline_ids: tuple[str, ...],
    available_now: bool,
    metrics_port: int | None,
    status_port: int | None,
    spark_master: str | None,
) -> None:
    """Run the pipelines of PIPELINE_FILE (YAML) in one Spark application until SIGTERM/SIGINT.

    Each pipeline keeps its own checkpoint; a transient failure restarts it with backoff, a
    terminal one stops all of them (exit 2).
    """
    from deltaflow.config.pipeline import load_pipelines

    _run_file(
        pipeline_file,
        load_pipelines(pipeline_file),
        pipeline_ids,
        available_now,
        metrics_port,
        status_port,
        spark_master,
    )


@cli.command()
@click.argument("sql_file", type=click.Path(dir_okay=False))
@click.option(
    "--validate", "only_validate", is_flag=True, help="Check the file and print the pipelines; run nothing."
)
@_run_options
def sql(
    sql_file: str,
    only_validate: bool,
    pipeline_ids: tuple[str, ...],
    available_now: bool,
    metrics_port: int | None,
    status_port: int | None,
    spark_master: str | None,
) -> None:
    """Run SQL_FILE: CREATE TABLE ... WITH (connector = ...) and INSERT INTO ... SELECT statements.

    Each INSERT is a pipeline, run as ``deltaflow run`` runs those of a YAML file.
    """
    from deltaflow.config.sql import load_sql

    file = load_sql(sql_file)
    if only_validate:
        _describe_pipelines(sql_file, file)
        return
    _run_file(sql_file, file, pipeline_ids, available_now, metrics_port, status_port, spark_master)


def _serve(metrics_port: int | None, status_port: int | None) -> None:
    """Start the metrics endpoint and the status page on the ports asked for (0: any free one)."""
    if metrics_port is not None:
        from deltaflow.metrics import metrics

        try:
            bound = metrics.serve(metrics_port)
        except OSError as exc:
            raise click.BadParameter(f"cannot serve metrics on port {metrics_port}: {exc}") from None
        click.echo(f"metrics on http://0.0.0.0:{bound}/metrics", err=True)
    if status_port is not None:
        from deltaflow.service.status import board

        try:
            bound = board.serve(status_port, addr="0.0.0.0")
        except OSError as exc:
            raise click.BadParameter(f"cannot serve the status page on port {status_port}: {exc}") from None
        click.echo(f"status page on http://0.0.0.0:{bound}/", err=True)


def _describe_pipelines(name: str, file: Any) -> None:
    from deltaflow.pipeline.runner import describe_source

    for spec in file.pipelines:
        routes = ", ".join(
            f"{sink_name} -> {sink.table_uri}" + (f" when {sink.when}" if sink.when else "")
            for sink_name, sink in zip(spec.sink_names(), spec.sinks, strict=True)
        )
        extra = f"; {len(spec.expectations)} expectation(s)" if spec.expectations else ""
        off = "" if spec.enabled else " (disabled)"
        click.echo(f"{spec.id}{off}: {describe_source(spec)} => {routes}{extra}")
    click.echo(f"{name}: {len(file.pipelines)} pipeline(s), valid")


def _run_file(
    name: str,
    file: Any,
    pipeline_ids: tuple[str, ...],
    available_now: bool,
    metrics_port: int | None,
    status_port: int | None,
    spark_master: str | None,
) -> None:
    import signal

    from deltaflow.service.daemon import run_pipelines

    selected = file.selected(pipeline_ids)
    if not selected:
        raise click.UsageError(f"{name}: no enabled pipeline to run")
    _serve(metrics_port, status_port)
    import deltaflow

    spark = deltaflow.spark_session(spark_master or file.spark.master, **file.spark.conf)
    try:
        summaries = run_pipelines(spark, selected, available_now=available_now)
    finally:
        spark.stop()
    for pipeline, summary in summaries.items():
        note = f", {summary.restarts} restart(s)" if summary.restarts else ""
        click.echo(f"{pipeline}: {summary.messages:,} row(s) in {summary.batches} batch(es){note}")
    stopped = {s.signal for s in summaries.values() if s.signal}
    if stopped:
        click.echo(f"stopped by {', '.join(signal.Signals(s).name for s in sorted(stopped))}", err=True)


# ---------------------------------------------------------------------------------------------
# Table maintenance (deltaflow.ops.maintenance): no Spark, text or --json output.

_JSON = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for scripts).")
_STORAGE = click.option(
    "--storage-option",
    "storage_options",
    multiple=True,
    type=LINES,
    envvar="DELTAFLOW_STORAGE_OPTIONS",
    show_envvar=True,
    callback=lambda _ctx, _param, values: _key_values(values, "--storage-option"),
    help="key=value for the object store (repeatable), e.g. AWS_ENDPOINT_URL=http://127.0.0.1:9000.",
)


def _emit(as_json: bool, value: object, text: Callable[[], None]) -> None:
    if as_json:
        from deltaflow.ops.maintenance import to_jsonable

        click.echo(json.dumps(to_jsonable(value), indent=2, default=str))
    else:
        text()


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def _print_rows(table: object) -> None:
    import pyarrow as pa

    assert isinstance(table, pa.Table)
    if table.num_rows == 0:
        click.echo(f"(no rows; columns: {', '.join(table.column_names)})")
        return
    frame = table.to_pandas()
    click.echo(frame.to_string(index=False, max_colwidth=60))
    click.echo(f"({table.num_rows} row(s))")


@cli.command()
@click.argument("table_uri")
@click.option("--where", help="Partition predicate: date = '2026-11-22' AND country IN ('DE', 'FR').")
@click.option(
    "--zorder", multiple=True, help="Z-order by these data columns (repeatable) instead of bin-packing."
)
@click.option("--target-size", default="256MB", help="Target file size (e.g. 128MB, 1GB).")
@_STORAGE
@_JSON
def optimize(
    table_uri: str,
    where: str | None,
    zorder: tuple[str, ...],
    target_size: str,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Compact small files (bin-packing) or Z-order them; the data does not change."""
    from deltaflow.ops import maintenance

    click.echo(f"{'z-ordering' if zorder else 'compacting'} {table_uri} ...", err=True)
    started = time.monotonic()
    result = maintenance.optimize(
        table_uri,
        where=where,
        zorder=zorder,
        target_size=target_size,
        storage_options=storage_options,
    )
    _emit(
        as_json,
        result,
        lambda: click.echo(
            f"{result.mode}: {result.files_removed} file(s) ({_size(result.bytes_removed)}) -> "
            f"{result.files_added} file(s) ({_size(result.bytes_added)}) in "
            f"{result.partitions_optimized} partition(s); table version {result.version} "
            f"({time.monotonic() - started:.1f} s)"
        ),
    )


@cli.command()
@click.argument("table_uri")
@click.option(
    "--retention-hours",
    type=click.IntRange(min=0),
    help="Keep files needed by versions this recent "
    "[default: the table's delta.deletedFileRetentionDuration, 168 h unless set].",
)
@click.option("--dry-run/--execute", default=True, help="List the files (default) or delete them.")
@click.option("--full", is_flag=True, help="Also delete files no commit ever referenced (failed writes).")
@click.option("--force", is_flag=True, help="Allow a retention below the table's minimum.")
@_STORAGE
@_JSON
def vacuum(
    table_uri: str,
    retention_hours: int | None,
    dry_run: bool,
    full: bool,
    force: bool,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Delete data files older versions no longer need (a dry run unless --execute)."""
    from deltaflow.ops import maintenance

    result = maintenance.vacuum(
        table_uri,
        retention_hours=retention_hours,
        dry_run=dry_run,
        full=full,
        force=force,
        storage_options=storage_options,
    )

    def text() -> None:
        for path in [*result.files, *result.staging_files]:
            click.echo(path)
        count = len(result.files) + len(result.staging_files)
        if result.dry_run:
            click.echo(
                f"dry run: {count} file(s) would be deleted (retention {result.retention_hours} h); "
                "add --execute to delete them",
                err=True,
            )
        else:
            click.echo(f"deleted {count} file(s) (retention {result.retention_hours} h)", err=True)

    _emit(as_json, result, text)


@cli.command()
@click.argument("table_uri")
@click.option(
    "--cleanup", is_flag=True, help="Also delete log entries older than delta.logRetentionDuration."
)
@_STORAGE
@_JSON
def checkpoint(table_uri: str, cleanup: bool, storage_options: dict[str, str], as_json: bool) -> None:
    """Write a Delta log checkpoint of the current version."""
    from deltaflow.ops import maintenance

    result = maintenance.checkpoint(table_uri, cleanup=cleanup, storage_options=storage_options)
    _emit(as_json, result, lambda: click.echo(f"checkpoint written at version {result['version']}"))


@cli.command()
@click.argument("table_uri")
@click.option("--limit", type=click.IntRange(min=1), help="Newest N commits only.")
@_STORAGE
@_JSON
def history(table_uri: str, limit: int | None, storage_options: dict[str, str], as_json: bool) -> None:
    """The table's commits, newest first."""
    from deltaflow.ops import maintenance

    entries = maintenance.history(table_uri, limit=limit, storage_options=storage_options)

    def text() -> None:
        for e in entries:
            params = e.get("operationParameters") or {}
            extra = {k: v for k, v in e.items() if k.startswith("deltaflow.")}
            detail = ", ".join(f"{k}={v}" for k, v in {**params, **extra}.items())
            click.echo(
                f"{e.get('version', '?'):>6}  {e.get('timestamp', '')}  {e.get('operation', ''):<10} {detail}"
            )

    _emit(as_json, entries, text)


@cli.command()
@click.argument("table_uri")
@click.option("--small-file-size", default="128MB", help="Files below this size count as small.")
@_STORAGE
@_JSON
def describe(table_uri: str, small_file_size: str, storage_options: dict[str, str], as_json: bool) -> None:
    """Schema, partitioning, properties, protocol, version, files and their sizes."""
    from deltaflow.ops import maintenance

    info = maintenance.describe(
        table_uri,
        small_file_size=small_file_size,
        storage_options=storage_options,
    )

    def text() -> None:
        files = info["files"]
        protocol = info["protocol"]
        click.echo(f"table      {info['table_uri']}")
        click.echo(f"version    {info['version']} (created {info['created']}, id {info['id']})")
        click.echo(
            f"partitions {', '.join(info['partition_columns']) or '-'} ({files['partitions']} value(s))"
        )
        click.echo(
            f"protocol   reader {protocol['min_reader_version']}, writer {protocol['min_writer_version']}"
            + (f", features {', '.join(protocol['writer_features'])}" if protocol["writer_features"] else "")
        )
        click.echo(
            f"files      {files['count']} ({_size(files['bytes'])}, {files['rows']} rows); small "
            f"(< {_size(files['small_file_size'])}): {files['small_files']} "
            f"({files['small_file_ratio']:.0%})"
        )
        for bucket in files["size_histogram"]:
            upper = _size(bucket["to_bytes"]) if bucket["to_bytes"] is not None else "+"
            click.echo(f"  {_size(bucket['from_bytes']):>9} .. {upper:<9} {bucket['files']}")
        click.echo("schema")
        for f in info["schema"]:
            click.echo(f"  {f['name']}: {f['type']}{'' if f['nullable'] else ' NOT NULL'}")
        if info["properties"]:
            click.echo("properties")
            for key, value in sorted(info["properties"].items()):
                click.echo(f"  {key} = {value}")

    _emit(as_json, info, text)


@cli.command()
@click.argument("table_uri")
@click.option("--version", "version", type=click.IntRange(min=0), help="The version to restore.")
@click.option("--timestamp", help="Restore the last version committed at or before this ISO-8601 time.")
@_STORAGE
@_JSON
def restore(
    table_uri: str,
    version: int | None,
    timestamp: str | None,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Make an earlier version the current content again (a new commit; history is kept)."""
    from deltaflow.ops import maintenance

    result = maintenance.restore(
        table_uri,
        version=version,
        timestamp=timestamp,
        storage_options=storage_options,
    )
    _emit(
        as_json,
        result,
        lambda: click.echo(
            f"restored {result.table_uri} to version {result.restored_to}: now version {result.version}"
        ),
    )


@cli.command()
@click.argument("table_uri")
@click.argument("action", type=click.Choice(["show", "set", "unset"]), default="show")
@click.argument("items", nargs=-1)
@_STORAGE
@_JSON
def properties(
    table_uri: str, action: str, items: tuple[str, ...], storage_options: dict[str, str], as_json: bool
) -> None:
    """Show table properties, or `set k=v ...` / `unset k ...` them."""
    from deltaflow.ops import maintenance

    if action != "show" and not items:
        raise click.BadParameter(f"{action} needs at least one property", param_hint="ITEMS")
    result = maintenance.properties(
        table_uri,
        set_=_key_values(items, "ITEMS") if action == "set" else None,
        unset=items if action == "unset" else (),
        storage_options=storage_options,
    )
    _emit(as_json, result, lambda: click.echo("\n".join(f"{k} = {v}" for k, v in sorted(result.items()))))


@cli.command()
@click.argument("table_uri")
@click.option("--version", "version", type=click.IntRange(min=0), help="Read this version (time travel).")
@click.option("--timestamp", help="Read the table as of this ISO-8601 time.")
@click.option("--where", help="SQL predicate over the columns, e.g. \"country = 'DE' AND amount > 10\".")
@click.option("--column", "columns", multiple=True, help="Only these columns (repeatable).")
@click.option("--limit", type=click.IntRange(min=0), default=20, help="At most N rows (0 = all).")
@_STORAGE
@_JSON
def read(
    table_uri: str,
    version: int | None,
    timestamp: str | None,
    where: str | None,
    columns: tuple[str, ...],
    limit: int,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Print rows of the table, now or at an earlier version."""
    from deltaflow.ops import maintenance

    rows = maintenance.read(
        table_uri,
        version=version,
        timestamp=timestamp,
        where=where,
        columns=columns,
        limit=limit or None,
        storage_options=storage_options,
    )
    _emit(as_json, rows, lambda: _print_rows(rows))


@cli.command()
@click.argument("table_uri")
@click.option("--from-version", type=click.IntRange(min=0), default=0, help="First version to include.")
@click.option("--to-version", type=click.IntRange(min=0), help="Last version to include [default: current].")
@click.option("--limit", type=click.IntRange(min=0), default=0, help="At most N rows (0 = all).")
@_STORAGE
@_JSON
def changes(
    table_uri: str,
    from_version: int,
    to_version: int | None,
    limit: int,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Print the change data feed (tables with delta.enableChangeDataFeed=true)."""
    from deltaflow.ops import maintenance

    rows = maintenance.changes(
        table_uri,
        from_version=from_version,
        to_version=to_version,
        limit=limit or None,
        storage_options=storage_options,
    )
    _emit(as_json, rows, lambda: _print_rows(rows))


@cli.command()
@click.argument("table_uris", nargs=-1)
@click.option("--url", help="A running daemon's status page (its --status_port), e.g. http://127.0.0.1:8080.")
@click.option("--minutes", type=click.IntRange(min=1), default=15, help="Window for commits and throughput.")
@_STORAGE
@_JSON
def status(
    table_uris: tuple[str, ...],
    url: str | None,
    minutes: int,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Pipelines and table health: from a running daemon (--url) or from tables' Delta logs."""
    from deltaflow.service import status as status_module

    if bool(url) == bool(table_uris):
        raise click.UsageError("give either TABLE_URI(s) or --url")
    if url:
        import urllib.request

        target = url.rstrip("/") + "/status.json"
        try:
            with urllib.request.urlopen(target, timeout=10) as response:
                data = json.load(response)
        except OSError as exc:
            raise click.ClickException(f"cannot read {target}: {exc}") from None
        _emit(as_json, data, lambda: _print_daemon_status(data))
        return
    tables = [
        status_module.table_status(u, minutes=minutes, storage_options=storage_options) for u in table_uris
    ]

    def text() -> None:
        for info in tables:
            _print_table_status(info)

    _emit(as_json, tables, text)


def _print_health(health: dict[str, Any] | None) -> None:
    if not health:
        click.echo("  table: not available yet")
        return
    last = health["last_compaction"]
    click.echo(
        f"  table: version {health['version']}, {health['files']} file(s) ({_size(health['bytes'])}, "
        f"{health['rows']} rows), small {health['small_file_ratio']:.0%}, last compaction "
        + (f"version {last['version']} at {last['at']}" if last else "none")
    )


def _print_table_status(info: dict[str, Any]) -> None:
    click.echo(f"{info['table_uri']}")
    _print_health(info["table"])
    if not info["pipelines"]:
        click.echo("  no deltaflow pipeline commits in the last 1000 commits")
    for p in info["pipelines"]:
        last = p["last_commit"]
        click.echo(
            f"  pipeline {p['name']}: last batch {last['batch_id']} ({last['rows']} rows) at {last['at']} "
            f"(version {last['version']}); {p['commits_in_window']} commit(s), {p['rows_in_window']} rows in "
            f"{info['window_minutes']} min ({p['rows_per_second']} rows/s)"
        )


def _print_daemon_status(data: dict[str, Any]) -> None:
    for p in data["pipelines"]:
        batch = p["last_batch"]
        click.echo(f"{p['name']}: {p['state']} since {p['since']} ({p['restarts']} restart(s))")
        click.echo(f"  source {p['source']} -> {p['table_uri']}")
        click.echo(
            "  last batch "
            + (f"{batch['batch_id']}: {batch['rows']} rows at {batch['at']}" if batch else "-")
            + f"; {p['rows_last_minute']} rows in the last minute; lag {p['lag']}"
        )
        if p["error"]:
            click.echo(f"  error: {p['error']}")
        _print_health(p["table"])


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the CLI and maps exceptions to exit codes and short messages."""
    verbose = "-v" in (argv or sys.argv) or "--verbose" in (argv or sys.argv)
    try:
        cli.main(args=argv, prog_name="deltaflow", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except DeltaflowError as exc:
        if verbose:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_TERMINAL if isinstance(exc, TerminalError) else EXIT_TRANSIENT)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        from deltaflow.delta.log import is_delta_rs_error

        if verbose or not is_delta_rs_error(exc):
            raise
        click.echo(f"error: delta-rs: {exc}", err=True)  # e.g. a commit that lost a race
        sys.exit(EXIT_TRANSIENT)


if __name__ == "__main__":  # pragma: no cover
    main()
