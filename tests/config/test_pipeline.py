"""Pipeline files: loading, ${VAR} substitution, validation messages, masking (no Spark)."""

from __future__ import annotations

import re
import textwrap

import pytest
from click.testing import CliRunner

from deltaflow.cli import cli
from deltaflow.config.pipeline import (
    DeltaSourceSpec,
    FilesSourceSpec,
    load_pipelines,
)
from deltaflow.config.secrets import MASK, masked
from deltaflow.config.units import parse_seconds
from deltaflow.errors import PipelineConfigError


def _write(tmp_path, text: str):
    path = tmp_path / "pipelines.yaml"
    path.write_text(textwrap.dedent(text))
    return path


GOOD = """
    pipelines:
      - id: orders
        source: {type: files, path: /landing, format: csv, max_bytes_per_trigger: 64MB}
        transforms: {date: "sql: to_date(ts)", offset: kafka.offset}
        filter: "status <> 'test'"
        expectations:
          - {name: positive, expr: "amount > 0", action: drop}
        dead_letter: {table_uri: /lake/rejected}
        trigger_interval: 5 seconds
        sinks:
          - {name: eu, table_uri: "${LAKE}/eu", when: "region = 'eu'", partition_columns: [date]}
          - {table_uri: "${LAKE:-/default}/rest", storage_options: {AWS_SECRET_ACCESS_KEY: "${KEY}"}}
      - id: mirror
        enabled: false
        source: {type: delta, table_uri: /lake/eu, starting_version: 3}
        sinks: [{table_uri: /lake/gold, connector: delta-lake}]
"""


def test_a_valid_file_loads_typed_with_variables_substituted(tmp_path):
    file = load_pipelines(_write(tmp_path, GOOD), env={"LAKE": "/lake", "KEY": "s3cr3t"})
    orders, mirror = file.pipelines
    assert isinstance(orders.source, FilesSourceSpec)
    assert orders.source.max_bytes_per_trigger == 64 * 1024**2
    assert orders.trigger_interval == 5.0
    assert orders.sink_names() == ["eu", "sink1"]
    assert orders.sinks[0].table_uri == "/lake/eu"
    assert orders.sinks[1].table_uri == "/lake/rest"
    assert orders.sinks[1].storage_options == {"AWS_SECRET_ACCESS_KEY": "s3cr3t"}
    options = orders.sinks[0].sink_options("orders", "/ckpt")
    assert (options.pipeline_id, options.checkpoint_location, options.partition_columns) == (
        "orders",
        "/ckpt",
        ("date",),
    )
    assert isinstance(mirror.source, DeltaSourceSpec)
    assert mirror.source.starting_version == 3
    assert [p.pipeline_id for p in file.selected()] == ["orders"]  # disabled ones are left out
    assert [p.pipeline_id for p in file.selected(("mirror",))] == ["mirror"]
    with pytest.raises(Exception, match="no pipeline 'nope'"):
        file.selected(("nope",))
    # Secrets never printed.
    dumped = masked(file.model_dump(mode="json", by_alias=True))
    assert dumped["pipelines"][0]["sinks"][1]["storage_options"]["AWS_SECRET_ACCESS_KEY"] == MASK
    assert "s3cr3t" not in str(dumped)


def test_a_missing_variable_is_named_with_its_yaml_path(tmp_path):
    with pytest.raises(PipelineConfigError) as info:
        load_pipelines(_write(tmp_path, GOOD), env={})
    assert info.value.problems == [
        "pipelines[0].sinks[0].table_uri: environment variable LAKE is not set (use ${LAKE:-default})",
        "pipelines[0].sinks[1].storage_options.AWS_SECRET_ACCESS_KEY: environment variable KEY is not "
        "set (use ${KEY:-default})",
    ]


