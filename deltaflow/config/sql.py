"""The SQL form of a pipeline file (``deltaflow sql FILE.sql``), as Arroyo writes pipelines::

    CREATE TABLE clicks (id BIGINT, page STRING, ts TIMESTAMP) WITH (
        connector = 'kafka', bootstrap_servers = 'localhost:9092', topic = 'clicks', format = 'json'
    );
    CREATE TABLE pages WITH (connector = 'delta', path = '/lake/pages', partition_columns = 'day');
    INSERT INTO pages SELECT id, page, to_date(ts) AS day FROM clicks WHERE page IS NOT NULL;

Every ``CREATE TABLE`` declares a connector (``kafka``, ``files``/``filesystem``, ``delta``,
``generator``) with its options (the YAML keys; ``path`` is the table or folder); a column list
is the schema of a ``kafka`` or ``files`` source. Every ``INSERT INTO <delta table> SELECT ...
FROM <table>`` becomes one pipeline whose ``query`` is the SELECT, run on each micro-batch.
Pipeline keys (``pipeline_id``, ``trigger_interval``, ``checkpoint_location``) go in the target's
WITH list; the id defaults to ``<source>-to-<target>``. ``${VAR}`` works as in YAML files.

A delta target also takes Arroyo's Delta sink options, its older flat names and its newer dotted
ones (:data:`ARROYO_SINK_KEYS` says what each becomes): time and field partitioning,
``shuffle_by_partition``, the rolling policy, ``storage.*`` and the keys deltaflow accepts
without an effect, each explained by a note ``deltaflow sql --validate`` prints. An option no
connector knows is refused with the list of those it knows.

The statements are split and read here, not by a SQL parser library: sqlglot (30.30, tried on
these files) parses them, but turns option keys that are SQL keywords (``format``,
``location``, ``comment``, ``engine``, ``partitioned_by``) into its own properties and rejects
Arroyo's dotted keys (``source.offset = 'latest'``). The SELECT itself is Spark's to parse.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from deltaflow.config.pipeline import (
    _PIPELINE_OWNED,
    DeltaSourceSpec,
    FilesSourceSpec,
    GeneratorSourceSpec,
    KafkaSourceSpec,
    PipelineFile,
    SinkSpec,
    _problems,
    _substitute,
)
from deltaflow.config.units import parse_seconds, parse_size
from deltaflow.errors import ConfigError, PipelineConfigError

__all__ = ["load_sql", "parse_sql"]

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_CREATE = re.compile(rf"^CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?({_NAME})\s*", re.IGNORECASE)
_INSERT = re.compile(rf"^INSERT\s+INTO\s+({_NAME})\s+(SELECT\b.*)$", re.IGNORECASE | re.DOTALL)
#: SQL type names Spark's DDL parser does not know, and what they mean.
_TYPE_ALIASES = [
    (re.compile(r"\b(?:TEXT|VARCHAR\s*(?:\(\s*\d+\s*\))?|CHAR\s*\(\s*\d+\s*\))", re.I), "STRING"),
    (re.compile(r"\bDOUBLE\s+PRECISION\b", re.I), "DOUBLE"),
    (re.compile(r"\bTIMESTAMPTZ\b", re.I), "TIMESTAMP"),
    (re.compile(r"\bBYTEA\b", re.I), "BINARY"),
]
#: The tables a query reads: names after FROM or JOIN (quoted text removed first).
_FROM = re.compile(rf"\b(?:FROM|JOIN)\s+({_NAME})\b", re.IGNORECASE)
_QUOTED = re.compile(r"'(?:[^']|'')*'")
_CONNECTORS = {
    "kafka": "kafka",
    "files": "files",
    "filesystem": "files",
    "delta": "delta",
    "generator": "generator",
}
_PIPELINE_KEYS = ("pipeline_id", "trigger_interval", "checkpoint_location")
_SOURCE_MODELS = {
    "kafka": KafkaSourceSpec,
    "files": FilesSourceSpec,
    "generator": GeneratorSourceSpec,
    "delta": DeltaSourceSpec,
}
#: Keys every table takes: Arroyo's ``type`` ('source'/'sink', seen from the statements) and
#: ``path`` (the folder or table). Sources also take Arroyo's ``event_time_field``: the default
#: ``event_time_column`` of the delta targets reading them.
_COMMON_KEYS = frozenset({"type", "path"})

#: Arroyo's Delta sink options (older flat names, then the newer dotted ones) and what each
#: becomes in deltaflow: a sink or pipeline key, or ``None`` for a key accepted without an effect
#: (the note printed by ``--validate`` says why). ``storage.<key>`` becomes ``storage_options``.
ARROYO_SINK_KEYS: dict[str, str | None] = {
    "format": None,  # 'parquet' only: Delta data files are Parquet
    "partition_fields": "partition_columns",
    "partitioning.fields": "partition_columns",
    "time_partition_pattern": "time_partition_pattern",
    "partitioning.time_pattern": "time_partition_pattern",
    "shuffle_by_partition": "shuffle_by_partition",
    "shuffle_by_partition.enabled": "shuffle_by_partition",
    "event_time_field": "event_time_column",
    "rollover_seconds": "trigger_interval",
    "rolling_policy.interval": "trigger_interval",
    "target_file_size": "target_file_size_mb",
    "rolling_policy.file_size": "target_file_size_mb",
    "parquet_compression": "compression",
    "inactivity_rollover_seconds": None,
    "rolling_policy.inactivity_interval": None,
    "max_parts": None,
    "multipart.max_parts": None,
    "target_part_size": None,
    "multipart.target_part_size": None,
    "filename.prefix": None,
    "filename.suffix": None,
    "filename.strategy": None,
    "parquet_row_group_size": None,
    "parquet_row_batch_size": None,
}
_WHY_NO_EFFECT = {
    "inactivity_rollover_seconds": "no file stays open between micro-batches: each batch's files "
    "are closed and committed when the batch ends, so an idle stream holds nothing unflushed",
    "max_parts": "uploads are written by pyarrow's filesystem (multipart by its own sizes) or by "
    "Spark's writer, not in parts deltaflow sizes",
    "filename": "deltaflow names data files part-b<batch>-<task>-...parquet (a replayed batch's "
    "leftovers are found by that name); names are unique per batch and task",
    "parquet_row": "row groups are the Parquet writer's (Spark's, or pyarrow's buffered to large row groups)",
}
_NO_EFFECT_REASON = {
    "inactivity_rollover_seconds": "inactivity_rollover_seconds",
    "rolling_policy.inactivity_interval": "inactivity_rollover_seconds",
    "max_parts": "max_parts",
    "multipart.max_parts": "max_parts",
    "target_part_size": "max_parts",
    "multipart.target_part_size": "max_parts",
    "filename.prefix": "filename",
    "filename.suffix": "filename",
    "filename.strategy": "filename",
    "parquet_row_group_size": "parquet_row",
    "parquet_row_batch_size": "parquet_row",
}
_FILENAME_STRATEGIES = ("serial", "uuid", "uuidv7", "ulid")
_PARQUET_COMPRESSION = {"uncompressed": "none"}
#: Sink keys a SQL target may set (those a pipeline sets itself excluded).
_SINK_KEYS = (
    frozenset(SinkSpec.model_fields)
    - {"name", "connector", "stream", "table_uri", "writer_epoch"}
    - set(_PIPELINE_OWNED)
)
_DELTA_SINK_KEYS = _SINK_KEYS | set(_PIPELINE_KEYS) | set(ARROYO_SINK_KEYS) | _COMMON_KEYS


@dataclass
class _Table:
    name: str
    connector: str
    options: dict[str, Any]
    columns: str | None
    where: str


def load_sql(path: str | Path, env: Mapping[str, str] | None = None) -> PipelineFile:
    """Read and validate a SQL pipeline file; problems are reported as for YAML files."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise PipelineConfigError(str(path), [f"cannot read the file: {exc.strerror or exc}"]) from None
    return parse_sql(text, env if env is not None else os.environ, name=str(path))


