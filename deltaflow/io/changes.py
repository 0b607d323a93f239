"""Row changes folded into the last state of each key, and staged as Arrow.

A change stream (Debezium topics, on the Arrow ingest path) is applied to a mirror table with
ONE MERGE per table and batch. Before that, the changes of a batch are folded per key: the
source tasks fold the changes they read (:class:`ChangeFold`, a combiner: a key's changes sit
in one Kafka partition, in order), write the result as a staging Parquet file per table
(:meth:`ChangeFold.to_table`), and the driver folds the tasks' files into the merge's source
(:meth:`ChangeFold.add_staged`), ordered by the change sequence.

Folding, per key, in sequence order: an upsert lays the values it carries over what the fold
knew of the row (a column it does not carry, e.g. a value the database left out, keeps the
earlier one, else the table's: the staged rows say which columns they carry); a delete
replaces the row's state; a truncate deletes every row older than it (staged as the
``truncated_below`` sequence, applied by the merge to the table's rows). A change older than
the key's state is passed over: a replay or a late event never overwrites a newer one.

The staged table: the image's columns (typed), ``_deltaflow_has_<column>`` flags for columns some
upsert does not carry, ``_deltaflow_op`` (``upsert``/``delete``) and ``_change_sequence``
(DECIMAL(38,0)); its schema's metadata names the key columns and the truncate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

__all__ = [
    "KAFKA_OFFSET",
    "KEY_METADATA",
    "OP_COLUMN",
    "PRESENT_PREFIX",
    "SEQUENCE_COLUMN",
    "SEQUENCE_METADATA",
    "SEQUENCE_TYPE",
    "STAGING_DIR",
    "TRUNCATED_METADATA",
    "ChangeFold",
    "fits",
]

#: A column of the merge's source saying whether an upsert carries the column's value.
PRESENT_PREFIX = "_deltaflow_has_"
OP_COLUMN = "_deltaflow_op"
SEQUENCE_COLUMN = "_change_sequence"
SEQUENCE_TYPE = pa.decimal128(38, 0)
KEY_METADATA = b"deltaflow.key"
#: The folder of a mirror table where source tasks stage their folds (readers and vacuum pass
#: over folders whose name starts with ``_``; no log entry names a file in it).
STAGING_DIR = "_deltaflow_staging"
TRUNCATED_METADATA = b"deltaflow.truncated_below"
#: Set (to ``kafka-offset``) when some staged change is ordered by its Kafka offset (its event
#: named no database position): such sequences compare only within one partition of one topic.
SEQUENCE_METADATA = b"deltaflow.sequence"
KAFKA_OFFSET = "kafka-offset"


@dataclass
class _State:
    op: str  # upsert | delete
    image: dict[str, Any]  # the columns the changes carried (typed values)
    sequence: int


def fits(value: Any, target: pa.DataType) -> bool:
    """Whether ``value`` (a Python value) is one a column of ``target`` holds exactly."""
    if value is None:
        return True
    try:
        pa.array([value], target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError):
        return False
    return True


class ChangeFold:
    """The last state per key of the changes added (one table's).

    Args:
        key: The key columns (``None``: taken from the first change).
        columns: The table's columns and types as known (the table's, at start): a change's
            value must fit its column's type.
    """

    def __init__(self, key: Sequence[str] | None = None, columns: pa.Schema | None = None) -> None:
        self.key: tuple[str, ...] | None = tuple(key) if key else None
        self.fields: dict[str, pa.DataType] = {f.name: f.type for f in columns or ()}
        self._state: dict[tuple[Any, ...], _State] = {}
        self.truncated_below: int | None = None
        #: Some change is ordered by its Kafka offset, not by the database's position.
        self.offset_sequenced = False
        #: A change schema (one object per distinct schema, as readers keep them) whose every
        #: column has the mirror's type, and the last schema's types by name.
        self._agreeing: pa.Schema | None = None
        self._typed: tuple[pa.Schema | None, dict[str, pa.DataType]] = (None, {})

    # -- adding ---------------------------------------------------------------------------------

    def check(
        self, key: Sequence[str], image: Mapping[str, Any] | None, schema: pa.Schema | None
    ) -> str | None:
        """Why a change with these key columns, image and image schema cannot join the fold
        (``None``: it can). A column's type is the first one known (the table's); a change of
        another type, or without a schema (its values as JSON gave them), joins only when its
        values fit that type."""
        if self.key is not None and tuple(key) != self.key:
            return f"its key columns {list(key)} are not the mirror's {list(self.key)}"
        if image is None or (schema is not None and schema is self._agreeing):
            return None
        types = self._types(schema)
        for name, value in image.items():
            known = self.fields.get(name)
            given = types.get(name)
            if known is None or given == known:
                continue
            if not fits(value, known):
                what = f"is {given} in this change" if given is not None else "has no schema in this change"
                return (
                    f"column {name!r} {what}, and the mirror's column is {known}: "
                    f"the value {value!r} does not fit it"
                )
        if schema is not None and all(self.fields.get(n, t) == t for n, t in types.items()):
            self._agreeing = schema  # its messages need no look at their values (the same object)
        return None

    def _types(self, schema: pa.Schema | None) -> dict[str, pa.DataType]:
        if schema is None:
            return {}
        if schema is not self._typed[0]:
            self._typed = (schema, {f.name: f.type for f in schema})
        return self._typed[1]

    def add(
        self,
        op: str,
        key: Sequence[str],
        values: tuple[Any, ...],
        image: Mapping[str, Any] | None,
        sequence: int,
        schema: pa.Schema | None = None,
        *,
        offset_sequence: bool = False,
    ) -> None:
        """One change: ``op`` ``upsert``/``delete`` of the row at ``values`` (of ``key``), or
        ``truncate``; ``offset_sequence``: ``sequence`` is the message's Kafka offset. Call
        :meth:`check` first."""
        self.offset_sequenced |= offset_sequence
        if op == "truncate":
            self.truncated_below = max(self.truncated_below or 0, sequence)
            return
        if self.key is None:
            self.key = tuple(key)
        known = len(self.fields)
        if schema is not None:
            for f in schema:
                self.fields.setdefault(f.name, f.type)
        image = dict(image or {})
        for name, value in zip(key, values, strict=True):
            image.setdefault(name, value)
        for name, value in image.items():
            if name not in self.fields and value is not None:
                self.fields[name] = pa.array([value]).type
        if len(self.fields) != known:
            self._agreeing = None  # a column's type became known: every schema is looked at again
        prior = self._state.get(values)
        if prior is not None and prior.sequence > sequence:
            return  # older than what the fold holds for the key
        if op == "upsert" and prior is not None and prior.op == "upsert":
            image = {**prior.image, **image}
        self._state[values] = _State(op, image, sequence)

    def add_staged(self, tables: Sequence[pa.Table]) -> None:
        """The rows of staged tables (:meth:`to_table`, the tasks' folds), folded in together in
        sequence order (a key's rows from two tasks: the later one laid over the earlier)."""
        rows: list[tuple[int, str, tuple[Any, ...], dict[str, Any]]] = []
        for table in tables:
            metadata = table.schema.metadata or {}
            self.offset_sequenced |= metadata.get(SEQUENCE_METADATA) == KAFKA_OFFSET.encode()
            truncated = metadata.get(TRUNCATED_METADATA)
            if truncated:
                self.truncated_below = max(self.truncated_below or 0, int(truncated))
            if not table.num_rows:
                continue
            key = tuple(json.loads(metadata.get(KEY_METADATA, b"[]")))
            if self.key is None:
                self.key = key
            elif key != self.key:
                raise ValueError(f"staged changes keyed by {list(key)}, the mirror by {list(self.key)}")
            data = [
                n for n in table.column_names if not n.startswith(PRESENT_PREFIX) and n not in _BOOKKEEPING
            ]
            for name in data:
                self.fields.setdefault(name, table.schema.field(name).type)
            columns = {n: table.column(n).to_pylist() for n in table.column_names}
            for i in range(table.num_rows):
                image = {
                    n: columns[n][i]
                    for n in data
                    if (PRESENT_PREFIX + n) not in columns or columns[PRESENT_PREFIX + n][i]
                }
                values = tuple(columns[k][i] for k in key)
                rows.append((int(columns[SEQUENCE_COLUMN][i]), columns[OP_COLUMN][i], values, image))
        assert self.key is not None or not rows
        for sequence, op, values, image in sorted(rows, key=lambda r: r[0]):
            assert self.key is not None
            self.add(op, self.key, values, image, sequence)

    # -- results ---------------------------------------------------------------------------------

    def rows(self) -> list[_State]:
        """The keys' last states, those older than a truncate left out (the truncate deletes them)."""
        below = self.truncated_below
        return [s for s in self._state.values() if below is None or s.sequence >= below]

    def __bool__(self) -> bool:
        return bool(self._state) or self.truncated_below is not None

    def to_table(self, schema: pa.Schema | None = None) -> pa.Table:
        """The fold as the merge's source (see the module's docstring); ``schema``: the column
        order and types to use (more columns than the fold's may be given; the fold's others
        follow)."""
        rows = self.rows()
        names = list(dict.fromkeys([*(schema.names if schema is not None else []), *self.fields]))
        seen = set().union(*(r.image.keys() for r in rows)) if rows else set()
        arrays, fields = [], []
        for name in names:
            if name not in seen:
                continue  # no row carries it: the merge leaves it as it is
            target = (
                schema.field(name).type if schema is not None and name in schema.names else self.fields[name]
            )
            arrays.append(pa.array([r.image.get(name) for r in rows], target))
            fields.append(pa.field(name, target))
            if any(r.op == "upsert" and name not in r.image for r in rows):
                arrays.append(pa.array([name in r.image for r in rows], pa.bool_()))
                fields.append(pa.field(PRESENT_PREFIX + name, pa.bool_()))
        arrays.append(pa.array([r.op for r in rows], pa.string()))
        fields.append(pa.field(OP_COLUMN, pa.string()))
        arrays.append(pa.array([Decimal(r.sequence) for r in rows], SEQUENCE_TYPE))
        fields.append(pa.field(SEQUENCE_COLUMN, SEQUENCE_TYPE))
        metadata = {KEY_METADATA: json.dumps(list(self.key or ())).encode()}
        if self.truncated_below is not None:
            metadata[TRUNCATED_METADATA] = str(self.truncated_below).encode()
        if self.offset_sequenced:
            metadata[SEQUENCE_METADATA] = KAFKA_OFFSET.encode()
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))


_BOOKKEEPING = frozenset({OP_COLUMN, SEQUENCE_COLUMN})
