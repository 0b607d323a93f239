"""``deltaflow ingest``: a Kafka topic into a Delta table, with kafka-delta-ingest's flags."""

from __future__ import annotations

import logging

import click

from deltaflow.cli.options import (
    GIVE_UP_AFTER,
    LINES,
    METRICS_PORT,
    REMOTE,
    STALL_TIMEOUT,
    STALL_TRIGGERS,
    STATUS_PORT,
    STOP_TIMEOUT,
    key_values,
    serve,
)
from deltaflow.cli.output import ProgressLine, note, progress_shown, verbose
from deltaflow.io import logs

__all__ = ["ingest"]

#: How often the daemon loop checks for a stop signal while a query runs.
STOP_POLL_S = 1


@click.command()
@click.argument("topic", envvar="KAFKA_TOPIC", required=False)
@click.argument("table_uri", envvar=["TABLE_LOCATION", "TABLE_URI"], required=False)
@click.option(
    "--topic-pattern",
    "--topic_pattern",
    "topic_pattern",
    default=None,
    envvar="KAFKA_TOPIC_PATTERN",
    show_envvar=True,
    help="Read every topic whose whole name matches this regular expression, topics created "
    "later included (then leave TOPIC out): each into the table TABLE_URI names for it, a "
    "template with {topic} (the topic's name) and {1} ... {9} (the pattern's groups).",
)
@click.option(
    "-k",
    "--kafka",
    "brokers",
    default="localhost:9092",
    envvar="KAFKA_BROKERS",
    show_envvar=True,
    help="Kafka bootstrap servers.",
)
@click.option(
    "-a",
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
    "-g",
    "--consumer-group",
    "--consumer_group",
    "--consumer-group-id",
    "--consumer_group_id",
    "consumer_group",
    default=None,
    envvar=["KAFKA_CONSUMER_GROUP", "KAFKA_CONSUMER_GROUP_ID"],
    show_envvar=True,
    help="Kafka group.id of the reading consumers.",
)
@click.option(
    "-l",
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
    "-m",
    "--max-messages-per-batch",
    "--max_messages_per_batch",
    type=click.IntRange(min=0),
    default=500_000,
    envvar="MAX_MESSAGES_PER_BATCH",
    show_envvar=True,
    help="Admission control per micro-batch (0 = no limit).",
)
@click.option(
    "--min-task-messages",
    "--min_task_messages",
    type=click.IntRange(min=1),
    default=20_000,
    envvar="MIN_TASK_MESSAGES",
    show_envvar=True,
    help="Arrow engine: a task reads at least this many messages when the batch holds more; "
    "small topic-partitions share a task, large ones are split, so that a batch makes at least "
    "as many tasks as Spark has cores.",
)
@click.option(
    "-o",
    "--auto-offset-reset",
    "--auto_offset_reset",
    type=click.Choice(["earliest", "latest"]),
    default="earliest",
    envvar=["KAFKA_AUTO_OFFSET_RESET", "AUTO_OFFSET_RESET"],
    show_envvar=True,
    help="Where to start when the table holds no progress for a partition.",
)
@click.option(
    "--seek-offsets",
    "--seek_offsets",
    default=None,
    envvar=["KAFKA_SEEK_OFFSETS", "SEEK_OFFSETS"],
    show_envvar=True,
    help="""Seek offsets per partition as JSON, e.g. '{"0":123}': the first message ingested from
    partition 0 is 124 (kafka-delta-ingest's meaning). Used while the table holds no progress of
    this --app_id for a partition; a table whose progress is behind them is refused.""",
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
    "--ssl-certificate-pem",
    "ssl_certificate_pem",
    default=None,
    envvar="KAFKA_DELTA_INGEST_CERT",
    show_envvar=True,
    help="Client certificate (PEM text) for TLS to the brokers: librdkafka's ssl.certificate.pem.",
)
@click.option(
    "--ssl-key-pem",
    "ssl_key_pem",
    default=None,
    envvar="KAFKA_DELTA_INGEST_KEY",
    show_envvar=True,
    help="The client certificate's private key (PEM text): ssl.key.pem.",
)
@click.option(
    "--ssl-ca-pem",
    "ssl_ca_pem",
    default=None,
    envvar="KAFKA_DELTA_INGEST_CA",
    show_envvar=True,
    help="CA certificate(s) (PEM text) to verify the brokers with: ssl.ca.pem.",
)
@click.option(
    "--sasl-scram-json",
    "sasl_scram_json",
    default=None,
    envvar="KAFKA_DELTA_INGEST_SCRAM_JSON",
    show_envvar=True,
    help="""'{"username": ..., "password": ...}': sasl.username and sasl.password (set
    security.protocol and sasl.mechanism with -K). -K settings win over these four.""",
)
@click.option(
    "-s",
    "--statsd-endpoint",
    "--statsd_endpoint",
    default=None,
    envvar="STATSD_ENDPOINT",
    show_envvar=True,
    help="Not served: deltaflow exports Prometheus metrics (--metrics_port) instead; given, it is refused.",
)
@click.option(
    "--log-level",
    default=None,
    envvar="RUST_LOG",
    show_envvar=True,
    help="off, error, warn, info, debug or trace (kafka-delta-ingest's RUST_LOG levels; other "
    "values mean info); --verbose wins.",
)
@click.option(
    "-e",
    "--ends-at-latest-offsets",
    "--ends_at_latest_offsets",
    is_flag=True,
    envvar="ENDS_AT_LATEST_OFFSETS",
    show_envvar=True,
    help="Read up to the offsets at start, commit, exit 0.",
)
@GIVE_UP_AFTER
@STOP_TIMEOUT
@STALL_TRIGGERS
@STALL_TIMEOUT
@click.option(
    "-c",
    "--checkpoints",
    is_flag=True,
    envvar=["WRITE_CHECKPOINTS", "CHECKPOINTS"],
    show_envvar=True,
    help="Write Delta log checkpoints (always done: every 10 commits, at delta-rs' interval).",
)
@click.option(
    "--json",
    "json_option",
    is_flag=False,
    flag_value="",
    default=None,
    metavar="[URL]",
    help="Values are JSON objects (the default). With a schema registry URL, as kafka-delta-ingest's "
    "--json URL: the Confluent wire format (same as --json-registry). Put TOPIC and TABLE before a "
    "bare --json.",
)
@click.option(
    "--raw", "value_format", flag_value="raw", default="json", help="Store the value bytes as they are."
)
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
    "--schema-registry-username",
    default=None,
    envvar="SCHEMA_REGISTRY_USERNAME",
    show_envvar=True,
    help="Basic-auth user of the --avro schema registry.",
)
@click.option(
    "--schema-registry-password",
    default=None,
    envvar="SCHEMA_REGISTRY_PASSWORD",
    show_envvar=True,
    help="Basic-auth password of the --avro schema registry (with --schema-registry-username).",
)
@click.option(
    "--fail-on-data-loss",
    "--fail_on_data_loss",
    type=click.BOOL,
    default=True,
    show_default=True,
    envvar="FAIL_ON_DATA_LOSS",
    show_envvar=True,
    help="Offsets of the table's progress the broker no longer holds (a re-created topic, "
    "messages removed by retention) stop ingest naming them, before anything is written "
    "(Spark's failOnDataLoss). false: restart those partitions at the broker's earliest offset, "
    "logged and recorded in the commit.",
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
    "--dlq-format",
    "--dlq_format",
    type=click.Choice(["deltaflow", "kafka-delta-ingest"]),
    default="deltaflow",
    envvar="DLQ_FORMAT",
    show_envvar=True,
    help="Dead-letter rows: deltaflow's (topic, partition, offset, kafka_timestamp, key_base64, "
    "value_base64, error, dead_lettered_at) or kafka-delta-ingest's (base64_bytes, json_string, "
    "error, timestamp, date).",
)
@click.option(
    "-b",
    "--min-bytes-per-file",
    "--min_bytes_per_file",
    type=click.IntRange(min=1),
    default=None,
    envvar="MIN_BYTES_PER_FILE",
    show_envvar=True,
    help="Flush by size: a batch starts before --allowed-latency once the messages waiting would "
    "make Parquet files of this size (one per Kafka partition with messages; estimated from the "
    "table's newest files); also the target size of the Parquet files [default: 128 MiB, no "
    "flush by size].",
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
@REMOTE
@click.option(
    "--cdc",
    type=click.Choice(["none", "debezium"]),
    default="none",
    envvar="DELTAFLOW_CDC",
    show_envvar=True,
    help="debezium: each topic is a Debezium change stream (Kafka Connect's JSON converter, with "
    "or without schemas) kept as a mirror table: one row per key, updates applied, deletes "
    "removed, one MERGE per table and batch; the columns come from the change events.",
)
@click.option(
    "--cdc-mode",
    "--cdc_mode",
    "cdc_mode",
    type=click.Choice(["mirror", "append"]),
    default="mirror",
    help="With --cdc: mirror keeps a table per topic equal to the database's; append writes every "
    "change event as a row (data, event_type, timestamp, stream: Rivven's shape) [default: mirror].",
)
@click.option(
    "--cdc-errors",
    "--cdc_errors",
    "cdc_errors",
    type=click.Choice(["stop", "dead_letter"]),
    default="stop",
    help="With --cdc: a change a mirror cannot apply (not a change event, a value its column "
    "cannot hold) stops the pipeline, or with dead_letter goes to --dlq_table_location and the "
    "mirror goes on (its rows may then differ from the database until their next change) "
    "[default: stop].",
)
@click.option(
    "--key-columns",
    "--key_columns",
    "key_columns",
    default=None,
    help="With --cdc: the mirrors' key columns, comma-separated [default: the message key's fields].",
)
def ingest(
    topic: str | None,
    table_uri: str | None,
    topic_pattern: str | None,
    brokers: str,
    pipeline_id: str,
    consumer_group: str | None,
    allowed_latency: float,
    max_messages_per_batch: int,
    min_task_messages: int,
    auto_offset_reset: str,
    seek_offsets: str | None,
    transforms: tuple[str, ...],
    kafka_settings: tuple[str, ...],
    ssl_certificate_pem: str | None,
    ssl_key_pem: str | None,
    ssl_ca_pem: str | None,
    sasl_scram_json: str | None,
    statsd_endpoint: str | None,
    log_level: str | None,
    ends_at_latest_offsets: bool,
    give_up_after_s: float,
    stop_timeout_s: float,
    stall_triggers: int,
    stall_timeout_s: float,
    checkpoints: bool,
    json_option: str | None,
    value_format: str,
    avro: str | None,
    schema_registry_username: str | None,
    schema_registry_password: str | None,
    json_registry: str | None,
    soe_avro: str | None,
    fail_on_data_loss: bool,
    decompress_gzip: bool,
    dlq_table_location: str | None,
    dlq_transforms: tuple[str, ...],
    dlq_format: str,
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
    cdc: str,
    cdc_mode: str,
    cdc_errors: str,
    key_columns: str | None,
) -> None:
    """Ingest a Kafka TOPIC into the Delta table at TABLE_URI, exactly once.

    Each micro-batch is one Delta commit holding its rows and, per partition, the last
    offset written (txn <pipeline_id>-<topic>-<partition>); a restart resumes from the table.

    Several topics (TOPIC as t1,t2,t3, or --topic_pattern REGEX without TOPIC) run in one query,
    each into its own table: TABLE_URI is then a template, e.g. s3://lake/bronze/{topic}.
    """
    import json as _json
    import signal

    from deltaflow.config.ingest import IngestConfig, client_security_settings
    from deltaflow.pipeline.topic_ingest import start as start_ingest

    if statsd_endpoint:
        raise click.BadParameter(
            f"{statsd_endpoint!r}: deltaflow does not send statsd metrics; serve Prometheus "
            "metrics with --metrics_port <port> (/metrics) instead, and unset STATSD_ENDPOINT",
            param_hint="--statsd_endpoint",
        )
    _apply_log_level(log_level)
    if topic_pattern and table_uri is None:
        topic, table_uri = None, topic  # --topic_pattern REGEX TABLE_URI
    if table_uri is None:
        raise click.UsageError(
            "Missing argument 'TABLE_URI'." if topic or topic_pattern else "Missing argument 'TOPIC'."
        )
    if topic and topic_pattern:
        raise click.BadParameter(
            "give TOPIC or --topic_pattern, not both (KAFKA_TOPIC may be set in the environment)",
            param_hint="--topic_pattern",
        )
    try:
        seek = {str(k): int(v) for k, v in _json.loads(seek_offsets).items()} if seek_offsets else None
    except (ValueError, AttributeError) as exc:
        raise click.BadParameter(
            f"not a JSON object of partition -> offset: {exc}", param_hint="--seek-offsets"
        ) from None
    if json_option:
        if "://" not in json_option:
            raise click.BadParameter(
                f"takes a schema registry URL or nothing, got {json_option!r}: put TOPIC and TABLE "
                "before a bare --json",
                param_hint="--json",
            )
        if json_registry and json_registry != json_option:
            raise click.BadParameter(
                "--json URL and --json-registry name different registries", param_hint="--json"
            )
        json_registry = json_option
    if json_option is not None and value_format == "raw":
        raise click.BadParameter("--json and --raw exclude each other", param_hint="--json")
    if avro is not None or soe_avro:
        if value_format == "raw":
            raise click.BadParameter("--avro and --raw exclude each other", param_hint="--avro")
        value_format = "avro"
    config = IngestConfig.build(
        topic=topic or "",
        topic_pattern=topic_pattern,
        table_uri=table_uri,
        brokers=brokers,
        pipeline_id=pipeline_id,
        allowed_latency=allowed_latency,
        max_messages_per_batch=max_messages_per_batch,
        min_task_messages=min_task_messages,
        auto_offset_reset=auto_offset_reset,
        seek_offsets=seek,
        transforms=transforms,
        value_format=value_format,
        value_schema=schema,
        ends_at_latest_offsets=ends_at_latest_offsets,
        checkpoint_location=checkpoint_location,
        partition_by=partition_by,
        # kafka-delta-ingest's TLS/SCRAM variables first: -K settings win over them.
        kafka_settings={
            **client_security_settings(
                certificate_pem=ssl_certificate_pem,
                key_pem=ssl_key_pem,
                ca_pem=ssl_ca_pem,
                scram_json=sasl_scram_json,
            ),
            **key_values(kafka_settings, "--kafka-setting"),
        },
        consumer_group=consumer_group,
        avro=avro,
        schema_registry_username=schema_registry_username,
        schema_registry_password=schema_registry_password,
        json_registry=json_registry,
        soe_avro=soe_avro,
        fail_on_data_loss=fail_on_data_loss,
        decompress_gzip=decompress_gzip,
        dlq_table_location=dlq_table_location,
        dlq_transforms=dlq_transforms,
        dlq_format=dlq_format,
        min_bytes_per_file=min_bytes_per_file,
        commit_to_group=commit_to_group,
        schema_evolution=schema_evolution,
        cdc=cdc,
        cdc_mode=cdc_mode,
        cdc_errors=cdc_errors,
        key_columns=tuple(c.strip() for c in (key_columns or "").split(",") if c.strip()),
        write_path=write_path,
        engine=engine,
        auto_compact=auto_compact,
        auto_compact_min_files=auto_compact_min_files,
        vacuum_interval_hours=vacuum_interval_hours,
    )  # validates every flag (and parses the transforms) before Spark starts
    import deltaflow
    from deltaflow.pipeline.ingest import caught_up
    from deltaflow.service.status import board

    topics = topic or f"/{topic_pattern}/"
    if ends_at_latest_offsets and (tables := caught_up(config)) is not None:
        # Nothing to read: no Spark, no claim, no commit (a scheduled job of an idle topic).
        note(
            f"nothing to ingest: {len(tables)} table(s) hold every message of {topics} up to its "
            "latest offset; nothing was started or committed",
        )
        click.echo(f"ingested 0 message(s) in 0 batch(es) into {table_uri}")
        return
    board.register(
        pipeline_id,
        table_uri=table_uri,
        source=f"kafka {topics} @ {brokers}",
        unit="message(s)",
        table_of=config.table_template().render if config.several_topics else None,
    )
    serve(metrics_port, status_port, stall_triggers, stall_timeout_s)
    from deltaflow.pipeline.arrow_ingest import choose_engine

    # The Arrow engine's rows never enter the JVM: its quick compiler is enough (and cheaper).
    arrow = choose_engine(config) == "arrow"
    # A job (--ends-at-latest-offsets) also takes the serial collector: less CPU at start.
    job = ends_at_latest_offsets
    from deltaflow.pipeline.session import JvmProfile, stop_session

    profile: JvmProfile = ("lean" if job else "quick") if arrow else "full"
    spark = deltaflow.spark_session(spark_master, jvm=profile, job=f"ingest:{config.pipeline_id}")
    from deltaflow.service.daemon import run_until_stopped

    try:
        # Restarts the query with backoff when the broker goes away; stops on SIGTERM/SIGINT.
        bar = ProgressLine() if ends_at_latest_offsets and progress_shown() else None
        try:
            summary = run_until_stopped(
                lambda: start_ingest(spark, config, on_engine=lambda e: board.set_engine(pipeline_id, e)),
                name=pipeline_id,
                poll_s=STOP_POLL_S,
                on_progress=bar.show if bar else None,
                give_up_after_s=give_up_after_s if ends_at_latest_offsets else None,
                stop_timeout_s=stop_timeout_s,
            )
        finally:
            if bar:
                bar.close()
    finally:
        stop_session(spark)
    if summary.signal is not None:
        note(f"stopped by {signal.Signals(summary.signal).name}")
    if summary.restarts:
        note(f"the query was restarted {summary.restarts} time(s) after transient failures")
    click.echo(f"ingested {summary.messages:,} message(s) in {summary.batches} batch(es) into {table_uri}")


#: kafka-delta-ingest's RUST_LOG levels (a bare level, any case) as logging levels.
_RUST_LEVELS = {
    "off": logging.CRITICAL + 10,
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": logging.DEBUG,
}


def _apply_log_level(level: str | None) -> None:
    """``RUST_LOG`` / ``--log-level`` as the root logger's level, unless ``--verbose`` is set.

    kafka-delta-ingest reads a bare level only and takes ``info`` for anything else (module
    filters like ``kafka_delta_ingest=debug`` included); so does this.
    """
    if level is None or verbose():
        return
    chosen = _RUST_LEVELS.get(level.strip().lower(), logging.INFO)
    logging.getLogger().setLevel(chosen)
    logs.export_level(chosen)
