"""``restore``: make an earlier version the current content again, refused when its files
are gone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deltaflow.config.locations import normalize_uri
from deltaflow.errors import ConfigError
from deltaflow.ops.table import logged_paths, open_table

__all__ = ["RestoreResult", "restore"]


@dataclass(frozen=True)
class RestoreResult:
    table_uri: str
    restored_to: int
    version_before: int
    version: int
    metrics: dict[str, Any]


def restore(
    uri: str,
    *,
    version: int | None = None,
    timestamp: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> RestoreResult:
    """Make the table's content that of ``version`` (or of the last version at ``timestamp``)
    again, as a new commit.

    Raises:
        DataFilesGoneError: data files of that version are gone (vacuumed); restoring would
            leave a table no reader can scan (DELTA_NOTES), so nothing is done.
    """
    if (version is None) == (timestamp is None):
        raise ConfigError("give exactly one of --version and --timestamp")
    target = open_table(uri, storage_options, version=version if version is not None else timestamp)
    target_version = target.version()
    from deltaflow.delta import log as delta_log

    delta_log.check_files_present(
        normalize_uri(uri),
        storage_options or {},
        logged_paths(target),
        doing=f"restore {normalize_uri(uri)!r} to version {target_version}",
        of="that version",
        instead="Restore to a newer version",
    )
    from deltaflow.delta import commit

    table = open_table(uri, storage_options)
    before = table.version()
    if target_version == before:  # already its content: nothing to commit
        return RestoreResult(normalize_uri(uri), target_version, before, before, {})
    outcome = commit.commit(
        normalize_uri(uri),
        storage_options or {},
        lambda table, props: dict(table.restore(target_version, commit_properties=props)) if table else {},
        what=f"restore of {normalize_uri(uri)} to version {target_version}",
        metadata={"deltaflow.operation": "restore"},
    )
    metrics = dict(outcome.value or outcome.info.get("operationMetrics") or {})
    return RestoreResult(normalize_uri(uri), target_version, before, outcome.version or before + 1, metrics)
