"""Reading a table: ``history``, ``describe`` (files, sizes, schema, protocol), ``read``
(time travel, predicates) and ``changes`` (the change data feed)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.config.units import parse_size
from deltaflow.errors import ConfigError
from deltaflow.ops.table import logged_paths, open_table

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

__all__ = ["SMALL_FILE_SIZE", "changes", "describe", "history", "read"]


#: Files below this size count as small (Delta's auto-compaction threshold).
SMALL_FILE_SIZE = 128 * 1024**2


#: Upper bounds of the size histogram's buckets (the last bucket is open).
_HISTOGRAM_BOUNDS = (1024**2, 8 * 1024**2, 32 * 1024**2, 128 * 1024**2, 512 * 1024**2)


def history(
    uri: str, *, limit: int | None = None, storage_options: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """Commits, newest first: version, time, operation, parameters, metrics, metadata."""
    table = open_table(uri, storage_options)
    out = []
    for entry in table.history(limit):
        item = dict(entry)
        stamp = item.pop("timestamp", None)
        if stamp is not None:
            item["timestamp"] = _iso(stamp)
        out.append(item)
    return sorted(out, key=lambda e: -int(e.get("version", 0)))


def _iso(millis: int) -> str:
    return dt.datetime.fromtimestamp(millis / 1000, dt.UTC).isoformat(timespec="milliseconds")


def describe(
    uri: str,
    *,
    small_file_size: int | str = SMALL_FILE_SIZE,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Schema, partitioning, properties, protocol, version, files and their size histogram."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = open_table(uri, storage_options)
    meta = table.metadata()
    protocol = table.protocol()
    adds = pa.table(table.get_add_actions(flatten=True))
    sizes = adds["size_bytes"].to_pylist() if adds.num_rows else []
    small = parse_size(small_file_size)
    bounds = (0, *_HISTOGRAM_BOUNDS)
    histogram = []
    for low, high in zip(bounds, (*_HISTOGRAM_BOUNDS, None), strict=True):
        count = sum(1 for s in sizes if s >= low and (high is None or s < high))
        histogram.append({"from_bytes": low, "to_bytes": high, "files": count})
    partitions = 0
    if adds.num_rows and meta.partition_columns:
        keys = [adds[f"partition.{c}"].cast(pa.string()) for c in meta.partition_columns]
        partitions = len(pc.unique(pc.binary_join_element_wise(*keys, "\x00")))
    rows = adds["num_records"] if adds.num_rows and "num_records" in adds.column_names else None
    small_files = sum(1 for s in sizes if s < small)
    return {
        "table_uri": normalize_uri(uri),
        "id": meta.id,
        "name": meta.name,
        "description": meta.description,
        "version": table.version(),
        "created": _iso(meta.created_time) if meta.created_time else None,
        "partition_columns": list(meta.partition_columns),
        "properties": dict(meta.configuration),
        "protocol": {
            "min_reader_version": protocol.min_reader_version,
            "min_writer_version": protocol.min_writer_version,
            "reader_features": list(protocol.reader_features or []),
            "writer_features": list(protocol.writer_features or []),
        },
        "schema": [
            {"name": f.name, "type": _type_name(f.type), "nullable": f.nullable}
            for f in table.schema().fields
        ],
        "files": {
            "count": len(sizes),
            "bytes": sum(sizes),
            "rows": int(pc.sum(rows).as_py() or 0) if rows is not None else None,
            "partitions": partitions,
            "small_file_size": small,
            "small_files": small_files,
            "small_file_ratio": round(small_files / len(sizes), 4) if sizes else 0.0,
            "size_histogram": histogram,
        },
    }


def _type_name(dtype: Any) -> str:
    """``long``, ``struct<a: int>``, ``array<string>``: delta-rs types as Delta names them."""
    kind = getattr(dtype, "type", None)
    if isinstance(kind, str) and kind not in ("struct", "array", "map"):
        return kind  # primitive
    payload = json.loads(dtype.to_json()) if hasattr(dtype, "to_json") else str(dtype)
    return _json_type(payload)


def _json_type(payload: Any) -> str:
    if isinstance(payload, str):
        return payload
    kind = payload.get("type")
    if kind == "struct":
        return "struct<" + ", ".join(f"{f['name']}: {_json_type(f['type'])}" for f in payload["fields"]) + ">"
    if kind == "array":
        return f"array<{_json_type(payload['elementType'])}>"
    if kind == "map":
        return f"map<{_json_type(payload['keyType'])}, {_json_type(payload['valueType'])}>"
    return str(kind)


def read(
    uri: str,
    *,
    version: int | None = None,
    timestamp: str | None = None,
    where: str | None = None,
    columns: Sequence[str] = (),
    limit: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> pa.Table:
    """Rows of the table, now or as of ``version`` / ``timestamp`` (time travel), filtered by a
    SQL predicate (``where``, evaluated by delta-rs' DataFusion engine with file skipping)."""
    import pyarrow as pa
    from deltalake import QueryBuilder

    if version is not None and timestamp is not None:
        raise ConfigError("give at most one of --version and --timestamp")
    at = version if version is not None else timestamp
    table = open_table(uri, storage_options, version=at)
    select = ", ".join(_quote_ident(c) for c in columns) if columns else "*"
    sql = f"SELECT {select} FROM t"
    if where:
        sql += f" WHERE {where}"
    if limit is not None:
        sql += f" LIMIT {int(limit)}"
    try:
        reader = QueryBuilder().register("t", table).execute(sql)
    except Exception as exc:  # noqa: BLE001 - DataFusion errors (bad column, bad SQL)
        _check_version_files(table, uri, storage_options)
        raise ConfigError(f"cannot read {normalize_uri(uri)!r} with {sql!r}: {exc}") from None
    try:
        rows = reader.read_all()
    except Exception:
        _check_version_files(table, uri, storage_options)  # vacuumed files fail here, as an I/O error
        raise
    return _plain_types(pa.table(rows))


def _check_version_files(table: DeltaTable, uri: str, storage_options: Mapping[str, str] | None) -> None:
    """After a read failed: stop with :class:`~deltaflow.errors.DataFilesGoneError` when files of
    the version read are gone. Looked for only then: a read that works costs no extra request."""
    from deltaflow.delta import log as delta_log

    table_uri = normalize_uri(uri)
    delta_log.check_version_readable(table_uri, storage_options or {}, table.version(), logged_paths(table))


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _plain_types(table: pa.Table) -> pa.Table:
    """Arrow view types (DataFusion's output) as plain ones, for every printer and reader."""
    from deltaflow.delta.schema import plain_schema

    return table.cast(plain_schema(table.schema))


def changes(
    uri: str,
    *,
    from_version: int = 0,
    to_version: int | None = None,
    limit: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> pa.Table:
    """The change data feed between two versions (inserts, update pre/post images, deletes)
    with ``_change_type``, ``_commit_version`` and ``_commit_timestamp``.

    Raises:
        ConfigError: the table does not record changes (``delta.enableChangeDataFeed``).
    """
    import pyarrow as pa

    table = open_table(uri, storage_options)
    if table.metadata().configuration.get("delta.enableChangeDataFeed", "false").lower() != "true":
        raise ConfigError(
            f"{normalize_uri(uri)!r} does not record changes: enable it with `deltaflow properties "
            "TABLE set delta.enableChangeDataFeed=true` (changes are recorded from then on)",
        )
    last = table.version() if to_version is None else to_version
    try:
        reader = table.load_cdf(starting_version=from_version, ending_version=to_version)
    except Exception as exc:  # noqa: BLE001
        _check_change_files(uri, storage_options, from_version, last)
        raise ConfigError(f"cannot read the changes of {normalize_uri(uri)!r}: {exc}") from None
    try:
        rows = reader.read_all()
    except Exception:
        _check_change_files(uri, storage_options, from_version, last)  # vacuumed files fail here
        raise
    out = pa.table(rows)
    if limit is not None:
        out = out.slice(0, limit)
    return _plain_types(out)


def _check_change_files(uri: str, storage_options: Mapping[str, str] | None, first: int, last: int) -> None:
    """After reading the change data feed failed: stop with
    :class:`~deltaflow.errors.DataFilesGoneError` when files it reads are gone (a version's
    change data files, or without them its data files added and removed)."""
    from deltaflow.delta import commit
    from deltaflow.delta import log as delta_log

    table_uri = normalize_uri(uri)
    paths: list[str] = []
    for entry in commit.read_entries(table_uri, storage_options or {}, first, last):
        paths += sorted(entry.changes or (entry.added | entry.removed))
    delta_log.check_files_present(
        table_uri,
        storage_options or {},
        paths,
        doing=f"read the changes of {table_uri!r} from version {first} to {last}",
        of="those versions",
        instead="Read the changes from a later version",
    )