def parse_sql(text: str, env: Mapping[str, str], *, name: str = "<sql>") -> PipelineFile:
    """Parse and validate the statements of a SQL pipeline file.

    Raises:
        PipelineConfigError: every problem found, each naming its statement.
    """
    problems: list[str] = []
    notes: list[str] = []
    tables: dict[str, _Table] = {}
    inserts: list[tuple[str, str, str]] = []
    for number, statement in enumerate(_statements(_strip_comments(text)), start=1):
        where = f"statement {number}"
        if (m := _CREATE.match(statement)) is not None:
            table = _create(m.group(1), statement[m.end() :], where, problems)
            if table is None:
                continue
            if table.name.lower() in tables:
                problems.append(f"{where}: table {table.name} is declared twice")
            tables[table.name.lower()] = table
        elif (m := _INSERT.match(statement)) is not None:
            inserts.append((m.group(1), m.group(2).strip(), where))
        else:
            head = " ".join(statement.split()[:3])
            problems.append(
                f"{where}: expected CREATE TABLE ... WITH (...) or INSERT INTO ... SELECT, got {head!r}"
            )
    if not inserts and not problems:
        problems.append("no INSERT INTO ... SELECT statement: nothing would run")
    pipelines: list[dict[str, Any]] = []
    for target_name, query, where in inserts:
        target = tables.get(target_name.lower())
        if target is None:
            problems.append(f"{where}: INSERT INTO {target_name}: no CREATE TABLE {target_name} above")
            continue
        if target.connector != "delta":
            problems.append(
                f"{where}: INSERT INTO {target_name}: only delta tables are written "
                f"(it is {target.connector})"
            )
            continue
        read = {n.lower() for n in _FROM.findall(_QUOTED.sub("''", query))}
        sources = [t for t in tables.values() if t is not target and t.name.lower() in read]
        if len(sources) != 1:
            found = ", ".join(t.name for t in sources) or "none"
            problems.append(
                f"{where}: the SELECT must read exactly one declared table (found: {found}); joins of "
                "several streams are not supported"
            )
            continue
        before = len(problems)
        pipeline = _pipeline(sources[0], target, query, problems, notes)
        if len(problems) == before:
            pipelines.append(pipeline)
    if problems:
        raise PipelineConfigError(name, problems)
    substituted = _substitute({"pipelines": pipelines}, env, "", problems)
    if problems:
        raise PipelineConfigError(name, problems)
    try:
        file = PipelineFile.model_validate(substituted)
    except ValidationError as exc:
        raise PipelineConfigError(name, _problems(exc, substituted)) from None
    file._notes = notes
    return file


