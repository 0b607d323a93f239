"""``deltaflow.cli.ingest``: kafka-delta-ingest's flags and environment variables, parsed."""

from __future__ import annotations

from click.testing import CliRunner

from deltaflow.cli import cli


def test_transforms_from_the_environment_one_per_line(monkeypatch):
    seen = {}

    def fake_config(**kwargs):  # stop before Spark: only the parsing is under test
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("deltaflow.config.ingest.IngestConfig.build", fake_config)
    env = {
        "TRANSFORMS": "date: substr(ts, `0`, `10`)\nmeta.offset: kafka.offset\n",
        "KAFKA_SETTINGS": "a=b c",
    }
    CliRunner().invoke(cli, ["ingest", "topic", "/tmp/x"], env=env)
    assert seen["transforms"] == ("date: substr(ts, `0`, `10`)", "meta.offset: kafka.offset")
    assert seen["kafka_settings"] == {"a": "b c"}


def _parsed(monkeypatch, args, env):
    """The IngestConfig.build arguments ``deltaflow ingest`` makes of ``args`` and ``env``."""
    seen = {}

    def fake_config(**kwargs):  # stop before Spark: only the parsing is under test
        seen.update(kwargs)
        raise SystemExit(0)

    monkeypatch.setattr("deltaflow.config.ingest.IngestConfig.build", fake_config)
    result = CliRunner().invoke(cli, ["ingest", *args], env=env)
    assert result.exit_code == 0, result.output
    return seen


def test_kafka_delta_ingest_environment_of_a_container_manifest(monkeypatch):
    env = {
        "KAFKA_TOPIC": "web_requests",
        "TABLE_LOCATION": "/tmp/web_requests",
        "KAFKA_BROKERS": "kafka:9092",
        "KAFKA_CONSUMER_GROUP": "kdi-group",
        "APP_ID": "web_requests",
        "KAFKA_SEEK_OFFSETS": '{"0": 5, "1": 7}',
        "KAFKA_AUTO_OFFSET_RESET": "latest",
        "ALLOWED_LATENCY": "60",
        "MAX_MESSAGES_PER_BATCH": "5000",
        "MIN_BYTES_PER_FILE": "134217728",
        "TRANSFORMS": "date: substr(meta.producer.timestamp, `0`, `10`)",
        "DLQ_TABLE_LOCATION": "/tmp/dlq",
        "DLQ_TRANSFORMS": "date: substr(dead_lettered_at, `0`, `10`)",
        "WRITE_CHECKPOINTS": "true",
        "ENDS_AT_LATEST_OFFSETS": "1",
        "DECOMPRESS_GZIP": "true",
        "KAFKA_DELTA_INGEST_CERT": "-----BEGIN CERTIFICATE-----\ncert\n-----END CERTIFICATE-----",
        "KAFKA_DELTA_INGEST_KEY": "key-pem",
        "KAFKA_DELTA_INGEST_CA": "ca-pem",
        "KAFKA_DELTA_INGEST_SCRAM_JSON": '{"username": "alice", "password": "s3cret"}',
        "SCHEMA_REGISTRY_USERNAME": "reg",
        "SCHEMA_REGISTRY_PASSWORD": "regpw",
    }
    seen = _parsed(monkeypatch, [], env)
    assert (seen["topic"], seen["table_uri"], seen["brokers"]) == (
        "web_requests",
        "/tmp/web_requests",
        "kafka:9092",
    )
    assert (seen["consumer_group"], seen["pipeline_id"]) == ("kdi-group", "web_requests")
    assert seen["seek_offsets"] == {"0": 5, "1": 7}
    assert seen["auto_offset_reset"] == "latest"
    assert (seen["allowed_latency"], seen["max_messages_per_batch"], seen["min_bytes_per_file"]) == (
        60.0,
        5000,
        134217728,
    )
    assert seen["transforms"] == ("date: substr(meta.producer.timestamp, `0`, `10`)",)
    assert seen["dlq_table_location"] == "/tmp/dlq"
    assert seen["dlq_transforms"] == ("date: substr(dead_lettered_at, `0`, `10`)",)
    assert seen["ends_at_latest_offsets"] is True and seen["decompress_gzip"] is True
    assert seen["kafka_settings"] == {
        "ssl.certificate.pem": env["KAFKA_DELTA_INGEST_CERT"],
        "ssl.key.pem": "key-pem",
        "ssl.ca.pem": "ca-pem",
        "sasl.username": "alice",
        "sasl.password": "s3cret",
    }
    assert (seen["schema_registry_username"], seen["schema_registry_password"]) == ("reg", "regpw")


