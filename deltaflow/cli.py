"""The ``deltaflow`` command line. Thin: parsing and output only; the work lives in modules.

pyspark is imported inside the commands that need it, so ``--help`` is instant.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from deltaflow import __version__
from deltaflow.exceptions import DeltaflowError, TerminalError

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
    from deltaflow.demo import run_demo, run_kafka_demo

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
    help="Seconds between commits (the micro-batch trigger interval).",
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
@click.option(
    "--metrics_port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    envvar="METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on this port (/metrics): rows, bytes, files, commits, retries, "
    "latency, dead letters, unknown fields, lag per partition, rates.",
)
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

    from deltaflow.ingest import IngestConfig
    from deltaflow.ingest import ingest as start_ingest

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
    )  # validates every flag (and parses the transforms) before Spark starts
    import deltaflow

    if metrics_port is not None:
        from deltaflow.metrics import metrics

        try:
            bound = metrics.serve(metrics_port)
        except OSError as exc:
            raise click.BadParameter(f"cannot serve metrics on port {metrics_port}: {exc}") from None
        click.echo(f"metrics on http://0.0.0.0:{bound}/metrics", err=True)
    spark = deltaflow.spark_session(spark_master)
    from deltaflow.daemon import run_until_stopped

    try:
        # Restarts the query with backoff when the broker goes away; stops on SIGTERM/SIGINT.
        summary = run_until_stopped(lambda: start_ingest(spark, config), name=app_id, poll_s=STOP_POLL_S)
    finally:
        spark.stop()
    if summary.signal is not None:
        click.echo(f"stopped by {signal.Signals(summary.signal).name}", err=True)
    if summary.restarts:
        click.echo(f"the query was restarted {summary.restarts} time(s) after transient failures", err=True)
    click.echo(f"ingested {summary.messages:,} message(s) in {summary.batches} batch(es) into {table_uri}")


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


if __name__ == "__main__":  # pragma: no cover
    main()