def _pipeline(
    source: _Table, target: _Table, query: str, problems: list[str], notes: list[str]
) -> dict[str, Any]:
    sink = _delta_sink(target, problems, notes)
    spec: dict[str, Any] = {k: sink.pop(k) for k in _PIPELINE_KEYS if k in sink}
    spec["pipeline_id"] = spec.pop("pipeline_id", None) or f"{source.name}-to-{target.name}"
    src = dict(source.options)
    event_time = src.pop("event_time_field", None)
    if event_time is not None and sink.get("time_partition_pattern"):
        sink.setdefault("event_time_column", event_time)
    model = _SOURCE_MODELS[source.connector]
    known = _COMMON_KEYS | {"event_time_field"} | _field_names(model)
    _unknown(source, set(src) - known - {"event_time_field"}, known, problems)
    src["type"] = source.connector
    if source.connector == "delta" and "path" in src:
        src["table_uri"] = src.pop("path")
    if source.columns:
        if source.connector not in ("kafka", "files"):
            problems.append(f"{source.where}: a column list is the schema of kafka or files sources")
        src["schema"] = source.columns
    spec.update(source=src, query=query, source_name=source.name, sinks=[{"name": target.name, **sink}])
    return spec


def _delta_sink(target: _Table, problems: list[str], notes: list[str]) -> dict[str, Any]:
    """The sink (and pipeline) keys of a delta target's WITH list, Arroyo's names translated."""
    where = f"{target.where}: table {target.name}"
    options = dict(target.options)
    storage = {k.partition(".")[2]: str(options.pop(k)) for k in list(options) if k.startswith("storage.")}
    _unknown(target, set(options) - _DELTA_SINK_KEYS, _DELTA_SINK_KEYS | {"storage.<key>"}, problems)
    sink: dict[str, Any] = {}
    for key, value in options.items():
        if key == "path":
            sink["table_uri"] = value
        elif key == "format":
            if str(value).lower() != "parquet":
                problems.append(
                    f"{where}: format {value!r}: a Delta table's data files are Parquet (format = 'parquet')"
                )
        elif key in _NO_EFFECT_REASON:
            problem = _check_no_effect(key, value)
            if problem:
                problems.append(f"{where}: {key} = {value!r}: {problem}")
            else:
                why = _WHY_NO_EFFECT[_NO_EFFECT_REASON[key]]
                notes.append(f"{target.name}: {key} = {value!r} has no effect: {why}")
        elif key in ARROYO_SINK_KEYS:
            name = ARROYO_SINK_KEYS[key]
            assert name is not None
            try:
                converted = _convert(key, value)
            except (ValueError, ConfigError) as exc:
                problems.append(f"{where}: {key} = {value!r}: {exc}")
                continue
            if name in sink and not _same(name, sink[name], converted):
                problems.append(f"{where}: {key} and another key both set {name}, to different values")
            sink[name] = converted
        elif key in sink and not _same(key, sink[key], value):
            problems.append(f"{where}: {key} is set twice (once by an Arroyo option), to different values")
        else:
            sink[key] = value
    if storage:
        # object_store's name for the endpoint; deltaflow's executors read aws_endpoint_url.
        if "aws_endpoint" in storage:
            storage.setdefault("aws_endpoint_url", storage.pop("aws_endpoint"))
        if isinstance(sink.get("storage_options"), Mapping):
            storage = {**sink["storage_options"], **storage}
        sink["storage_options"] = storage
    return sink


