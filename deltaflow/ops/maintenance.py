"""Table maintenance on delta-rs: optimize, vacuum, checkpoints, history, describe, restore,
properties, time-travel reads and the change data feed.

Every function takes a table URI (and storage options for object stores), works without
Spark, and returns plain data (dataclasses or Arrow tables) that the CLI prints as text or
JSON. Guards refuse what would lose data: a vacuum below the table's retention, a restore to
a version whose files are gone.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from deltaflow.config.locations import join, normalize_uri
from deltaflow.config.units import parse_size
from deltaflow.delta.layout import STAGING_DIR
from deltaflow.errors import ConfigError, DeltaflowError, TableNotFoundError, TerminalError
from deltaflow.io.storage import filesystem

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import CommitProperties, DeltaTable

__all__ = [
    "DEFAULT_RETENTION",
    "SMALL_FILE_SIZE",
    "OptimizeResult",
    "RestoreResult",
    "VacuumResult",
    "changes",
    "checkpoint",
    "describe",
    "history",
    "open_table",
    "optimize",
    "parse_partition_predicate",
    "properties",
    "read",
    "restore",
    "retention",
    "vacuum",
]

logger = logging.getLogger(__name__)

#: Delta's default ``delta.deletedFileRetentionDuration``: vacuum never goes below it unforced.
DEFAULT_RETENTION = dt.timedelta(days=7)
#: Files below this size count as small (Delta's auto-compaction threshold).
SMALL_FILE_SIZE = 128 * 1024**2
#: Upper bounds of the size histogram's buckets (the last bucket is open).
_HISTOGRAM_BOUNDS = (1024**2, 8 * 1024**2, 32 * 1024**2, 128 * 1024**2, 512 * 1024**2)

_INTERVAL = re.compile(
    r"^\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*"
    r"(microseconds?|milliseconds?|seconds?|minutes?|hours?|days?|weeks?)\s*$",
    re.IGNORECASE,
)
_TERM = re.compile(
    r"^\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*(==|=|!=|<>|<=|>=|<|>|not\s+in\b|in\b)\s*(.+?)\s*$",
    re.IGNORECASE | re.DOTALL,
)


def _interval(text: str) -> dt.timedelta:
    m = _INTERVAL.match(text)
    if m is None:
        raise ConfigError(f"cannot read the interval {text!r} (expected e.g. 'interval 7 days')", value=text)
    unit = m.group(2).lower().rstrip("s")
    return dt.timedelta(**{f"{unit}s": float(m.group(1))})


def open_table(
    uri: str, storage_options: Mapping[str, str] | None = None, *, version: int | str | None = None
) -> DeltaTable:
    """The Delta table at ``uri`` (at ``version``: a number or an ISO-8601 timestamp).

    Raises:
        TableNotFoundError: no Delta table there.
        ConfigError: the version does not exist.
    """
    from deltaflow.delta import log as delta_log

    table_uri = normalize_uri(uri)
    table = delta_log.load(table_uri, storage_options or {})
    if table is None:
        raise TableNotFoundError(f"no Delta table at {table_uri!r}", table_uri=table_uri)
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


def parse_partition_predicate(text: str, partition_columns: Sequence[str]) -> list[tuple[str, str, Any]]:
    """delta-rs partition filters from ``"date = '2026-11-22' AND country IN ('DE', 'FR')"``.

    Only partition columns, joined with AND; operators ``= != < <= > >= IN NOT IN``.
    """
    if not partition_columns:
        raise ConfigError("--where selects partitions, and this table has no partition columns")
    filters: list[tuple[str, str, Any]] = []
    for term in _split_and(text):
        m = _TERM.match(term)
        if m is None:
            raise ConfigError(
                f"cannot read {term.strip()!r} in the partition predicate {text!r}; use "
                "column = 'value' or column IN ('a', 'b'), joined with AND",
                predicate=text,
            )
        column = m.group(1).strip("`")
        if column not in partition_columns:
            raise ConfigError(
                f"{column!r} in --where is not a partition column; partition columns: "
                f"{', '.join(partition_columns)}",
                predicate=text,
            )
        op = " ".join(m.group(2).lower().split())
        op = {"==": "=", "<>": "!="}.get(op, op)
        raw = m.group(3).strip()
        if op in ("in", "not in"):
            if not (raw.startswith("(") and raw.endswith(")")):
                raise ConfigError(f"{op.upper()} needs a list in parentheses: {term.strip()!r}")
            filters.append((column, op, [_literal(v) for v in _split_commas(raw[1:-1])]))
        else:
            filters.append((column, op, _literal(raw)))
    return filters


def _split_and(text: str) -> list[str]:
    parts, current, quoted = [], [], False
    tokens = re.split(r"(\s+and\s+|')", text, flags=re.IGNORECASE)
    for token in tokens:
        if token == "'":
            quoted = not quoted
            current.append(token)
        elif not quoted and re.fullmatch(r"\s+and\s+", token, flags=re.IGNORECASE):
            parts.append("".join(current))
            current = []
        else:
            current.append(token)
    parts.append("".join(current))
    if quoted:
        raise ConfigError(f"unbalanced quote in the partition predicate {text!r}")
    return [p for p in parts if p.strip()]


def _split_commas(text: str) -> list[str]:
    out, current, quoted = [], "", False
    for ch in text:
        if ch == "'":
            quoted = not quoted
        if ch == "," and not quoted:
            out.append(current)
            current = ""
        else:
            current += ch
    out.append(current)
    return [v for v in out if v.strip()]


_QUOTED = re.compile(r"^'((?:[^']|'')*)'$")
_BARE = re.compile(r"^[A-Za-z0-9_.:+\-]+$")


def _literal(raw: str) -> str:
    raw = raw.strip()
    if (m := _QUOTED.match(raw)) is not None:
        return m.group(1).replace("''", "'")
    if _BARE.match(raw):
        return raw
    raise ConfigError(
        f"cannot read the value {raw!r} in --where; quote text values ('2026-11-22') and join terms with AND",
        value=raw,
    )


@dataclass(frozen=True)
class OptimizeResult:
    """What ``optimize`` did (delta-rs metrics, condensed)."""

    table_uri: str
    mode: str  # "compact" or "zorder"
    files_removed: int
    files_added: int
    bytes_removed: int
    bytes_added: int
    partitions_optimized: int
    version: int
    metrics: dict[str, Any] = field(default_factory=dict)


def optimize(
    uri: str,
    *,
    where: str | None = None,
    zorder: Sequence[str] = (),
    target_size: int | str | None = None,
    storage_options: Mapping[str, str] | None = None,
    lock_timeout_s: float = 300.0,
) -> OptimizeResult:
    """Bin-pack small files (or Z-order by ``zorder``) into files of about ``target_size``.

    Optimization commits with ``dataChange=false``: streams reading the table skip it, and it
    does not conflict with concurrent appends (DELTA_NOTES). It runs under the table's
    compaction lease (``deltaflow.delta.leases``), waiting up to ``lock_timeout_s`` for a running
    compaction, so that two never rewrite the same files.

    Raises:
        LeaseHeldError: another compaction kept the lease for ``lock_timeout_s``.
    """
    from deltaflow.delta.leases import compaction_lease

    open_table(uri, storage_options)  # a clear error for a missing table before any lease
    with compaction_lease(normalize_uri(uri), storage_options or {}, wait_s=lock_timeout_s):
        return _optimize(
            uri, where=where, zorder=zorder, target_size=target_size, storage_options=storage_options
        )


def _optimize(
    uri: str,
    *,
    where: str | None,
    zorder: Sequence[str],
    target_size: int | str | None,
    storage_options: Mapping[str, str] | None,
) -> OptimizeResult:
    table = open_table(uri, storage_options)
    meta = table.metadata()
    filters = parse_partition_predicate(where, meta.partition_columns) if where else None
    size = parse_size(target_size) if target_size is not None else None
    if zorder:
        names = [f.name for f in table.schema().fields]
        for column in zorder:
            if column not in names:
                raise ConfigError(
                    f"--zorder column {column!r} is not in the table; columns: {', '.join(names)}"
                )
            if column in meta.partition_columns:
                raise ConfigError(f"--zorder column {column!r} is a partition column; Z-order data columns")
    from deltaflow.delta import commit

    def attempt(table: DeltaTable | None, props: CommitProperties) -> dict[str, Any]:
        assert table is not None  # opened above
        if zorder:
            return dict(
                table.optimize.z_order(
                    list(zorder), partition_filters=filters, target_size=size, commit_properties=props
                )
            )
        return dict(
            table.optimize.compact(partition_filters=filters, target_size=size, commit_properties=props)
        )

    outcome = commit.commit(
        normalize_uri(uri),
        storage_options or {},
        attempt,
        what=f"optimize of {normalize_uri(uri)}",
        metadata={"deltaflow.operation": "zorder" if zorder else "compact"},
    )
    metrics = dict(outcome.value or outcome.info.get("operationMetrics") or {})
    table = open_table(uri, storage_options)
    added = json.loads(metrics.get("filesAdded") or "{}")
    removed = json.loads(metrics.get("filesRemoved") or "{}")
    result = OptimizeResult(
        table_uri=normalize_uri(uri),
        mode="zorder" if zorder else "compact",
        files_removed=int(metrics.get("numFilesRemoved", 0)),
        files_added=int(metrics.get("numFilesAdded", 0)),
        bytes_removed=int(removed.get("totalSize", 0)),
        bytes_added=int(added.get("totalSize", 0)),
        partitions_optimized=int(metrics.get("partitionsOptimized", 0)),
        version=table.version(),
        metrics=dict(metrics),
    )
    logger.info(
        "optimized %s: %d file(s) (%d bytes) -> %d file(s) (%d bytes), table version %d",
        result.table_uri,
        result.files_removed,
        result.bytes_removed,
        result.files_added,
        result.bytes_added,
        result.version,
    )
    return result


def retention(table: DeltaTable) -> dt.timedelta:
    """The table's ``delta.deletedFileRetentionDuration`` (default 7 days)."""
    raw = table.metadata().configuration.get("delta.deletedFileRetentionDuration")
    return _interval(raw) if raw else DEFAULT_RETENTION


