"""kafka-delta-ingest style transforms: the language, parsed and checked without Spark.

How a transform runs lives with the engine that runs it (:mod:`deltaflow.pipeline.transforms`
compiles it to Spark column expressions, never Python per row).

A transform is ``"target: source"``. ``target`` is a dotted column path (nested structs are
created as needed). ``source`` is one of:

* ``kafka.partition``, ``kafka.offset``, ``kafka.topic``, ``kafka.timestamp``, ``kafka.key``,
  ``kafka.headers``: the message's coordinates and metadata;
* a field path of the decoded JSON value, e.g. ``meta.producer.timestamp``;
* ``substr(path, `start`, `end`)``: characters ``[start, end)`` of a string field;
* ``epoch_seconds_to_iso8601(path)`` / ``epoch_millis_to_iso8601(path)``: an epoch number as an
  ISO-8601 UTC string;
* ``sql: <expression>``: any Spark SQL expression over the decoded fields and ``kafka``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deltaflow.errors import ConfigError

__all__ = ["KAFKA_FIELDS", "Transform", "parse_transform"]

KAFKA_FIELDS = ("partition", "offset", "topic", "timestamp", "key", "headers")

_PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_SUBSTR = re.compile(rf"^substr\(\s*({_PATH})\s*,\s*`?(\d+)`?\s*,\s*`?(\d+)`?\s*\)$")
_EPOCH = re.compile(rf"^epoch_(seconds|millis)_to_iso8601\(\s*({_PATH})\s*\)$")
_FIELD = re.compile(rf"^{_PATH}$")
#: ``kafka.<field>`` anywhere in a source (backticks allowed), and ``kafka`` on its own.
_KAFKA_FIELD = re.compile(r"(?<![\w.`])`?kafka`?\s*\.\s*`?(\w+)", re.IGNORECASE)
_NOT_UNDERSTOOD = (
    "transform source {src!r} is not understood; use kafka.<" + "|".join(KAFKA_FIELDS) + ">, a field "
    "path, substr(path, `start`, `end`), epoch_seconds_to_iso8601(path), epoch_millis_to_iso8601(path) "
    "or 'sql: <Spark SQL expression>'"
)
_WHOLE_KAFKA = re.compile(r"(?<![\w.`])`?kafka`?(?![`\w]|\s*\.)", re.IGNORECASE)


@dataclass(frozen=True)
class Transform:
    """One ``target: source`` mapping."""

    target: tuple[str, ...]
    source: str

    def check(self) -> None:
        """Raise :class:`ConfigError` when the source has none of the accepted forms (no Spark)."""
        src = self.source
        if src.startswith("sql:"):
            if not src[len("sql:") :].strip():
                raise ConfigError(f"transform {'.'.join(self.target)!r}: 'sql:' needs an expression")
            return
        if not (_SUBSTR.match(src) or _EPOCH.match(src) or _FIELD.match(src)):
            raise ConfigError(_NOT_UNDERSTOOD.format(src=src), transform=src)

    @property
    def sql(self) -> str | None:
        """The Spark SQL expression of a ``sql:`` transform, else ``None``."""
        src = self.source
        return src[len("sql:") :].strip() if src.startswith("sql:") else None

    @property
    def substr(self) -> tuple[str, int, int] | None:
        """``(path, start, end)`` of a ``substr(path, start, end)`` transform, else ``None``."""
        m = _SUBSTR.match(self.source)
        return None if m is None else (m.group(1), int(m.group(2)), int(m.group(3)))

    @property
    def epoch(self) -> tuple[str, str] | None:
        """``(unit, path)`` of an ``epoch_<unit>_to_iso8601(path)`` transform (``seconds`` or
        ``millis``), else ``None``."""
        m = _EPOCH.match(self.source)
        return None if m is None else (m.group(1), m.group(2))

    @property
    def field(self) -> str | None:
        """The dotted path of a plain field transform, else ``None``."""
        return self.source if _FIELD.match(self.source) and not self.source.startswith("sql:") else None

    def not_understood(self) -> ConfigError:
        """The error for a source of none of the accepted forms."""
        return ConfigError(_NOT_UNDERSTOOD.format(src=self.source), transform=self.source)

    def kafka_fields(self) -> frozenset[str]:
        """The ``kafka`` struct's fields this transform reads, wherever the source names them
        (``kafka.key``, ``substr(kafka.key, ...)``, SQL); the whole struct: every field."""
        src = self.source.removeprefix("sql:")
        if _WHOLE_KAFKA.search(src):
            return frozenset(KAFKA_FIELDS)
        return frozenset(m.lower() for m in _KAFKA_FIELD.findall(src)) & frozenset(KAFKA_FIELDS)


def parse_transform(text: str) -> Transform:
    """Parse ``"target: source"`` (kafka-delta-ingest's ``--transform`` syntax)."""
    target, sep, source = text.partition(":")
    target, source = target.strip(), source.strip()
    if not sep or not target or not source or not _FIELD.match(target):
        raise ConfigError(
            f"transform {text!r} must look like 'target.path: source', e.g. 'meta.offset: kafka.offset'",
            transform=text,
        )
    return Transform(tuple(target.split(".")), source)
