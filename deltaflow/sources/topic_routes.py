"""Where each topic's messages go on the Arrow ingest path: its table, its dead-letter table, and
how its values decode, resolved from the table itself.

One ingest query reads many topics (``--topic_pattern``, or ``t1,t2``) into a table per topic (a
:class:`~deltaflow.config.table_template.TableTemplate`). The driver prepares every table before
the query starts (creates the missing ones); a :class:`TopicRouter` then turns a topic into its
:class:`TopicRoute` by loading the table once: the data files' schema and partitioning are the
table's, the values decode into the table's columns (less the ones transforms make). The
planner does the same for a topic that starts to match while the query runs, once the driver
has made its table.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from deltaflow.config.table_template import TableTemplate
from deltaflow.sources.kafka import Decoding

__all__ = ["TableFiles", "TopicRoute", "TopicRouter", "decoded_fields"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableFiles:
    """Where and how a task writes one table's data files (built on the driver)."""

    table_uri: str
    schema_ipc: bytes
    partition_columns: tuple[str, ...] = ()
    compression: str = "snappy"
    target_file_size: int = 128 * 1024 * 1024
    max_records_per_file: int = 0
    storage_options: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, table_uri: str, schema: pa.Schema, **settings: Any) -> TableFiles:
        return cls(table_uri, schema.serialize().to_pybytes(), **settings)

    @property
    def schema(self) -> pa.Schema:
        return pa.ipc.read_schema(pa.py_buffer(self.schema_ipc))


@dataclass(frozen=True)
class TopicRoute:
    """Where one topic's messages go, and how its values decode (``None``: as the source's
    options say, for ingest of one topic)."""

    main: TableFiles
    dead_letters: TableFiles | None = None
    decoding: Decoding | None = None


@dataclass(frozen=True)
class TopicRouter:
    """Turns a topic into its :class:`TopicRoute`, from its table (which must exist).

    Attributes:
        table: The main tables' template.
        dead_letters: The dead-letter table (a template, or one table for every topic) and the
            schema its rows have (the same for every topic).
        files: The data files' settings every main table shares (its partitioning aside: the
            table's own).
        kafka_schema_ipc: The Kafka columns of the source's rows (decoded values come after them).
        decoding: The decoding every topic shares; its schema is set per table.
        given_schema_ipc: ``--schema``'s fields: decoded first, whatever the table holds.
        produced: The targets of the transforms (not in the messages: not decoded).
    """

    table: TableTemplate
    files: TableFiles
    kafka_schema_ipc: bytes
    decoding: Decoding
    dead_letters: TableTemplate | None = None
    dead_letter_files: TableFiles | None = None
    given_schema_ipc: bytes | None = None
    produced: tuple[tuple[str, ...], ...] = ()

    def table_uri(self, topic: str) -> str | None:
        """The table ``topic`` goes to (``None``: the pattern does not take it)."""
        return self.table.render(topic)

    def dead_letter_uri(self, topic: str) -> str | None:
        return self.dead_letters.render(topic) if self.dead_letters is not None else None

    def resolve(self, topic: str, table: Any = None) -> TopicRoute | None:
        """The route of ``topic``; ``None`` while its table does not exist (or the pattern
        does not take it). ``table``: its ``DeltaTable``, if loaded already."""
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.schema import plain_schema

        uri = self.table_uri(topic)
        if uri is None or uri == self.dead_letter_uri(topic):
            return None  # no table, or the dead-letter table's name (never written as a main table)
        if table is None:
            table = delta_log.load(uri, self.files.storage_options)
        if table is None:
            return None
        schema = plain_schema(pa.schema(table.schema().to_arrow()))
        main = dataclasses.replace(
            TableFiles.of(uri, schema),
            partition_columns=tuple(table.metadata().partition_columns),
            compression=self.files.compression,
            target_file_size=self.files.target_file_size,
            max_records_per_file=self.files.max_records_per_file,
            storage_options=self.files.storage_options,
        )
        letters = None
        dlq_uri = self.dead_letter_uri(topic)
        if dlq_uri is not None and self.dead_letter_files is not None:
            letters = dataclasses.replace(self.dead_letter_files, table_uri=dlq_uri)
        return TopicRoute(main, letters, self.decoding_for(schema, topic))

    def reader_schema(self, topic: str) -> str | None:
        """The Avro reader schema of ``topic``'s values: the one given for every topic, else
        the latest of its registry subject ``<topic>-value`` (``None``: values are not Avro)."""
        if self.decoding.value_format != "avro":
            return None
        if self.decoding.avro_schema:
            return self.decoding.avro_schema
        from deltaflow.sources.decode import SchemaRegistry

        assert self.decoding.registry_url is not None
        registry = SchemaRegistry(self.decoding.registry_url, basic_auth=self.decoding.registry_auth)
        return registry.latest(f"{topic}-value")[1]

    def decoding_for(self, table_schema: pa.Schema, topic: str) -> Decoding:
        """How ``topic``'s values decode into a table of ``table_schema``."""
        kafka = pa.ipc.read_schema(pa.py_buffer(self.kafka_schema_ipc))
        if self.decoding.value_format == "binary":
            return dataclasses.replace(self.decoding, arrow_schema=kafka)
        given = pa.ipc.read_schema(pa.py_buffer(self.given_schema_ipc)) if self.given_schema_ipc else None
        values = decoded_fields(table_schema, given, self.produced)
        source = pa.schema(
            [
                *kafka,
                pa.field("data", pa.struct(list(values))),
                pa.field("error", pa.string()),
                pa.field("unknown_fields", pa.list_(pa.string())),
            ]
        )
        return dataclasses.replace(self.decoding, arrow_schema=source, avro_schema=self.reader_schema(topic))


def decoded_fields(
    table_schema: pa.Schema, given: pa.Schema | None, produced: Sequence[Sequence[str]]
) -> pa.Schema:
    """The fields values decode into: ``given`` (``--schema``) first, then the table's others,
    without what transforms produce (a whole column, or a nested field and the structs it
    leaves empty): messages do not carry those, and decoded they would be null structs a
    transform cannot fill."""
    fields = list(given or [])
    have = {f.name for f in fields}
    fields += [f for f in table_schema if f.name not in have]
    return pa.schema(_pruned(fields, [tuple(p) for p in produced]))


def _pruned(fields: Sequence[pa.Field], paths: list[tuple[str, ...]]) -> list[pa.Field]:
    out = []
    for f in fields:
        below = [p[1:] for p in paths if p and p[0].lower() == f.name.lower()]
        if any(not p for p in below):
            continue  # a transform's target itself
        if below and pa.types.is_struct(f.type):
            inner = _pruned([f.type.field(i) for i in range(f.type.num_fields)], below)
            if not inner:
                continue
            f = f.with_type(pa.struct(inner))
        out.append(f)
    return out


def progress_layout(
    routes: Mapping[str, TopicRoute], layout: Mapping[str, Sequence[int | str]]
) -> dict[str, dict[str, list[int | str]]]:
    """``layout`` (partitions per topic) grouped by the main table each topic goes to."""
    out: dict[str, dict[str, list[int | str]]] = {}
    for topic, parts in layout.items():
        route = routes.get(topic)
        if route is not None:
            out.setdefault(route.main.table_uri, {})[topic] = list(parts)
    return out
