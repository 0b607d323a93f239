"""The ``parquet-files`` source of pipeline files: one table, no row processing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from deltaflow.config.pipeline import ParquetFilesSourceSpec, PipelineSpec


def _spec(**extra):
    return PipelineSpec.model_validate(
        {
            "id": "landed",
            "source": {"type": "parquet-files", "path": "/landing", "copy": True},
            "sinks": [{"table_uri": "/t"}],
            **extra,
        }
    )


def test_a_parquet_files_source_is_read_with_its_options():
    spec = _spec()
    assert isinstance(spec.source, ParquetFilesSourceSpec)
    assert (spec.source.path, spec.source.copy_, spec.source.max_files_per_trigger) == (
        "/landing",
        True,
        None,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"filter": "id > 1"}, "registers files without reading them: filter cannot apply"),
        ({"transforms": {"a": "b"}}, "transforms cannot apply"),
        ({"sinks": [{"table_uri": "/t"}, {"table_uri": "/u"}]}, "exactly one sink table"),
        ({"sinks": [{"table_uri": "/t", "write_mode": "overwrite"}]}, "write_mode must be append"),
    ],
    ids=["filter", "transforms", "two-sinks", "overwrite"],
)
def test_what_a_parquet_files_source_cannot_do_is_refused(extra, message):
    with pytest.raises(ValidationError, match=message):
        _spec(**extra)