@dataclass(frozen=True)
class VacuumResult:
    """Files a vacuum deleted (or, in a dry run, would delete)."""

    table_uri: str
    dry_run: bool
    retention_hours: int
    full: bool
    files: list[str]
    staging_files: list[str] = field(default_factory=list)


def vacuum(
    uri: str,
    *,
    retention_hours: int | None = None,
    dry_run: bool = True,
    full: bool = False,
    force: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> VacuumResult:
    """Delete data files no version within the retention period needs (a dry run by default).

    ``full`` also deletes files the log never referenced (left by failed or killed writes),
    including deltaflow's staging folder, older than the retention period.

    Raises:
        ConfigError: ``retention_hours`` is below the table's retention and ``force`` is off.
    """
    table = open_table(uri, storage_options)
    minimum = retention(table)
    min_hours = math.ceil(minimum.total_seconds() / 3600)
    hours = min_hours if retention_hours is None else retention_hours
    if hours < 0:
        raise ConfigError("--retention-hours must be 0 or more")
    if hours < minimum.total_seconds() / 3600 and not force:
        raise ConfigError(
            f"retention of {hours} h is below the table's minimum of {min_hours} h "
            "(delta.deletedFileRetentionDuration, 7 days unless set): readers or streams still "
            "on older versions would lose files. Use --retention-hours "
            f"{min_hours} or more, or --force if nothing reads older versions",
            table_uri=normalize_uri(uri),
        )
    files = table.vacuum(retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False, full=full)
    staging = _vacuum_staging(uri, storage_options or {}, hours, dry_run) if full else []
    result = VacuumResult(normalize_uri(uri), dry_run, hours, full, sorted(files), staging)
    logger.info(
        "vacuum of %s%s: %d file(s)%s",
        result.table_uri,
        " (dry run)" if dry_run else "",
        len(files) + len(staging),
        " would be deleted" if dry_run else " deleted",
    )
    return result


def _vacuum_staging(uri: str, storage_options: Mapping[str, str], hours: int, dry_run: bool) -> list[str]:
    """Staging files of crashed ``write_path=spark`` batches older than ``hours``."""
    import pyarrow.fs as pafs

    fs, root = filesystem(normalize_uri(uri), storage_options)
    base = join(root, STAGING_DIR)
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except (OSError, FileNotFoundError):
        return []
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)
    old = []
    for info in infos:
        if info.type != pafs.FileType.File or info.mtime is None:
            continue
        mtime = info.mtime if info.mtime.tzinfo else info.mtime.replace(tzinfo=dt.UTC)
        if mtime <= cutoff:
            old.append(info.path)
    if not dry_run:
        for path in old:
            fs.delete_file(path)
    return sorted(p[len(root) :].lstrip("/") for p in old)


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


