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
