"""Storage URIs: a listed path as a URI again, and a file's place in a table."""

from __future__ import annotations

import pytest

from deltaflow.io.storage import filesystem, listed_uri, table_relative

AZURE = {"azure_storage_account_name": "acct", "azure_storage_account_key": "a2V5"}


@pytest.mark.parametrize(
    "uri",
    [
        "/data/landing",
        "s3://bucket/landing",
        "az://box/landing",
        "abfss://box@acct.dfs.core.windows.net/landing",
        "abfs://box@acct.dfs.core.windows.net/landing",
    ],
)
def test_a_listed_path_becomes_a_uri_of_the_same_form(uri):
    _, where = filesystem(uri, {"AWS_REGION": "us-east-1", **AZURE})
    assert listed_uri(uri, where) == uri
    assert listed_uri(uri, f"{where}/day=1/a.parquet") == f"{uri}/day=1/a.parquet"


def test_table_relative_is_the_path_below_the_root_or_none():
    assert table_relative("s3://b/t/day=1/a.parquet", "s3://b/t") == "day=1/a.parquet"
    assert table_relative("s3://b/t/a.parquet", "s3://b/t/") == "a.parquet"
    assert table_relative("s3://b/t2/a.parquet", "s3://b/t") is None  # a sibling, not inside
    assert table_relative("/d/landing/a.parquet", "/d/t") is None
    root = "abfss://box@acct.dfs.core.windows.net/t"
    _, where = filesystem(root, AZURE)
    assert table_relative(listed_uri(root, f"{where}/x.parquet"), root) == "x.parquet"
