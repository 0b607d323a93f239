"""``restore``: make an earlier version the current content again, refused when its files
are gone."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from deltaflow.config.locations import join, normalize_uri
from deltaflow.errors import ConfigError, TerminalError
from deltaflow.io.storage import filesystem
from deltaflow.ops.table import open_table

if TYPE_CHECKING:
    from deltalake import DeltaTable

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
        TerminalError: data files of that version are gone (vacuumed); restoring would leave
            a table no reader can scan (DELTA_NOTES), so nothing is done.
    """
    if (version is None) == (timestamp is None):
        raise ConfigError("give exactly one of --version and --timestamp")
    target = open_table(uri, storage_options, version=version if version is not None else timestamp)
    target_version = target.version()
    missing, total = _missing_files(target, uri, storage_options or {})
    if missing:
        raise TerminalError(
            f"cannot restore {normalize_uri(uri)!r} to version {target_version}: {len(missing)} of "
            f"{total} data files of that version are gone (vacuumed?), e.g. {missing[0]!r}. "
            "Restore to a newer version, or recover the files first",
            table_uri=normalize_uri(uri),
            missing=len(missing),
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


def _missing_files(table: DeltaTable, uri: str, storage_options: Mapping[str, str]) -> tuple[list[str], int]:
    import pyarrow as pa
    import pyarrow.fs as pafs

    fs, root = filesystem(normalize_uri(uri), storage_options)
    paths = pa.table(table.get_add_actions(flatten=False))["path"].to_pylist()
    missing = []
    for path in paths:
        candidates = [join(root, path)]
        if unquote(path) != path:
            candidates.append(join(root, unquote(path)))
        if all(info.type == pafs.FileType.NotFound for info in fs.get_file_info(candidates)):
            missing.append(path)
    return missing, len(paths)