def test_every_problem_is_reported_with_path_received_value_and_what_is_allowed(tmp_path):
    bad = """
        pipelines:
          - id: "bad id"
            source: {type: files, path: /x, format: xml}
            transforms: {t: "foo(bar"}
            expectations:
              - {name: e, expr: "x > 0", action: dropp}
            sinks:
              - {table_uri: /t1, partiton_columns: [d]}
              - {table_uri: /t1, pipeline_id: other}
          - id: gen
            source: {type: generater}
            sinks: []
          - id: k
            source: {type: kafka, bootstrap_servers: "h:1", topic: t, format: json}
            sinks:
              - table_uri: /t3
                compression: brotli
                storage_options: {sas_token: "abc"}
                target_file_size_mb: 0
    """
    with pytest.raises(PipelineConfigError) as info:
        load_pipelines(_write(tmp_path, bad), env={})
    problems = info.value.problems
    expected = [
        "pipelines[0].id: must be 1-128 letters, digits, '_', '.' or '-', starting with a letter or digit "
        "(received 'bad id')",
        "pipelines[0].source.format: must be one of 'json', 'csv', 'parquet', 'avro' or 'text' "
        "(received 'xml')",
        "pipelines[0].transforms: t: transform source 'foo(bar' is not understood",
        "pipelines[0].expectations[0].action: must be one of 'warn', 'drop' or 'fail' (received 'dropp')",
        "pipelines[0].sinks[0].partiton_columns: unknown key (did you mean 'partition_columns'?)",
        "pipelines[0].sinks[1]: pipeline_id is set by the pipeline, not per sink",
        "pipelines[1].source: unknown source type; use one of 'files', 'delta', 'kafka', 'generator', "
        "'postgres-cdc', 'parquet-files' (received 'generater')",
        "pipelines[1].sinks: List should have at least 1 item after validation, not 0",
        "pipelines[2].source: format json needs schema (Spark DDL of the value's fields)",
        "pipelines[2].sinks[0].target_file_size_mb: Input should be greater than or equal to 1 (received 0)",
        "pipelines[2].sinks[0].compression: must be one of 'snappy', 'zstd', 'gzip', 'lz4' or 'none' "
        "(received 'brotli')",
    ]
    for want in expected:
        assert any(p.startswith(want) for p in problems), f"{want!r} not in {problems}"
    assert "abc" not in str(info.value)  # a secret is never echoed, not even when invalid


def test_duplicate_ids_tables_and_names_are_refused(tmp_path):
    text = """
        pipelines:
          - id: a
            source: {type: generator}
            sinks: [{table_uri: /t}, {table_uri: "/t/"}]
          - id: a
            source: {type: generator}
            expectations: [{name: x, expr: "1=1"}, {name: x, expr: "2=2"}]
            dead_letter: {table_uri: /u}
            sinks: [{table_uri: /u}]
    """
    with pytest.raises(PipelineConfigError) as info:
        load_pipelines(_write(tmp_path, text), env={})
    text_out = str(info.value)
    assert "write the same table /t" in text_out
    assert "expectation name(s) used twice: x" in text_out


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("[1, 2", "not valid YAML"),
        ("- just a list", "must be a mapping with a 'pipelines' list"),
        ("pipelines: []", "pipelines: List should have at least 1 item"),
        ("pipeline: []", "pipeline: unknown key (did you mean 'pipelines'?)"),
    ],
)
def test_unreadable_files_say_why(tmp_path, text, problem):
    with pytest.raises(PipelineConfigError, match=re.escape(problem)):
        load_pipelines(_write(tmp_path, text), env={})


def test_files_source_min_file_age_and_options_of_sparks_file_stream_source(tmp_path):
    text = """
        pipelines:
          - id: a
            source: {type: files, path: /landing}
            sinks: [{table_uri: /t}]
          - id: b
            source: {type: files, path: /landing, min_file_age: 2 min}
            sinks: [{table_uri: /u}]
    """
    a, b = load_pipelines(_write(tmp_path, text), env={}).pipelines
    assert isinstance(a.source, FilesSourceSpec) and isinstance(b.source, FilesSourceSpec)
    assert (a.source.min_file_age, b.source.min_file_age) == (10.0, 120.0)
    refused = text.replace("min_file_age: 2 min", "options: {latestFirst: true, cleanSource: delete}")
    with pytest.raises(PipelineConfigError, match=r"options cleanSource, latestFirst are of Spark"):
        load_pipelines(_write(tmp_path, refused), env={})
    globbed = text.replace("path: /landing, min", "path: /landing/*.json, min")
    with pytest.raises(PipelineConfigError, match="no glob"):
        load_pipelines(_write(tmp_path, globbed), env={})