def properties(
    uri: str,
    *,
    set_: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Set table properties (``delta.*`` keys are checked by delta-rs); return them all.

    Raises:
        ConfigError: an unknown ``delta.*`` key or bad value, or an ``unset`` (delta-rs 1.x
            has no operation that removes a property).
    """
    if unset:
        raise ConfigError(
            f"cannot unset {', '.join(unset)}: delta-rs (the library deltaflow commits with) has no "
            "operation that removes a table property. Set it to its default value instead, e.g. "
            "`deltaflow properties TABLE set delta.logRetentionDuration='interval 30 days'`",
        )
    table = open_table(uri, storage_options)
    if set_:
        try:
            # delta-rs checks delta.* keys only when told to, and then refuses every user key.
            delta_keys = {k: v for k, v in set_.items() if k.startswith("delta.")}
            user_keys = {k: v for k, v in set_.items() if not k.startswith("delta.")}
            for keys, strict in ((delta_keys, True), (user_keys, False)):
                if keys:
                    _set_properties(uri, storage_options or {}, keys, strict=strict)
        except DeltaflowError:
            raise
        except Exception as exc:  # noqa: BLE001 - delta-rs reports bad keys/values as generic errors
            raise ConfigError(f"cannot set {dict(set_)} on {normalize_uri(uri)!r}: {exc}") from None
        table = open_table(uri, storage_options)
    return dict(table.metadata().configuration)


def _set_properties(
    uri: str, storage_options: Mapping[str, str], keys: Mapping[str, str], *, strict: bool
) -> None:
    from deltaflow.delta import commit

    def attempt(table: DeltaTable | None, props: CommitProperties) -> None:
        assert table is not None
        table.alter.set_table_properties(dict(keys), raise_if_not_exists=strict, commit_properties=props)

    def already_set(table: DeltaTable | None) -> bool:
        config = table.metadata().configuration if table is not None else {}
        return all(config.get(k) == v for k, v in keys.items())

    commit.commit(
        normalize_uri(uri),
        storage_options,
        attempt,
        what=f"setting properties of {normalize_uri(uri)}",
        metadata={"deltaflow.operation": "set properties"},
        already_done=already_set,
    )


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
        raise ConfigError(f"cannot read {normalize_uri(uri)!r} with {sql!r}: {exc}") from None
    return _plain_types(pa.table(reader.read_all()))


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
    try:
        reader = table.load_cdf(starting_version=from_version, ending_version=to_version)
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"cannot read the changes of {normalize_uri(uri)!r}: {exc}") from None
    out = pa.table(reader.read_all())
    if limit is not None:
        out = out.slice(0, limit)
    return _plain_types(out)


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
