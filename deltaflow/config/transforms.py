"""kafka-delta-ingest style transforms: the language, parsed and checked without Spark.

A transform is ``"target: source"``. ``target`` is a dotted column path (nested structs are
created as needed). ``source`` is, as in kafka-delta-ingest, a JMESPath expression
(https://jmespath.org) over the decoded message, with its custom functions:

* ``substr(s, `skip`, `take`)``: ``take`` characters of ``s`` from the ``skip``-th
  (kafka-delta-ingest counts ``take`` characters, it is no end index: ``substr(name, `3`, `4`)``
  of ``William`` is ``liam``);
* ``epoch_seconds_to_iso8601(n)``, ``epoch_millis_to_iso8601(n)``, ``epoch_micros_to_iso8601(n)``:
  ``n`` truncated to a whole number of its unit, as ISO-8601 UTC (``2021-07-20T23:18:18Z``,
  fractional digits only when not zero: ``.123Z``, ``.123456Z``);
* ``epoch_millis_to_micro(n)``: ``n`` truncated to whole milliseconds, times 1000;

and ``kafka.partition``, ``kafka.offset``, ``kafka.topic``, ``kafka.timestamp`` (microseconds
since the epoch: the instant in a timestamp column), ``kafka.timestamp_type`` (-1 not
available, 0 create time, 1 log-append time, Kafka's ids), plus deltaflow's ``kafka.key``
(UTF-8 text) and ``kafka.headers``, readable anywhere in an expression. Deltaflow adds
``sql: <Spark SQL expression>`` (Spark engine only).

How a transform runs lives with the engine: field paths and the custom functions over a field
path are compiled to Arrow compute (:mod:`deltaflow.io.arrow_transforms`) or Spark columns
(:mod:`deltaflow.pipeline.transforms`); every other expression is evaluated per message by the
``jmespath`` library (:mod:`deltaflow.io.jmespath_eval`), on both engines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from deltaflow.errors import ConfigError

__all__ = ["CUSTOM_FUNCTIONS", "KAFKA_FIELDS", "EpochUnit", "Transform", "parse_transform"]

KAFKA_FIELDS = ("partition", "offset", "topic", "timestamp", "timestamp_type", "key", "headers")
#: kafka-delta-ingest's functions, registered beside JMESPath's built-in ones.
CUSTOM_FUNCTIONS = (
    "substr",
    "epoch_seconds_to_iso8601",
    "epoch_millis_to_iso8601",
    "epoch_micros_to_iso8601",
    "epoch_millis_to_micro",
)
_BUILTIN_FUNCTIONS = (
    "abs",
    "avg",
    "ceil",
    "contains",
    "ends_with",
    "floor",
    "join",
    "keys",
    "length",
    "map",
    "max",
    "max_by",
    "merge",
    "min",
    "min_by",
    "not_null",
    "reverse",
    "sort",
    "sort_by",
    "starts_with",
    "sum",
    "to_array",
    "to_number",
    "to_string",
    "type",
    "values",
)
EpochUnit = Literal["seconds", "millis", "micros", "millis_to_micro"]
_EPOCH_FUNCTIONS: dict[str, EpochUnit] = {
    "epoch_seconds_to_iso8601": "seconds",
    "epoch_millis_to_iso8601": "millis",
    "epoch_micros_to_iso8601": "micros",
    "epoch_millis_to_micro": "millis_to_micro",
}

_TARGET = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*$")
#: deltaflow's older spelling ``substr(path, 0, 4)`` (numbers without JMESPath's backticks).
_BARE_SUBSTR = re.compile(r"^substr\(\s*([^,]+?)\s*,\s*(\d+)\s*,\s*(\d+)\s*\)$")
#: ``kafka.<field>`` anywhere in a ``sql:`` source (backticks allowed), and ``kafka`` on its own.
_KAFKA_FIELD = re.compile(r"(?<![\w.`])`?kafka`?\s*\.\s*`?(\w+)", re.IGNORECASE)
_WHOLE_KAFKA = re.compile(r"(?<![\w.`])`?kafka`?(?![`\w]|\s*\.)", re.IGNORECASE)


@dataclass(frozen=True)
class Transform:
    """One ``target: source`` mapping."""

    target: tuple[str, ...]
    source: str

    def check(self) -> None:
        """Raise :class:`ConfigError` when the source is neither ``sql:`` nor JMESPath (no Spark)."""
        if (sql := self.sql) is not None:
            if not sql:
                raise ConfigError(f"transform {'.'.join(self.target)!r}: 'sql:' needs an expression")
            return
        _ = self.ast

    @property
    def sql(self) -> str | None:
        """The Spark SQL expression of a ``sql:`` transform, else ``None``."""
        src = self.source
        return src[len("sql:") :].strip() if src.startswith("sql:") else None

    @cached_property
    def expression(self) -> str:
        """The JMESPath expression (the older ``substr(path, 0, 4)`` spelling given backticks)."""
        m = _BARE_SUBSTR.match(self.source)
        return f"substr({m.group(1)}, `{m.group(2)}`, `{m.group(3)}`)" if m else self.source

    @cached_property
    def ast(self) -> dict[str, Any]:
        """The parsed JMESPath expression (``jmespath``'s AST)."""
        import jmespath
        from jmespath.exceptions import JMESPathError

        if self.sql is not None:
            raise ConfigError(f"transform {'.'.join(self.target)!r} is Spark SQL, not JMESPath")
        try:
            parsed: dict[str, Any] = jmespath.compile(self.expression).parsed
        except JMESPathError as exc:
            raise self.not_understood(str(exc).replace("\n", " ")) from None
        unknown = sorted(_functions(parsed) - {*_BUILTIN_FUNCTIONS, *CUSTOM_FUNCTIONS})
        if unknown:
            raise self.not_understood(f"unknown function(s) {', '.join(unknown)}")
        return parsed

    @property
    def field(self) -> tuple[str, ...] | None:
        """The names of a plain field path (``a.b``, ``"my field".x``, ``kafka.offset``), else ``None``."""
        return None if self.sql is not None else _path(self.ast)

    @property
    def substr(self) -> tuple[tuple[str, ...], int, int] | None:
        """``(path, skip, take)`` of ``substr(path, `skip`, `take`)`` with non-negative integer
        literals, else ``None``."""
        args = self._call("substr", 3)
        if args is None or (path := _path(args[0])) is None:
            return None
        numbers = [a.get("value") for a in args[1:] if a["type"] == "literal"]
        if len(numbers) != 2 or not all(type(n) is int and n >= 0 for n in numbers):
            return None
        skip, take = numbers
        assert isinstance(skip, int) and isinstance(take, int)
        return path, skip, take

    @property
    def epoch(self) -> tuple[EpochUnit, tuple[str, ...]] | None:
        """``(unit, path)`` of an ``epoch_*`` function over a field path, else ``None``."""
        for name, unit in _EPOCH_FUNCTIONS.items():
            args = self._call(name, 1)
            if args is not None and (path := _path(args[0])) is not None:
                return unit, path
        return None

    @property
    def per_message(self) -> bool:
        """Whether no engine compiles this source to columns: it is evaluated per message."""
        return self.sql is None and self.field is None and self.substr is None and self.epoch is None

    @property
    def can_fail(self) -> bool:
        """Whether a message can fail this transform (then it is a dead letter)."""
        return self.sql is None and (self.epoch is not None or self.per_message)

    def root_fields(self) -> frozenset[str] | None:
        """The message's top-level fields the expression can read, or ``None`` when it may read
        the whole message (``@``): a per-message evaluation converts only these columns."""
        return None if self.sql is not None else _root_fields(self.ast)

    def _call(self, name: str, arity: int) -> list[dict[str, Any]] | None:
        if self.sql is not None:
            return None
        node = self.ast
        if node["type"] != "function_expression" or node["value"] != name or len(node["children"]) != arity:
            return None
        children: list[dict[str, Any]] = node["children"]
        return children

    def not_understood(self, reason: str = "") -> ConfigError:
        """The error for a source that is neither JMESPath nor ``sql:``."""
        return ConfigError(
            f"transform source {self.source!r} is not understood ({reason}); use a JMESPath expression "
            "(kafka.<" + "|".join(KAFKA_FIELDS) + ">, a field path, substr(path, `skip`, `take`), "
            "epoch_seconds_to_iso8601(path), ...) or 'sql: <Spark SQL expression>'",
            transform=self.source,
        )

    def kafka_fields(self) -> frozenset[str]:
        """The ``kafka`` struct's fields this transform reads, wherever the source names them
        (``kafka.key``, ``substr(kafka.key, ...)``, SQL); the whole struct: every field. Reading
        ``timestamp_type`` reads ``timestamp`` (the source builds them together)."""
        found: set[str]
        if self.sql is not None:
            src = self.sql
            if _WHOLE_KAFKA.search(src):
                return frozenset(KAFKA_FIELDS)
            found = {m.lower() for m in _KAFKA_FIELD.findall(src)}
        else:
            found = _kafka_reads(self.ast)
        found &= set(KAFKA_FIELDS)
        if "timestamp_type" in found:
            found.add("timestamp")
        return frozenset(found)


def _path(node: dict[str, Any]) -> tuple[str, ...] | None:
    """The field names of a plain path (``field`` or ``subexpression`` of fields), else ``None``."""
    if node["type"] == "field":
        return (str(node["value"]),)
    if node["type"] == "subexpression":
        parts = [_path(c) for c in node["children"]]
        if all(p is not None for p in parts):
            return tuple(name for p in parts for name in p or ())
    return None


def _functions(node: dict[str, Any]) -> set[str]:
    names = {str(node["value"])} if node["type"] == "function_expression" else set()
    for child in node.get("children", []):
        if isinstance(child, dict):
            names |= _functions(child)
    return names


def _kafka_reads(node: dict[str, Any]) -> set[str]:
    """Fields of ``kafka`` an expression may read: ``kafka.<f>`` names one, any other use of a
    ``kafka`` field (or of ``@``, the whole message) all of them."""
    kind = node["type"]
    if kind == "current":
        return set(KAFKA_FIELDS)
    if kind == "field" and node["value"] == "kafka":
        return set(KAFKA_FIELDS)
    if kind == "subexpression":
        first = node["children"][0]
        if first["type"] == "field" and first["value"] == "kafka":
            nxt = node["children"][1]
            return {str(nxt["value"])} if nxt["type"] == "field" else set(KAFKA_FIELDS)
        # The right side reads what the left produced, not the message.
        return _kafka_reads(first)
    if kind in ("projection", "filter_projection", "pipe", "index_expression", "flatten"):
        # Only the left side is evaluated on the message (a filter's condition on its items).
        return _kafka_reads(node["children"][0])
    if kind == "expref":
        return set()
    found: set[str] = set()
    for child in node.get("children", []):
        if isinstance(child, dict):
            found |= _kafka_reads(child)
    return found


def _root_fields(node: dict[str, Any]) -> frozenset[str] | None:
    """Top-level names an expression evaluated on the message reads (``None``: all of them)."""
    kind = node["type"]
    if kind == "current":
        return None
    if kind == "field":
        return frozenset({str(node["value"])})
    if kind in ("subexpression", "projection", "filter_projection", "pipe", "index_expression", "flatten"):
        # The right side (and a filter's condition) reads what the left side produced.
        return _root_fields(node["children"][0])
    if kind in ("expref", "literal", "raw_string"):
        return frozenset()
    found: set[str] = set()
    for child in node.get("children", []):
        if isinstance(child, dict):
            names = _root_fields(child)
            if names is None:
                return None
            found |= names
    return frozenset(found)


def parse_transform(text: str) -> Transform:
    """Parse ``"target: source"`` (kafka-delta-ingest's ``--transform`` syntax)."""
    target, sep, source = text.partition(":")
    target, source = target.strip(), source.strip()
    if not sep or not target or not source or not _TARGET.match(target):
        raise ConfigError(
            f"transform {text!r} must look like 'target.path: source', e.g. 'meta.offset: kafka.offset'",
            transform=text,
        )
    return Transform(tuple(target.split(".")), source)
