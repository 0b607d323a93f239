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

from deltaflow.config.pipeline import PipelineFile, _problems, _substitute
from deltaflow.errors import PipelineConfigError

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
    problems: list[str] = []
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
        pipelines.append(_pipeline(sources[0], target, query))
    if problems:
        raise PipelineConfigError(name, problems)
    substituted = _substitute({"pipelines": pipelines}, env, "", problems)
    if problems:
        raise PipelineConfigError(name, problems)
    try:
        return PipelineFile.model_validate(substituted)
    except ValidationError as exc:
        raise PipelineConfigError(name, _problems(exc, substituted)) from None


def _pipeline(source: _Table, target: _Table, query: str) -> dict[str, Any]:
    sink = dict(target.options)
    spec: dict[str, Any] = {k: sink.pop(k) for k in _PIPELINE_KEYS if k in sink}
    spec["pipeline_id"] = spec.pop("pipeline_id", None) or f"{source.name}-to-{target.name}"
    sink.pop("format", None)  # 'parquet', as Arroyo requires it; Delta data files are Parquet
    if "path" in sink:
        sink["table_uri"] = sink.pop("path")
    if "partition_fields" in sink:
        sink["partition_columns"] = sink.pop("partition_fields")
    src = dict(source.options)
    src["type"] = source.connector
    if source.connector == "delta" and "path" in src:
        src["table_uri"] = src.pop("path")
    if source.columns:
        if source.connector not in ("kafka", "files"):
            raise PipelineConfigError(
                "<sql>", [f"{source.where}: a column list is the schema of kafka or files sources"]
            )
        src["schema"] = source.columns
    spec.update(source=src, query=query, source_name=source.name, sinks=[{"name": target.name, **sink}])
    return spec


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
