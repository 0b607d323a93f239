"""``checkpoint``: write a Delta log checkpoint (and clean up expired log entries)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.ops.table import open_table

if TYPE_CHECKING:
    pass

__all__ = ["checkpoint"]


def checkpoint(
    uri: str, *, cleanup: bool = False, storage_options: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Write a checkpoint of the current version; with ``cleanup`` also delete log entries
    older than ``delta.logRetentionDuration`` (30 days unless set) that it makes redundant."""
    table = open_table(uri, storage_options)
    table.create_checkpoint()
    if cleanup:
        table.cleanup_metadata()
    return {"table_uri": normalize_uri(uri), "version": table.version(), "cleaned_up": cleanup}