def test_input_file_name_where_the_rows_are_cached_is_refused_with_a_pointer(tmp_path):
    text = """
        pipelines:
          - id: a
            source: {type: files, path: /landing}
            transforms: {file: "sql: input_file_name()"}
            expectations: [{name: from_eu, expr: "input_file_name() LIKE '%eu%'"}]
            sinks:
              - {table_uri: /t, when: "INPUT_FILE_NAME () LIKE '%x%'"}
              - {table_uri: /u, when: "file LIKE '%x%'"}
    """
    with pytest.raises(PipelineConfigError) as info:
        load_pipelines(_write(tmp_path, text), env={})
    problems = str(info.value)
    assert "expectations[0]: input_file_name() gives '' there" in problems
    assert "sinks[0].when: INPUT_FILE_NAME () gives '' there" in problems
    assert "source_file_column" in problems
    assert "sinks[1]" not in problems and "transforms.file" not in problems


def test_durations():
    assert parse_seconds(5) == 5.0
    assert parse_seconds("500ms") == 0.5
    assert parse_seconds("2 min") == 120.0
    assert parse_seconds("1h") == 3600.0
    with pytest.raises(ValueError, match="must be a duration"):
        parse_seconds("soon")


def test_cli_validate_prints_each_pipeline_and_masks_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKE", "/lake")
    monkeypatch.setenv("KEY", "s3cr3t")
    path = _write(tmp_path, GOOD)
    result = CliRunner().invoke(cli, ["validate", str(path), "--show"])
    assert result.exit_code == 0, result.output
    assert "s3cr3t" not in result.output and MASK in result.output
    assert (
        "orders: csv files in /landing => eu -> /lake/eu when region = 'eu', sink1 -> /lake/rest; "
        in result.output
    )
    assert "mirror (disabled): delta table /lake/eu => sink0 -> /lake/gold" in result.output
    assert result.output.rstrip().endswith("2 pipeline(s), valid")

    monkeypatch.delenv("LAKE")
    from deltaflow.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["validate", str(path)])
    assert exited.value.code == 2


KAFKA = """
    pipelines:
      - id: k
        engine: {engine}
        source:
          type: kafka
          bootstrap_servers: broker:9092
          topic: orders
          schema: "id BIGINT, ts BIGINT"
          starting_offsets: {{orders: {{"0": 5}}}}
          max_messages_per_batch: 1000
          kafka_settings: {{sasl.password: s3cret}}
        transforms: {{day: "substr(ts, 0, 8)", offset: kafka.offset}}
        trigger_interval: 2 seconds
        dead_letter: {{table_uri: /lake/dlq, compression: zstd}}
        sinks:
          - {{table_uri: /lake/orders, partition_columns: [day], compression: zstd, target_file_size_mb: 64,
              table_properties: {{delta.appendOnly: "true"}}, auto_compact: false}}
        {extra}
"""