def _same(name: str, a: Any, b: Any) -> bool:
    """Whether two values of one sink or pipeline key mean the same (``'60 seconds'`` and
    ``60``, ``'a,b'`` and ``['a', 'b']``)."""

    def normal(value: Any) -> Any:
        try:
            if name == "trigger_interval":
                return parse_seconds(value)
            if name == "partition_columns":
                items = value.split(",") if isinstance(value, str) else value
                return tuple(str(v).strip() for v in items)
        except (ValueError, TypeError):
            pass
        return value

    return bool(normal(a) == normal(b))


def _convert(key: str, value: Any) -> Any:
    """An Arroyo option's value in deltaflow's terms."""
    if key == "rollover_seconds" or key == "rolling_policy.interval":
        seconds = parse_seconds(value)
        if seconds <= 0:
            raise ValueError("must be a positive duration")
        return seconds
    if key in ("target_file_size", "rolling_policy.file_size"):
        size = parse_size(value if isinstance(value, int) else str(value))
        if size <= 0:
            raise ValueError("must be a positive size")
        return max(1, -(-size // (1024 * 1024)))  # whole MiB, rounded up
    if key == "parquet_compression":
        text = str(value).lower()
        return _PARQUET_COMPRESSION.get(text, text)
    return value


def _check_no_effect(key: str, value: Any) -> str | None:
    """Why the value of a key without an effect is still wrong (None: it is fine)."""
    if key == "filename.strategy":
        if str(value).lower() not in _FILENAME_STRATEGIES:
            return f"must be one of {', '.join(_FILENAME_STRATEGIES)}"
        return None
    if key.startswith("filename."):
        return None
    if "inactivity" in key:
        try:
            ok = parse_seconds(value) > 0
        except ValueError:
            ok = False
        return None if ok else "must be a positive duration"
    try:
        size = parse_size(value if isinstance(value, int) else str(value))
    except ConfigError:
        size = 0
    return None if size > 0 else "must be a positive number"


def _field_names(model: type[Any]) -> set[str]:
    names = set()
    for name, field in model.model_fields.items():
        names.add(field.alias or name)
    return names - {"type"}


def _unknown(table: _Table, unknown: set[str], known: set[str] | frozenset[str], problems: list[str]) -> None:
    import difflib

    for key in sorted(unknown):
        close = difflib.get_close_matches(key, sorted(known), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(
            f"{table.where}: table {table.name}: unknown option {key!r} for the {table.connector} "
            f"connector{hint}; it knows: {', '.join(sorted(known))}"
        )


def _create(name: str, rest: str, where: str, problems: list[str]) -> _Table | None:
    columns = None
    rest = rest.strip()
    if rest.startswith("("):
        inner, rest = _parenthesised(rest)
        columns = _spark_types(inner.strip())
        rest = rest.strip()
    m = re.match(r"^WITH\s*", rest, re.IGNORECASE)
    if m is None or not rest[m.end() :].startswith("("):
        problems.append(f"{where}: CREATE TABLE {name} needs WITH (connector = '...', ...)")
        return None
    inner, rest = _parenthesised(rest[m.end() :])
    if rest.strip():
        problems.append(f"{where}: unexpected text after the WITH list of {name}: {rest.strip()[:40]!r}")
    options: dict[str, Any] = {}
    for item in _split(inner, ","):
        key, sep, value = item.partition("=")
        key = key.strip().strip("'\"`")
        if not sep or not key:
            problems.append(f"{where}: option {item.strip()!r} of {name} must be key = 'value'")
            continue
        options[key] = _value(value.strip())
    connector = str(options.pop("connector", "")).lower()
    options.pop("type", None)  # Arroyo's 'source'/'sink': deltaflow sees it from the statements
    if connector not in _CONNECTORS:
        problems.append(
            f"{where}: table {name}: connector must be one of {', '.join(sorted(_CONNECTORS))} "
            f"(got {connector!r})"
        )
        return None
    return _Table(name, _CONNECTORS[connector], options, columns, where)


def _value(text: str) -> Any:
    if text.startswith("[") and text.endswith("]"):
        return [_value(v.strip()) for v in _split(text[1:-1], ",") if v.strip()]
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1].replace(text[0] * 2, text[0])
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*", text):
        return float(text)
    return text


def _spark_types(columns: str) -> str:
    for pattern, replacement in _TYPE_ALIASES:
        columns = pattern.sub(replacement, columns)
    return " ".join(columns.split())


def _parenthesised(text: str) -> tuple[str, str]:
    """The content of the parenthesis ``text`` starts with, and what follows it."""
    depth, quote = 0, ""
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return text[1:i], text[i + 1 :]
    if quote == "'":
        raise PipelineConfigError(
            "<sql>",
            [
                f"unterminated string in {text[:60]!r}: a quote inside a string is written twice "
                "('it''s'); a backslash does not escape it"
            ],
        )
    raise PipelineConfigError("<sql>", [f"unbalanced parentheses in {text[:60]!r}"])


def _split(text: str, sep: str, brackets: str = "([<") -> list[str]:
    """Split at ``sep`` outside quotes and (unless ``brackets`` is empty) brackets."""
    closing = {"(": ")", "[": "]", "<": ">"}
    opened, closed = set(brackets), {closing[b] for b in brackets}
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"`":
            quote = ch
        elif ch in opened:
            depth += 1
        elif ch in closed:
            depth -= 1
        elif ch == sep and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p.strip()]


def _strip_comments(text: str) -> str:
    out, i, quote = [], 0, ""
    while i < len(text):
        ch = text[i]
        if quote:
            out.append(ch)
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif text.startswith("--", i):
            i = text.find("\n", i)
            if i < 0:
                break
            continue
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = len(text) if end < 0 else end + 2
            out.append(" ")  # a comment separates tokens
            continue
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _statements(text: str) -> list[str]:
    # SQL compares with < and >: only quotes matter between statements.
    return [part.strip() for part in _split(text, ";", brackets="")]
