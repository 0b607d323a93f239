"""Delta Lake's own Spark option names, translated into deltaflow's.

Jobs written against delta-spark pass ``format("delta")`` options such as ``ignoreDeletes``,
``startingVersion``, ``txnAppId`` or ``mergeSchema``. When deltaflow serves the ``delta`` format
(no delta-spark on the classpath), these functions turn them into the options of deltaflow's Delta
source and sink. Spark hands data-source options over with lower-cased keys; both spellings are
accepted here.

Every option is either translated, or refused with a message naming it: an option Delta knows and
deltaflow cannot honour says why; an unknown one (a typo such as ``txAppId``) lists the options of
that kind of read or write. Nothing is silently ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from deltaflow.errors import ConfigError

__all__ = [
    "DEFAULT_MAX_FILES_PER_TRIGGER",
    "batch_read_options",
    "batch_write_options",
    "stream_read_options",
    "stream_write_options",
]

#: Delta's default for ``maxFilesPerTrigger`` when neither limit is given.
DEFAULT_MAX_FILES_PER_TRIGGER = 1000

_Convert = Callable[[str, str], Any]


def _bool(name: str, value: str) -> bool:
    lowered = str(value).strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise ConfigError(f"option {name}: must be true or false (received {value!r})")


def _int(name: str, value: str) -> int:
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"option {name}: must be a whole number (received {value!r})") from None
    if number < 0:
        raise ConfigError(f"option {name}: must not be negative (received {value!r})")
    return number


def _positive(name: str, value: str) -> int:
    number = _int(name, value)
    if number == 0:
        raise ConfigError(f"option {name}: must be at least 1 (received {value!r})")
    return number


_SIZE_UNITS = {"b": 1, "k": 1024, "kb": 1024, "m": 1024**2, "mb": 1024**2, "g": 1024**3, "gb": 1024**3}


def _bytes(name: str, value: str) -> int:
    """``1048576``, ``10m``, ``1g``, ``512kb`` (Spark's byte strings)."""
    text = str(value).strip().lower()
    digits = text.rstrip("bkmg")
    unit = text[len(digits) :] or "b"
    if not digits.isdigit() or unit not in _SIZE_UNITS or int(digits) == 0:
        raise ConfigError(
            f"option {name}: must be a size such as 1048576, 512k, 10m or 1g (received {value!r})"
        )
    return int(digits) * _SIZE_UNITS[unit]


def _starting_version(name: str, value: str) -> Any:
    if str(value).strip().lower() == "latest":
        return "latest"
    return _int(name, value)


def _text(_name: str, value: str) -> str:
    return str(value)


def _columns(name: str, value: str) -> tuple[str, ...]:
    """A JSON list (what deltaflow's writer shim passes) or a comma-separated list."""
    text = str(value).strip()
    if text.startswith("["):
        try:
            return tuple(str(c) for c in json.loads(text))
        except json.JSONDecodeError:
            raise ConfigError(
                f"option {name}: not a JSON list of column names (received {value!r})"
            ) from None
    return tuple(c.strip() for c in text.split(",") if c.strip())


# Delta's name -> (deltaflow's name, converter), one table per kind of access. ``None`` as the
# deltaflow name: accepted and consumed here (Spark's own options).
_SPARK_OWNED: dict[str, tuple[str | None, _Convert]] = {"path": ("table_uri", _text)}

_STREAM_READ: dict[str, tuple[str | None, _Convert]] = {
    **_SPARK_OWNED,
    "ignoreDeletes": ("ignore_deletes", _bool),
    "ignoreChanges": ("ignore_changes", _bool),
    "skipChangeCommits": ("skip_change_commits", _bool),
    "startingVersion": ("starting_version", _starting_version),
    "startingTimestamp": ("starting_timestamp", _text),
    "maxFilesPerTrigger": ("max_files_per_trigger", _positive),
    "maxBytesPerTrigger": ("max_bytes_per_trigger", _bytes),
    "readChangeFeed": ("read_change_feed", _bool),
    "readChangeData": ("read_change_feed", _bool),
}

_BATCH_READ: dict[str, tuple[str | None, _Convert]] = {
    **_SPARK_OWNED,
    "versionAsOf": ("version_as_of", _int),
    "timestampAsOf": ("timestamp_as_of", _text),
    "readChangeFeed": ("read_change_feed", _bool),
    "readChangeData": ("read_change_feed", _bool),
    "startingVersion": ("starting_version", _int),
    "endingVersion": ("ending_version", _int),
    "startingTimestamp": ("starting_timestamp", _text),
    "endingTimestamp": ("ending_timestamp", _text),
}

_WRITE_COMMON: dict[str, tuple[str | None, _Convert]] = {
    **_SPARK_OWNED,
    "mergeSchema": ("merge_schema", _bool),
    "userMetadata": ("user_metadata", _text),
    "partitionBy": ("partition_columns", _columns),
    "__partition_columns": ("partition_columns", _columns),
    "compression": ("compression", _text),
    "maxRecordsPerFile": ("max_records_per_file", _int),
}

_BATCH_WRITE: dict[str, tuple[str | None, _Convert]] = {
    **_WRITE_COMMON,
    "txnAppId": ("txn_app_id", _text),
    "txnVersion": ("txn_version", _int),
    "overwriteSchema": ("overwrite_schema", _bool),
    "replaceWhere": ("replace_where", _text),
    "saveMode": ("save_mode", _text),  # set by deltaflow's writer shim: errorifexists / ignore
}

_STREAM_WRITE: dict[str, tuple[str | None, _Convert]] = {
    **_WRITE_COMMON,
    "checkpointLocation": ("checkpoint_location", _text),
    "queryName": (None, _text),
}

# Options Delta has that deltaflow does not honour, with the reason.
_UNSUPPORTED = {
    "withEventTimeOrder": (
        "deltaflow's Delta source reads the initial snapshot in file order, not bucketed by event "
        "time; remove the option (a watermark then may drop late rows of the snapshot) or read the "
        "table with delta-spark"
    ),
    "excludeRegex": "deltaflow's Delta source reads every data file of a commit",
    "schemaTrackingLocation": (
        "deltaflow's Delta source does not track non-additive schema changes; a new column "
        "restarts the query instead"
    ),
    "dataChange": "deltaflow writes only data changes (dataChange=true)",
    "partitionOverwriteMode": "dynamic partition overwrite is not supported; use replaceWhere",
    "txnAppId": "a streaming write's txn is the query's id (as delta-spark's sink does)",
    "txnVersion": "a streaming write's txn version is the micro-batch id (as delta-spark's sink does)",
    "optimizeWrite": "deltaflow's writer sizes files by target_file_size_mb instead",
}

_SUGGEST = {"txappid": "txnAppId", "txversion": "txnVersion", "txnid": "txnAppId"}


def _translate(
    options: Mapping[str, str], table: Mapping[str, tuple[str | None, _Convert]], what: str
) -> dict[str, Any]:
    by_lower = {name.lower(): (name, entry) for name, entry in table.items()}
    unsupported = {name.lower(): (name, why) for name, why in _UNSUPPORTED.items()}
    out: dict[str, Any] = {}
    refused: list[str] = []
    for key, value in options.items():
        lowered = key.lower()
        if lowered in by_lower:
            name, (target, convert) = by_lower[lowered]
            converted = convert(name, value)
            if target is not None:
                out[target] = converted
        elif lowered in unsupported:
            name, why = unsupported[lowered]
            refused.append(f"{name}: not supported by {what}: {why}")
        else:
            hint = f" (did you mean {_SUGGEST[lowered]}?)" if lowered in _SUGGEST else ""
            refused.append(f"{key}: unknown option{hint}")
    if refused:
        known = ", ".join(
            sorted(n for n, (t, _) in table.items() if not n.startswith("__") and n != "saveMode")
        )
        raise ConfigError(
            f"format('delta') served by deltaflow ({what}) refused option(s): "
            + "; ".join(refused)
            + f". Options of {what}: {known}"
        )
    if "table_uri" not in out:
        raise ConfigError(
            f"format('delta') ({what}) needs the table's path: .load(path), .save(path) or .start(path)"
        )
    return out


def stream_read_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``spark.readStream.format("delta")`` options as the Delta source's (``deltaflow-delta``).

    Delta's default ``maxFilesPerTrigger`` (1000) applies when neither limit is given."""
    out = _translate(options, _STREAM_READ, "a streaming read")
    if "max_files_per_trigger" not in out and "max_bytes_per_trigger" not in out:
        out["max_files_per_trigger"] = DEFAULT_MAX_FILES_PER_TRIGGER
    if out.get("starting_version") is not None and out.get("starting_timestamp") is not None:
        raise ConfigError("startingVersion and startingTimestamp cannot both be given: choose one")
    return out


def batch_read_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``spark.read.format("delta")`` options: time travel and batch Change Data Feed."""
    out = _translate(options, _BATCH_READ, "a batch read")
    if out.get("version_as_of") is not None and out.get("timestamp_as_of") is not None:
        raise ConfigError("versionAsOf and timestampAsOf cannot both be given: choose one")
    cdf_only = {
        "starting_version": "startingVersion",
        "ending_version": "endingVersion",
        "starting_timestamp": "startingTimestamp",
        "ending_timestamp": "endingTimestamp",
    }
    if not out.get("read_change_feed"):
        given = [delta_name for k, delta_name in cdf_only.items() if k in out]
        if given:
            raise ConfigError(
                f"{', '.join(given)} apply to batch reads of the Change Data Feed only: add "
                ".option('readChangeFeed', 'true'), or use versionAsOf/timestampAsOf for time travel"
            )
    else:
        if "starting_version" not in out and "starting_timestamp" not in out:
            raise ConfigError(
                "a batch read of the Change Data Feed needs startingVersion or startingTimestamp"
            )
        if out.get("version_as_of") is not None or out.get("timestamp_as_of") is not None:
            raise ConfigError(
                "readChangeFeed reads a range of versions: versionAsOf/timestampAsOf do not apply"
            )
    return out


def batch_write_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``df.write.format("delta")`` options."""
    out = _translate(options, _BATCH_WRITE, "a batch write")
    if ("txn_app_id" in out) != ("txn_version" in out):
        raise ConfigError("txnAppId and txnVersion make a write idempotent together: give both or neither")
    return out


def stream_write_options(options: Mapping[str, str]) -> dict[str, Any]:
    """``df.writeStream.format("delta")`` options."""
    return _translate(options, _STREAM_WRITE, "a streaming write")
