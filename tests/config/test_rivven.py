"""Rivven's connector files as they are: both examples of its Delta connector document (host
names adjusted) become deltaflow pipelines, every key accounted for."""

from __future__ import annotations

import textwrap

import pytest
from click.testing import CliRunner

from deltaflow.cli.main import cli
from deltaflow.config.pipeline import PostgresCdcSourceSpec, load_pipelines
from deltaflow.errors import PipelineConfigError

BASIC = """
    # Capture Postgres CDC events to local Delta table
    sources:
      postgres:
        connector: postgres-cdc
        config:
          host: localhost
          port: 5432
          database: mydb
          publication: rivven_pub

    sinks:
      delta:
        connector: delta-lake
        config:
          table_uri: /tmp/events
          batch_size: 1000
          flush_interval_secs: 10
"""

PRODUCTION = """
    sources:
      postgres:
        connector: postgres-cdc
        config:
          host: db.prod.internal
          port: 5432
          database: production
          publication: rivven_pub

    sinks:
      delta:
        connector: delta-lake
        config:
          table_uri: s3://data-lake/warehouse/events
          batch_size: 50000
          flush_interval_secs: 120
          compression: zstd
          partition_columns:
            - event_type
          s3:
            region: us-east-1
          table_properties:
            delta.logRetentionDuration: "interval 30 days"
            delta.deletedFileRetentionDuration: "interval 7 days"
"""


def _write(tmp_path, text: str):
    path = tmp_path / "rivven.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_basic_local_setup_is_one_cdc_pipeline(tmp_path):
    file = load_pipelines(_write(tmp_path, BASIC))
    (spec,) = file.pipelines
    assert spec.pipeline_id == "postgres-delta"
    assert isinstance(spec.source, PostgresCdcSourceSpec)
    assert (spec.source.host, spec.source.port, spec.source.database) == ("localhost", 5432, "mydb")
    assert (spec.source.publication, spec.source.slot_name, spec.source.snapshot) == (
        "rivven_pub",
        "deltaflow_rivven_pub",
        "initial",
    )
    assert spec.source.max_changes_per_batch == 1000
    assert spec.source.batch_interval == 10 and spec.trigger_interval is None
    assert [s.table_uri for s in spec.sinks] == ["/tmp/events"] and spec.sink_names() == ["delta"]
    assert any("batch_size" in n and "max_changes_per_batch" in n for n in file.notes)
    assert any("flush_interval_secs" in n and "batch_interval" in n for n in file.notes)


def test_the_production_s3_setup_keeps_every_sink_setting(tmp_path):
    (spec,) = load_pipelines(_write(tmp_path, PRODUCTION)).pipelines
    (sink,) = spec.sinks
    assert (sink.compression, sink.partition_columns) == ("zstd", ("event_type",))
    assert sink.storage_options == {"AWS_REGION": "us-east-1"}
    assert sink.table_properties["delta.deletedFileRetentionDuration"] == "interval 7 days"
    assert spec.source.max_changes_per_batch == 50000 and spec.source.batch_interval == 120


def test_storage_blocks_become_storage_options_and_secrets_stay_out_of_the_notes(tmp_path):
    text = PRODUCTION.replace(
        "            region: us-east-1",
        "            region: eu-west-1\n"
        "            endpoint: http://minio:9000\n"
        "            access_key_id: minioadmin\n"
        "            secret_access_key: hunter2\n"
        "            path_style_access: true\n"
        "            allow_http: true",
    )
    path = _write(tmp_path, text)
    file = load_pipelines(path)
    assert file.pipelines[0].sinks[0].storage_options == {
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_ACCESS_KEY_ID": "minioadmin",
        "AWS_SECRET_ACCESS_KEY": "hunter2",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "AWS_ALLOW_HTTP": "true",
    }
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "hunter2" not in result.output
    assert (
        "rivven sinks.delta.config.s3.path_style_access: storage option AWS_VIRTUAL_HOSTED_STYLE_REQUEST"
        in (result.output)
    )
    assert "postgres-delta: postgres-cdc publication rivven_pub" in result.output

    azure = BASIC.replace(
        "          table_uri: /tmp/events",
        "          table_uri: az://lake/events\n"
        "          azure:\n            account: acct\n            access_key: k3y",
    )
    (spec,) = load_pipelines(_write(tmp_path, azure)).pipelines
    assert spec.sinks[0].storage_options == {
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "AZURE_STORAGE_ACCOUNT_KEY": "k3y",
    }


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            ("batch_size: 1000", "batch_sise: 1000"),
            "sinks.delta.config.batch_sise: unknown key of Rivven's Delta sink",
        ),
        (
            ("publication: rivven_pub", "publication: rivven_pub\n    streams: [{name: users}]"),
            "choose them with the publication",
        ),
        (("connector: postgres-cdc", "connector: mysql-cdc"), "'mysql-cdc' is not a source deltaflow runs"),
        (("connector: delta-lake", "connector: iceberg"), "'iceberg' is not a Delta sink"),
        (("sinks:", "broker: {address: x}\nsinks:"), "broker: not a key of a Rivven connector file"),
        (
            ("flush_interval_secs: 10", "flush_interval_secs: 10\n      write_mode: overwrite"),
            "no overwrite",
        ),
    ],
)
def test_what_cannot_be_honoured_is_a_problem_with_its_rivven_path(tmp_path, change, problem):
    text = textwrap.dedent(BASIC).replace(*change)
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(PipelineConfigError, match=problem):
        load_pipelines(path)


