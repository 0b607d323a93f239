import pytest

from deltaflow.config.sink import SinkOptions
from deltaflow.errors import ConfigError, TerminalError, UnknownOptionError


def test_defaults_follow_the_rivven_sink():
    opts = SinkOptions.build({"table_uri": "/tmp/t"})
    assert opts.auto_create_table is True
    assert opts.target_file_size_mb == 128
    assert opts.compression == "snappy"
    assert opts.write_mode == "append"
    assert opts.max_commit_retries == 3
    assert opts.schema_mode == "strict"
    assert opts.partition_columns == ()


def test_spark_options_round_trip():
    opts = SinkOptions.build(
        {
            "table_uri": "s3://bucket/events",
            "pipeline_id": "clicks-v1",
            "partition_columns": ["date", "region"],
            "compression": "zstd",
            "table_properties": {"delta.logRetentionDuration": "interval 30 days"},
            "storage_options": {"AWS_REGION": "eu-west-1"},
            "auto_create_table": False,
            "max_records_per_file": 1000,
        }
    )
    spark_side = {k.lower(): v for k, v in opts.to_spark_options().items()}
    assert all(isinstance(v, str) for v in spark_side.values())
    assert SinkOptions.from_spark_options(spark_side) == opts


def test_spark_owned_options_are_accepted_and_path_is_the_table():
    opts = SinkOptions.from_spark_options({"path": "/data/t", "checkpointlocation": "/cp"})
    assert opts.table_uri == "/data/t"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("date, region", ("date", "region")), ('["a"]', ("a",)), ("", ())],
    ids=["comma-separated", "json-list", "empty"],
)
def test_partition_columns_parse(text, expected):
    assert SinkOptions.build({"table_uri": "/t", "partition_columns": text}).partition_columns == expected


def test_unknown_option_names_the_closest_known_one():
    with pytest.raises(UnknownOptionError) as err:
        SinkOptions.build({"table_uri": "/t", "compresion": "zstd"})
    assert "'compresion' (did you mean 'compression'?)" in str(err.value)
    assert isinstance(err.value, TerminalError)


@pytest.mark.parametrize(
    ("key", "value", "pieces"),
    [
        ("compression", "brotli", ["compression", "'brotli'", "'snappy'", "'zstd'"]),
        ("write_mode", "upsert", ["write_mode", "'upsert'", "'append'", "'overwrite'"]),
        ("schema_mode", "loose", ["schema_mode", "'strict'", "'merge'"]),
        ("table_uri", "hdfs://nn/t", ["table_uri", "unsupported URI scheme 'hdfs'", "s3://"]),
        ("pipeline_id", "has space", ["pipeline_id", "'has space'"]),
        ("target_file_size_mb", "0", ["target_file_size_mb", "greater than or equal to 1"]),
        ("max_commit_retries", "-1", ["max_commit_retries", "'-1'"]),
        ("partition_columns", "a,A", ["listed twice", "a"]),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_values_name_key_value_and_allowed(key, value, pieces):
    values = {"table_uri": "/t", key: value}
    with pytest.raises(ConfigError) as err:
        SinkOptions.build(values)
    for piece in pieces:
        assert piece in str(err.value)


@pytest.mark.parametrize(
    "uri",
    ["/data/t", "file:///data/t", "s3://b/t", "s3a://b/t", "gs://b/t", "az://c/t", "abfss://c@a/t"],
)
def test_supported_uris(uri):
    assert SinkOptions.build({"table_uri": uri}).table_uri == uri


def test_missing_table_uri():
    with pytest.raises(ConfigError, match="table_uri: required option is missing"):
        SinkOptions.build({})


def test_options_are_frozen():
    opts = SinkOptions.build({"table_uri": "/t"})
    with pytest.raises(ValueError, match="frozen"):
        opts.compression = "zstd"  # type: ignore[misc]


def test_a_stream_needs_its_pipeline_id_checked_in_one_place():
    from deltaflow.config.sink import StreamSinkOptions, for_stream

    with pytest.raises(ConfigError, match="pipeline_id is required for a streaming write"):
        for_stream(SinkOptions.build({"table_uri": "/t"}))
    with pytest.raises(ConfigError, match="pipeline_id is required for a streaming write"):
        StreamSinkOptions.build({"table_uri": "/t"})
    stream = for_stream(SinkOptions.build({"table_uri": "/t", "pipeline_id": "p"}))
    assert isinstance(stream, StreamSinkOptions) and stream.pipeline_id == "p"