def test_short_flags_and_old_names_still_work(monkeypatch):
    args = "t /tmp/x -k b:1 -g grp -a app -o latest -l 5 -m 10 -b 2048 -t a:kafka.offset -c -e -K x=y"
    seen = _parsed(monkeypatch, args.split(), {})
    assert (seen["brokers"], seen["consumer_group"], seen["pipeline_id"]) == ("b:1", "grp", "app")
    assert (seen["auto_offset_reset"], seen["allowed_latency"], seen["max_messages_per_batch"]) == (
        "latest",
        5,
        10,
    )
    assert (seen["min_bytes_per_file"], seen["transforms"], seen["ends_at_latest_offsets"]) == (
        2048,
        ("a:kafka.offset",),
        True,
    )
    assert seen["kafka_settings"] == {"x": "y"}
    assert seen["dlq_format"] == "deltaflow"
    assert _parsed(monkeypatch, ["t", "/x", "--dlq_format", "kafka-delta-ingest"], {})["dlq_format"] == (
        "kafka-delta-ingest"
    )
    old = {
        "TABLE_URI": "/tmp/old",
        "KAFKA_CONSUMER_GROUP_ID": "g-old",
        "SEEK_OFFSETS": '{"0": 1}',
        "AUTO_OFFSET_RESET": "latest",
    }
    seen = _parsed(monkeypatch, ["t"], old)
    assert (seen["table_uri"], seen["consumer_group"], seen["seek_offsets"]) == (
        "/tmp/old",
        "g-old",
        {"0": 1},
    )
    assert seen["auto_offset_reset"] == "latest"
    # -K wins over the TLS/SCRAM variables, as in kafka-delta-ingest
    seen = _parsed(monkeypatch, ["t", "/x", "-K", "ssl.ca.pem=mine"], {"KAFKA_DELTA_INGEST_CA": "env"})
    assert seen["kafka_settings"] == {"ssl.ca.pem": "mine"}


def test_statsd_is_refused_pointing_at_prometheus():
    result = CliRunner().invoke(cli, ["ingest", "t", "/tmp/x"], env={"STATSD_ENDPOINT": "localhost:8125"})
    assert result.exit_code == 2
    assert "--metrics_port" in result.output and "statsd" in result.output


def test_bad_scram_json_is_refused_without_showing_it():
    result = CliRunner().invoke(
        cli, ["ingest", "t", "/tmp/x"], env={"KAFKA_DELTA_INGEST_SCRAM_JSON": '{"username": "u", "pw": "x"}'}
    )
    assert result.exit_code != 0
    assert "KAFKA_DELTA_INGEST_SCRAM_JSON must be a JSON object" in str(result.exception or result.output)
    assert '"pw"' not in result.output


def test_rust_log_sets_the_log_level_unless_verbose(monkeypatch):
    import logging

    root = logging.getLogger()
    before = root.level
    try:
        for value, level in [
            ("warn", logging.WARNING),
            ("TRACE", logging.DEBUG),
            ("kdi=debug", logging.INFO),
        ]:
            _parsed(monkeypatch, ["t", "/x"], {"RUST_LOG": value})
            assert root.level == level, value
        root.setLevel(logging.DEBUG)
        CliRunner().invoke(cli, ["-v", "ingest", "t", "/x"], env={"RUST_LOG": "error"})
        assert root.level == logging.DEBUG  # --verbose wins
    finally:
        root.setLevel(before)