def test_a_plain_kafka_pipeline_becomes_ingest_on_the_arrow_engine(tmp_path):
    (spec,) = load_pipelines(_write(tmp_path, KAFKA.format(engine="arrow", extra=""))).pipelines
    assert spec.arrow_blockers() == []
    config = spec.ingest_config(available_now=True)
    assert (config.topic, config.table_uri, config.brokers, config.pipeline_id) == (
        "orders",
        "/lake/orders",
        "broker:9092",
        "k",
    )
    assert (config.engine, config.ends_at_latest_offsets, config.allowed_latency) == ("arrow", True, 2.0)
    assert config.seek_offsets == {"0": 5} and config.max_messages_per_batch == 1000
    assert config.transforms == ("day: substr(ts, 0, 8)", "offset: kafka.offset")
    assert config.kafka_conf == {"sasl.password": "s3cret"}
    main = config.sink_options("/ckpt")
    assert (main.partition_columns, main.compression, main.target_file_size_mb, main.auto_compact) == (
        ("day",),
        "zstd",
        64,
        False,
    )
    assert dict(main.table_properties) == {"delta.appendOnly": "true"}
    assert (main.kafka_offsets, main.pipeline_id) == (True, "k")  # progress per partition
    assert main.schema_mode == "strict"  # the sink's, as on the Spark engine
    dlq = config.dlq_options("/ckpt")
    assert dlq is not None
    assert (dlq.table_uri, dlq.compression, dlq.pipeline_id) == ("/lake/dlq", "zstd", "k-dlq")


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ('filter: "id > 0"', r"filter \(Spark SQL\)"),
        ("expectations: [{name: e, expr: id > 0}]", r"expectations \(Spark SQL\)"),
    ],
)
def test_engine_arrow_refuses_what_only_spark_runs_and_auto_takes_spark(tmp_path, extra, reason):
    refused = r"engine arrow cannot run this pipeline: it uses " + reason
    with pytest.raises(PipelineConfigError, match=refused):
        load_pipelines(_write(tmp_path, KAFKA.format(engine="arrow", extra=extra)))
    (spec,) = load_pipelines(_write(tmp_path, KAFKA.format(engine="auto", extra=extra))).pipelines
    assert spec.arrow_blockers() and spec.engine == "auto"
    result = CliRunner().invoke(cli, ["validate", str(tmp_path / "pipelines.yaml")])
    assert result.exit_code == 0, result.output
    assert "engine auto: spark (" in result.output


def test_engine_arrow_refuses_other_sources_sql_transforms_and_routing(tmp_path):
    text = """
        pipelines:
          - id: f
            engine: arrow
            source: {type: files, path: /landing}
            transforms: {d: "sql: to_date(ts)"}
            sinks: [{table_uri: /a, when: "x = 1"}, {table_uri: /b}]
    """
    with pytest.raises(PipelineConfigError) as info:
        load_pipelines(_write(tmp_path, text))
    assert "a files source (the Arrow engine reads Kafka)" in str(info.value)
    text = text.replace("source: {type: files, path: /landing}", KAFKA_SOURCE)
    with pytest.raises(PipelineConfigError) as info:
        load_pipelines(_write(tmp_path, text))
    message = str(info.value)
    assert "Spark SQL transforms (d: sql: to_date(ts))" in message
    assert "routing to several sinks" in message


KAFKA_SOURCE = 'source: {type: kafka, bootstrap_servers: "b:9092", topic_pattern: "o.*", schema: "id BIGINT"}'


def test_engine_auto_keeps_ingests_own_fallback_and_paths_are_normalised(tmp_path):
    extra = "checkpoint_location: ~/ckpt/k"
    (spec,) = load_pipelines(_write(tmp_path, KAFKA.format(engine="auto", extra=extra))).pipelines
    config = spec.ingest_config()
    assert config.engine == "auto"  # a transform Arrow refuses on the messages' schema: Spark
    assert config.checkpoint_location is not None and "~" not in config.checkpoint_location
    text = KAFKA.format(engine="arrow", extra="").replace(
        "auto_compact: false", "auto_compact: false, op_column: kind"
    )
    (spec,) = load_pipelines(_write(tmp_path, text)).pipelines  # a merge-only key is not refused
    assert spec.ingest_config().sink_options(None).op_column == "op"


def test_an_inline_avro_schema_reaches_the_arrow_engines_source(tmp_path):
    from deltaflow.pipeline.ingest import source_options

    avro = '{"type": "record", "name": "r", "fields": [{"name": "id", "type": "long"}]}'
    text = f"""
        pipelines:
          - id: a
            engine: arrow
            source: {{type: kafka, bootstrap_servers: "b:9092", topic: t, format: avro,
                      avro_schema: '{avro}'}}
            sinks: [{{table_uri: "{tmp_path / "t"}", storage_options: {{AWS_REGION: eu-west-1}}}}]
    """
    (spec,) = load_pipelines(_write(tmp_path, text)).pipelines
    config = spec.ingest_config()
    assert (config.value_format, config.avro, config.avro_schema) == ("avro", None, avro)
    options = source_options(None, config)  # type: ignore[arg-type] - Avro needs no Spark here
    assert (options["value_format"], options["avro_schema"]) == ("avro", avro)
    assert options["delta_storage_options"] == '{"AWS_REGION": "eu-west-1"}'  # the progress lookup


