"""``checkpoint``: write a Delta log checkpoint (and clean up expired log entries)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from deltaflow.config.locations import join, normalize_uri
from deltaflow.io.storage import filesystem
from deltaflow.ops.table import open_table

__all__ = ["checkpoint"]


def checkpoint(
    uri: str, *, cleanup: bool = False, storage_options: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Write a checkpoint of the current version; with ``cleanup`` also delete log entries
    older than ``delta.logRetentionDuration`` (30 days unless set) that it makes redundant."""
    table = open_table(uri, storage_options)
    table.create_checkpoint()
    removed = 0
    if cleanup:
        # delta-rs says nothing of what it deleted: count the log's files before and after.
        before = _log_files(uri, storage_options or {})
        table.cleanup_metadata()
        removed = len(before - _log_files(uri, storage_options or {}))
    return {
        "table_uri": normalize_uri(uri),
        "version": table.version(),
        "cleaned_up": cleanup,
        "log_files_removed": removed,
    }


def _log_files(uri: str, storage_options: Mapping[str, str]) -> set[str]:
    import pyarrow.fs as pafs

    fs, root = filesystem(normalize_uri(uri), storage_options)
    infos = fs.get_file_info(pafs.FileSelector(join(root, "_delta_log"), allow_not_found=True))
    return {i.path for i in infos if i.type == pafs.FileType.File}
