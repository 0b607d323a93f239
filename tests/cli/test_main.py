"""``deltaflow.cli.main``: one spelling, an environment variable for every flag, shown in --help."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from deltaflow.cli import cli


def _options():
    for name, command in sorted(cli.commands.items()):
        for param in command.params:
            if isinstance(param, click.Option):
                yield pytest.param(name, param, id=f"{name}-{param.name}")


@pytest.mark.parametrize(("command", "option"), list(_options()))
def test_every_flag_has_an_environment_variable_shown_in_help(command, option):
    ctx = click.Context(
        cli.commands[command], info_name=command, parent=click.Context(cli, auto_envvar_prefix="DELTAFLOW")
    )
    record = option.get_help_record(ctx)
    assert record is not None
    assert "env var: " in record[1]
    long_names = [o for o in option.opts if o.startswith("--")]
    # One spelling: the first long name uses hyphens (underscore spellings are aliases).
    assert long_names and "_" not in long_names[0]


def test_an_auto_environment_variable_sets_its_flag(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(
        "pipelines:\n  - id: p\n    source: {type: generator}\n    sinks: [{table_uri: "
        + str(tmp_path / "t")
        + "}]\n"
    )
    plain = CliRunner().invoke(cli, ["validate", str(path)])
    shown = CliRunner().invoke(cli, ["validate", str(path)], env={"DELTAFLOW_VALIDATE_SHOW": "1"})
    assert plain.exit_code == shown.exit_code == 0, shown.output
    assert "pipelines:" not in plain.output
    assert "pipelines:" in shown.output  # --show printed the resolved file


def test_kafka_delta_ingest_spellings_stay_aliases():
    ingest = cli.commands["ingest"]
    names = {o for p in ingest.params for o in [*p.opts, *p.secondary_opts]}
    for flag in ("--app_id", "--allowed_latency", "--max_messages_per_batch", "--dlq_table_location"):
        assert flag in names
        assert flag.replace("_", "-") in names


def test_a_flag_value_option_reads_its_environment_variable():
    result = CliRunner().invoke(
        cli, ["ingest", "t", "/tmp/x", "--avro", "schema.avsc"], env={"DELTAFLOW_INGEST_VALUE_FORMAT": "raw"}
    )
    assert result.exit_code == 2
    assert "--avro and --raw exclude each other" in result.output
