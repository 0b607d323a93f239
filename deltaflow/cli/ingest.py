"""``deltaflow ingest``: a Kafka topic into a Delta table, with kafka-delta-ingest's flags."""

from __future__ import annotations

import sys

import click

from deltaflow.cli.options import LINES, METRICS_PORT, STATUS_PORT, key_values, serve
from deltaflow.cli.output import ProgressLine

__all__ = ["ingest"]

#: How often the daemon loop checks for a stop signal while a query runs.
STOP_POLL_S = 1


@click.command()
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
    "--pipeline-id",
    "--app-id",
    "--app_id",
    "pipeline_id",
    default="kafka_delta_ingest",
    envvar="APP_ID",
    show_envvar=True,
    help="Stable pipeline id: the Delta txn prefix <pipeline_id>-<topic>-<partition> and checkpoint name.",
)
@click.option(
    "--consumer-group-id",
    "--consumer_group_id",
    "--consumer_group",
    "consumer_group",
    default=None,
    envvar="KAFKA_CONSUMER_GROUP_ID",
    show_envvar=True,
    help="Kafka group.id of the reading consumers.",
)
@click.option(
    "--allowed-latency",
    "--allowed_latency",
    type=click.FloatRange(min=0),
    default=10.0,
    envvar="ALLOWED_LATENCY",
    show_envvar=True,
    help="Seconds a message may wait for its commit: a micro-batch starts this long after the "
    "previous one started, or at once when --max-messages-per-batch messages wait (a backlog "
    "drains batch after batch without pauses).",
)
@click.option(
    "--max-messages-per-batch",
    "--max_messages_per_batch",
    type=click.IntRange(min=0),
    default=500_000,
    envvar="MAX_MESSAGES_PER_BATCH",
    show_envvar=True,
    help="Admission control per micro-batch (0 = no limit).",
)
@click.option(
    "--auto-offset-reset",
    "--auto_offset_reset",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    envvar="AUTO_OFFSET_RESET",
    show_envvar=True,
    help="Where to start when the table holds no progress for a partition.",
)
@click.option(
    "--seek-offsets",
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
    help="'target.path: source' (repeatable; in the env var one per line): a JMESPath expression "
    "(kafka-delta-ingest's language) with kafka.<partition|offset|topic|timestamp|timestamp_type|key|"
    "headers>, substr(s, `skip`, `take`), epoch_seconds|millis|micros_to_iso8601(n), "
    "epoch_millis_to_micro(n); or 'sql: <expr>' (Spark engine).",
)
@click.option(
    "-K",
    "--kafka-setting",
    "--kafka_setting",
    "kafka_settings",
    multiple=True,
    type=LINES,
    envvar="KAFKA_SETTINGS",
    show_envvar=True,
    help="librdkafka setting key=value (repeatable).",
)
@click.option(
    "--ends-at-latest-offsets",
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
    envvar=["AVRO_REGISTRY", "AVRO"],
    show_envvar=True,
    help="Values are Avro: a schema registry URL (Confluent wire format), an .avsc file (bare datums), "
    "or '' (each message an Avro container file; columns from the table or --schema).",
)
@click.option(
    "--json-registry",
    "--json_registry",
    default=None,
    envvar="JSON_REGISTRY",
    show_envvar=True,
    help="JSON values in the Confluent wire format (magic byte, schema id, JSON), ids known to this "
    "schema registry URL (kafka-delta-ingest's --json <URL>).",
)
@click.option(
    "--soe-avro",
    "--soe_avro",
    default=None,
    envvar="SOE_AVRO",
    show_envvar=True,
    help="Values in Avro single-object encoding, read with the .avsc file (or the folder of them) "
    "whose fingerprint they carry.",
)
@click.option(
    "--decompress-gzip",
    "--decompress_gzip",
    is_flag=True,
    envvar="DECOMPRESS_GZIP",
    show_envvar=True,
    help="Values are gzip-compressed: decompress before decoding.",
)
@click.option(
    "--dlq-table-location",
    "--dlq_table_location",
    default=None,
    envvar="DLQ_TABLE_LOCATION",
    show_envvar=True,
    help="Delta table for messages that fail decoding or a transform (raw bytes in base64, error, "
    "coordinates). Without it they are counted, logged and skipped.",
)
@click.option(
    "--dlq-transform",
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
    "--min-bytes-per-file",
    "--min_bytes_per_file",
    type=click.IntRange(min=1),
    default=None,
    envvar="MIN_BYTES_PER_FILE",
    show_envvar=True,
    help="Target size of the Parquet files written [default: 128 MiB]; commits still happen every "
    "--allowed-latency.",
)
@click.option(
    "--commit-to-group",
    "--commit_to_group",
    is_flag=True,
    envvar="COMMIT_TO_GROUP",
    show_envvar=True,
    help="After each Delta commit, commit the offsets to --consumer-group-id too (lag monitoring "
    "with standard Kafka tools; progress is always read from the Delta log).",
)
@click.option(
    "--schema-evolution",
    "--schema_evolution",
    is_flag=True,
    envvar="SCHEMA_EVOLUTION",
    show_envvar=True,
    help="New top-level JSON fields become table columns (typed from the messages; the query "
    "restarts to decode them). Without it they are reported, not stored.",
)
@METRICS_PORT
@click.option(
    "--auto-compact/--no-auto-compact",
    "--auto_compact/--no_auto_compact",
    default=True,
    envvar="AUTO_COMPACT",
    show_envvar=True,
    help="Compact a partition in the background once it holds --auto-compact-min-files small files.",
)
@click.option(
    "--auto-compact-min-files",
    "--auto_compact_min_files",
    type=click.IntRange(min=2),
    default=50,
    envvar="AUTO_COMPACT_MIN_FILES",
    show_envvar=True,
    help="Small files (below half the target file size) in one partition that trigger a compaction.",
)
@click.option(
    "--vacuum-interval-hours",
    "--vacuum_interval_hours",
    type=click.FloatRange(min=0),
    default=0.0,
    envvar="VACUUM_INTERVAL_HOURS",
    show_envvar=True,
    help="Vacuum the tables this often in the background (0 = never); never below their retention.",
)
@STATUS_PORT
@click.option(
    "--write-path",
    "--write_path",
    type=click.Choice(["auto", "spark", "arrow"]),
    default="auto",
    envvar="WRITE_PATH",
    show_envvar=True,
    help="Who writes the Parquet files: Spark (local tables) or pyarrow in the tasks (any storage).",
)
@click.option(
    "--engine",
    type=click.Choice(["auto", "spark", "arrow"]),
    default="auto",
    help="arrow: the rows stay in Arrow inside Spark's tasks (decode, transforms, dead letters, "
    "Parquet); spark: through Spark SQL; auto: arrow whenever it can run the flags (no 'sql:' "
    "transforms, no --schema-evolution).",
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
    "--partition-by",
    "--partition_by",
    multiple=True,
    envvar="PARTITION_BY",
    show_envvar=True,
    help="Partition column of a new table (repeatable).",
)
@click.option(
    "--checkpoint-location",
    "--checkpoint_location",
    default=None,
    envvar="CHECKPOINT_LOCATION",
    show_envvar=True,
    help="Spark checkpoint folder [default: <table>/_deltaflow/checkpoints/<pipeline_id>].",
)
@click.option(
    "--spark-master",
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
    pipeline_id: str,
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
    json_registry: str | None,
    soe_avro: str | None,
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
    engine: str,
    schema: str | None,
    partition_by: tuple[str, ...],
    checkpoint_location: str | None,
    spark_master: str | None,
) -> None:
    """Ingest a Kafka TOPIC into the Delta table at TABLE_URI, exactly once.

    Each micro-batch is one Delta commit holding its rows and, per partition, the last
    offset written (txn <pipeline_id>-<topic>-<partition>); a restart resumes from the table.
    """
    import json as _json
    import signal

    from deltaflow.config.ingest import IngestConfig
    from deltaflow.pipeline.ingest import ingest as start_ingest

    try:
        seek = {str(k): int(v) for k, v in _json.loads(seek_offsets).items()} if seek_offsets else None
    except (ValueError, AttributeError) as exc:
        raise click.BadParameter(
            f"not a JSON object of partition -> offset: {exc}", param_hint="--seek-offsets"
        ) from None
    if avro is not None or soe_avro:
        if value_format == "raw":
            raise click.BadParameter("--avro and --raw exclude each other", param_hint="--avro")
        value_format = "avro"
    config = IngestConfig.build(
        topic=topic,
        table_uri=table_uri,
        brokers=brokers,
        pipeline_id=pipeline_id,
        allowed_latency=allowed_latency,
        max_messages_per_batch=max_messages_per_batch,
        auto_offset_reset=auto_offset_reset,
        seek_offsets=seek,
        transforms=transforms,
        value_format=value_format,
        value_schema=schema,
        ends_at_latest_offsets=ends_at_latest_offsets,
        checkpoint_location=checkpoint_location,
        partition_by=partition_by,
        kafka_settings=key_values(kafka_settings, "--kafka-setting"),
        consumer_group=consumer_group,
        avro=avro,
        json_registry=json_registry,
        soe_avro=soe_avro,
        decompress_gzip=decompress_gzip,
        dlq_table_location=dlq_table_location,
        dlq_transforms=dlq_transforms,
        min_bytes_per_file=min_bytes_per_file,
        commit_to_group=commit_to_group,
        schema_evolution=schema_evolution,
        write_path=write_path,
        engine=engine,
        auto_compact=auto_compact,
        auto_compact_min_files=auto_compact_min_files,
        vacuum_interval_hours=vacuum_interval_hours,
    )  # validates every flag (and parses the transforms) before Spark starts
    import deltaflow
    from deltaflow.service.status import board

    board.register(pipeline_id, table_uri=table_uri, source=f"kafka {topic} @ {brokers}")
    serve(metrics_port, status_port)
    from deltaflow.pipeline.arrow_ingest import choose_engine

    # The Arrow engine's rows never enter the JVM: its quick compiler is enough (and cheaper).
    arrow = choose_engine(config) == "arrow"
    # A job (--ends-at-latest-offsets) also takes the serial collector: less CPU at start.
    job = ends_at_latest_offsets
    spark = deltaflow.spark_session(spark_master, jvm=("lean" if job else "quick") if arrow else "full")
    from deltaflow.service.daemon import run_until_stopped

    try:
        # Restarts the query with backoff when the broker goes away; stops on SIGTERM/SIGINT.
        bar = ProgressLine() if ends_at_latest_offsets and sys.stderr.isatty() else None
        try:
            summary = run_until_stopped(
                lambda: start_ingest(spark, config, on_engine=lambda e: board.set_engine(pipeline_id, e)),
                name=pipeline_id,
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
