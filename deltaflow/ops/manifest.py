"""Symlink manifests (``GENERATE symlink_format_manifest``) for readers that list files instead
of reading the Delta log (Presto, Athena, Redshift Spectrum, Hive).

``<table>/_symlink_format_manifest/<partition dirs>/manifest`` holds the absolute URIs of the
data files of the partition at the table's current version, one per line; manifests of
partitions that no longer have files are deleted. The folder starts with ``_``: Delta readers
and vacuum leave it alone. A manifest is a snapshot: generate it again after writes.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs

from deltaflow.config.locations import normalize_uri
from deltaflow.io.parquet import partition_dir
from deltaflow.io.storage import filesystem
from deltaflow.ops.table import open_table

__all__ = ["MANIFEST_DIR", "symlink_format_manifest"]

MANIFEST_DIR = "_symlink_format_manifest"


def symlink_format_manifest(uri: str, *, storage_options: Mapping[str, str] | None = None) -> dict[str, int]:
    """Write the manifests of the table's current version; returns ``{partition dir: files}``."""
    table = open_table(uri, storage_options)
    table_uri = normalize_uri(uri)
    columns = list(table.metadata().partition_columns)
    actions = pa.table(table.get_add_actions(flatten=True))
    by_dir: dict[str, list[str]] = {}
    rows = (
        actions.select(["path", *(f"partition.{c}" for c in columns)]).to_pylist() if actions.num_rows else []
    )
    for row in rows:
        values = [None if row[f"partition.{c}"] is None else str(row[f"partition.{c}"]) for c in columns]
        absolute = f"{table_uri.rstrip('/')}/{unquote(row['path'])}"
        by_dir.setdefault(partition_dir(columns, values), []).append(absolute)
    fs, root = filesystem(table_uri, storage_options or {})
    base = f"{root}/{MANIFEST_DIR}"
    stale = {
        info.path
        for info in fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        if info.type == pafs.FileType.File and info.base_name == "manifest"
    }
    for folder, files in by_dir.items():
        path = f"{base}/{folder}/manifest" if folder else f"{base}/manifest"
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as out:
            out.write(("\n".join(sorted(files)) + "\n").encode())
        stale.discard(path)
    for path in stale:
        fs.delete_file(path)
    return {folder: len(files) for folder, files in by_dir.items()}
