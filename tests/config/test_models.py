"""``deltaflow.config.models``: one way to validate options and to report their problems."""

from __future__ import annotations

import pytest

from deltaflow.errors import ConfigError
from deltaflow.sources.delta import DeltaStreamOptions
from deltaflow.sources.generator import GeneratorOptions


def test_spark_options_are_validated_once_with_key_value_and_allowed():
    with pytest.raises(ConfigError) as info:
        GeneratorOptions.from_spark_options({"rows_per_second": "fast", "partitions": "0", "colour": "red"})
    message = str(info.value)
    assert message.startswith("invalid options of the generator source: ")
    assert (
        "rows_per_second: Input should be a valid number, unable to parse string as a number "
        "(received 'fast')" in message
    )
    assert "partitions: Input should be greater than or equal to 1 (received '0')" in message
    assert "colour: unknown option" in message


def test_delta_source_options_take_path_and_prefer_table_uri():
    opts = DeltaStreamOptions.from_options(
        {"path": "/a/", "IGNORE_DELETES": "true", "storage_options": '{"k": "v"}'}
    )
    assert (opts.table_uri, opts.ignore_deletes, opts.storage_options) == ("/a", True, {"k": "v"})
    assert DeltaStreamOptions.from_options({"path": "/a", "table_uri": "/b"}).table_uri == "/b"
    with pytest.raises(ConfigError, match="table_uri: required option is missing"):
        DeltaStreamOptions.from_options({})
    with pytest.raises(
        ConfigError, match=r"starting_version: must be a version \(0 or more\) or 'latest' \(received '-1'\)"
    ):
        DeltaStreamOptions.from_options({"path": "/a", "starting_version": "-1"})
    assert (
        DeltaStreamOptions.from_options({"path": "/a", "starting_version": "LATEST"}).starting_version
        == "latest"
    )
    with pytest.raises(ConfigError, match="starting_version"):
        DeltaStreamOptions.from_options({"path": "/a", "starting_version": "soon"})


def test_secrets_are_masked_in_problems():
    with pytest.raises(ConfigError) as info:
        DeltaStreamOptions.from_options({"path": "/a", "storage_options": '{"AWS_SECRET_ACCESS_KEY": 5}'})
    assert "storage_options" in str(info.value) and "5" not in str(info.value).split("storage_options", 1)[1]
