"""Opening a table for maintenance, and maintenance results as JSON."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.errors import ConfigError, TableNotFoundError

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["logged_paths", "open_table", "to_jsonable"]


def open_table(
    uri: str, storage_options: Mapping[str, str] | None = None, *, version: int | str | None = None
) -> DeltaTable:
    """The Delta table at ``uri`` (at ``version``: a number or an ISO-8601 timestamp, which
    means the last version committed at or before it).

    Raises:
        TableNotFoundError: no Delta table there.
        ConfigError: the version does not exist, or the timestamp is before the earliest version
            still in the log.
    """
    from deltaflow.delta import log as delta_log

    table_uri = normalize_uri(uri)
    table = delta_log.load(table_uri, storage_options or {})
    if table is None:
        raise TableNotFoundError(f"no Delta table at {table_uri!r}", table_uri=table_uri)
    if isinstance(version, str):
        # Resolved here, never by delta-rs: it answers a time before the first commit with
        # version 0 (the empty CREATE), and a restore to that empties the table.
        version = delta_log.version_as_of(table, version, table_uri)
    if version is not None:
        try:
            table.load_as_version(version)
        except Exception as exc:  # noqa: BLE001 - delta-rs raises several kinds here
            raise ConfigError(
                f"table {table_uri!r} has no version {version!r} (current version {table.version()}; "
                f"the log may have been cleaned up): {exc}",
                table_uri=table_uri,
            ) from None
    return table


def logged_paths(table: DeltaTable) -> list[str]:
    """The data files of ``table`` at its loaded version, as the log holds their paths."""
    import pyarrow as pa

    return [str(p) for p in pa.table(table.get_add_actions(flatten=False))["path"].to_pylist()]


def to_jsonable(value: Any) -> Any:
    """Results as JSON-ready data (dataclasses, Arrow tables as lists of rows)."""
    import pyarrow as pa

    if isinstance(value, pa.Table):
        return [{k: _json_scalar(v) for k, v in row.items()} for row in value.to_pylist()]
    if hasattr(value, "__dataclass_fields__"):
        return asdict(value)
    return value


def _json_scalar(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {k: _json_scalar(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_scalar(v) for v in value]
    return value