def test_several_sources_and_sinks_are_joined_by_pipelines(tmp_path):
    joined = textwrap.dedent(BASIC) + textwrap.dedent(
        """
        pipelines:
          orders_cdc: {source: postgres, sink: delta, enabled: true}
        """
    )
    path = tmp_path / "joined.yaml"
    path.write_text(joined)
    (spec,) = load_pipelines(path).pipelines
    assert spec.pipeline_id == "orders_cdc"

    two_sinks = (
        textwrap.dedent(BASIC) + "  other:\n    connector: delta-lake\n    config: {table_uri: /tmp/other}\n"
    )
    path.write_text(two_sinks)
    with pytest.raises(PipelineConfigError, match="join them with pipelines"):
        load_pipelines(path)
    path.write_text(two_sinks + "pipelines:\n  p: {source: postgres, sink: nowhere}\n")
    with pytest.raises(PipelineConfigError, match="no sink 'nowhere'"):
        load_pipelines(path)


def test_rivven_keys_are_checked_at_their_rivven_paths_and_every_key_is_explained(tmp_path):
    def load(text: str):
        path = tmp_path / "r.yaml"
        path.write_text(textwrap.dedent(text))
        return load_pipelines(path)

    with pytest.raises(
        PipelineConfigError, match=r"sources\.postgres\.config\.snapshot_mode: must be one of"
    ):
        load(
            BASIC.replace(
                "publication: rivven_pub", "publication: rivven_pub\n          snapshot_mode: when_needed"
            )
        )
    with pytest.raises(PipelineConfigError, match=r"sinks\.delta\.config\.batch_size"):
        load(BASIC.replace("batch_size: 1000", "batch_size: -1"))
    with pytest.raises(PipelineConfigError, match="found the key 'delta' twice"):
        load(BASIC + "      delta:\n        connector: delta-lake\n        config: {table_uri: /tmp/other}\n")
    with pytest.raises(PipelineConfigError, match="GOOGLE_APPLICATION_CREDENTIALS"):
        load(
            BASIC.replace(
                "batch_size: 1000", "batch_size: 1000\n          gcs: {service_account_path: /k.json}"
            )
        )
    joined = BASIC + "    pipelines:\n      p: {source: postgres, sink: delta, enabled: ture}\n"
    with pytest.raises(PipelineConfigError, match=r"pipelines\.p\.enabled: must be true or false"):
        load(joined)
    fanned = (
        BASIC.replace(
            "    sinks:\n",
            "    sinks:\n      other:\n        connector: delta-lake\n        config: {table_uri: /tmp/o}\n",
        )
        + "    pipelines:\n"
        + "      p1: {source: postgres, sink: delta}\n      p2: {source: postgres, sink: other}\n"
    )
    with pytest.raises(PipelineConfigError, match="read the same replication slot 'deltaflow_rivven_pub'"):
        load(fanned)

    # storage_options given in any case win over the s3 block's; every key has a note.
    file = load(
        PRODUCTION.replace(
            "            region: us-east-1",
            "            region: us-east-1\n          storage_options: {aws_region: eu-west-1}",
        )
    )
    assert file.pipelines[0].sinks[0].storage_options == {"aws_region": "eu-west-1"}
    notes = "\n".join(file.notes)
    assert "sinks.delta.config.s3.region: not used: storage_options sets aws_region" in notes
    for key in ("host", "port", "database", "publication"):
        assert f"sources.postgres.config.{key}: the source's {key}" in notes
    for key in ("table_uri", "compression", "partition_columns", "table_properties"):
        assert f"sinks.delta.config.{key}: the sink's {key}" in notes