def test_a_postgres_cdc_pipeline_takes_one_append_sink_and_leaves_its_progress_to_the_pipeline(tmp_path):
    cdc = """
        pipelines:
          - id: cdc
            source: {type: postgres-cdc, host: db, dbname: shop, publication: pub, snapshot: never%s}
            sinks: [{table_uri: /lake/events, storage_options: {AWS_REGION: eu-west-1}}%s]
    """
    spec = load_pipelines(_write(tmp_path, cdc % ("", ""))).pipelines[0]
    options = spec.source.source_options("cdc", [spec.sinks[0]])
    assert (options.database, options.slot_name) == ("shop", "deltaflow_pub")
    assert (options.delta_table_uri, options.pipeline_id) == ("/lake/events", "cdc")
    assert options.delta_storage_options == {"AWS_REGION": "eu-west-1"}
    assert spec.sinks[0].sink_options("cdc", "/cp", source_offsets=True).kafka_offsets

    for extra, problem in [
        ((", delta_table_uri: /x, pipeline_id: x", ""), "set by the pipeline"),
        (("", ", {table_uri: /lake/more}"), "appends its events to one table at most"),
    ]:
        text = cdc % extra
        with pytest.raises(PipelineConfigError, match=problem):
            load_pipelines(_write(tmp_path, text))


def test_mirror_sinks_read_their_progress_together_and_validate_names_them(tmp_path):
    text = """
        pipelines:
          - id: shop
            source: {type: postgres-cdc, host: db, database: shop, publication: pub}
            sinks:
              - table_uri: /lake/events
              - {table_uri: /lake/orders, write_mode: merge, stream: public.orders}
    """
    path = _write(tmp_path, text)
    spec = load_pipelines(path).pipelines[0]
    mirror = spec.sinks[1].sink_options("shop", "/cp", source_offsets=True)
    assert (mirror.cdc_format, mirror.key_columns, mirror.kafka_offsets) == ("postgres", (), True)
    options = spec.source.source_options("shop", [spec.sinks[1], spec.sinks[0]])
    assert options.delta_table_uri == "/lake/orders" and options.more_delta_tables == {"/lake/events": {}}
    assert [u for u, _ in options.progress_tables()] == ["/lake/orders", "/lake/events"]
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "sink1 -> /lake/orders (mirror of public.orders)" in result.output


def test_debezium_mirrors_in_yaml_take_the_key_of_their_messages_only_on_the_arrow_engine(tmp_path):
    mirrors = """
    pipelines:
      - id: inventory
        engine: auto
        source: {type: kafka, bootstrap_servers: "h:1", topic_pattern: 'db\\.inventory\\.(.*)'}
        sinks: [{table_uri: "/lake/{1}", write_mode: merge, cdc_format: debezium}]
    """
    (spec,) = load_pipelines(_write(tmp_path, mirrors), env={}).pipelines
    assert spec.debezium_mirrors() and not spec.arrow_blockers()
    config = spec.ingest_config()
    assert (config.cdc, config.key_columns, config.table_uri) == ("debezium", (), "/lake/{1}")
    one_topic = """
    pipelines:
      - id: orders
        source: {type: kafka, bootstrap_servers: "h:1", topic: db.inventory.orders, schema: "id INT"}
        sinks: [{table_uri: /lake/orders, write_mode: merge, cdc_format: debezium}]
    """
    with pytest.raises(
        PipelineConfigError, match="cdc_format debezium on the Spark engine needs key_columns"
    ):
        load_pipelines(_write(tmp_path, one_topic), env={})
    sequenced = mirrors.replace("cdc_format: debezium}", "cdc_format: debezium, sequence_by: lsn}")
    with pytest.raises(PipelineConfigError, match="sequence_by does not apply to Debezium mirrors"):
        load_pipelines(_write(tmp_path, sequenced), env={})
