"""Options of the ``postgres-cdc`` source, shared by Spark's option strings and YAML pipelines.

Nothing here connects: :mod:`deltaflow.sources.postgres_cdc` does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)

from deltaflow.config.identity import PipelineId
from deltaflow.config.models import problems
from deltaflow.errors import ConfigError

__all__ = ["PIPELINE_OWNED", "PgColumn", "PgTable", "PostgresCdcOptions", "slot_key"]

#: Options a pipeline sets itself (from its sinks).
PIPELINE_OWNED = ("delta_table_uri", "pipeline_id", "delta_storage_options", "more_delta_tables")


#: The session settings every connection of the source uses (see ``connect_kwargs``).
SESSION_OPTIONS = (
    "-c DateStyle=ISO -c IntervalStyle=postgres -c extra_float_digits=3 -c bytea_output=hex "
    "-c client_encoding=UTF8 -c TimeZone=UTC "
    # The exporting replication connection idles in its transaction while the snapshot's tasks
    # run, and a snapshot's COPY may run long: a server's timeouts must not end either.
    "-c idle_in_transaction_session_timeout=0 -c statement_timeout=0"
)


def slot_key(slot: str) -> str:
    """The offsets' key of a slot (and the middle of its txn id in the Delta log)."""
    return f"slot:{slot}"


class PostgresCdcOptions(BaseModel):
    """Options of the ``postgres-cdc`` source (Rivven's names where it has them).

    Connection settings left out come from libpq's environment (``PGHOST``, ``PGPORT``,
    ``PGDATABASE``, ``PGUSER``, ``PGPASSWORD``, ``PGSSLMODE``, ``PGPASSFILE``, ...).

    Attributes:
        host, port, database, user, password, sslmode: The server (``dbname`` is accepted for
            ``database``).
        publication: The publication whose tables are captured (``CREATE PUBLICATION``).
        slot: The logical replication slot (default ``deltaflow_<publication>``); created with
            the ``pgoutput`` plugin when missing.
        snapshot: ``initial`` (the default): the first micro-batch is every published table's
            rows (``snapshot`` events) as of the slot's start, exactly (the slot is created with
            an exported snapshot, over a replication connection), then the changes from there.
            An existing slot the table holds nothing from is replaced by a new one for it.
            ``never``: changes from the slot's position on (an existing slot keeps its own).
        snapshot_chunk_mb: The snapshot reads a table in one Spark task per this many MiB of it
            (ctid ranges, PostgreSQL 14+), so large tables are read in parallel.
        max_changes_per_batch: Admission control: a micro-batch ends after the transaction
            that reaches this many pgoutput messages (0 = no limit). Transactions are never
            split.
        batch_interval: Pacing (seconds, 0 = none), for queries on Spark's default trigger: a
            micro-batch starts once this long has passed since the previous one started, or at
            once when ``max_changes_per_batch`` is reached or the previous batch reached it (a
            backlog drains at full speed). Rivven's ``flush_interval_secs``.
        idle_progress_bytes: With no captured change, the WAL other tables write is still held
            for the slot; once this much has passed, an empty micro-batch records the new
            position in the table so the slot can move on.
        delta_table_uri: The Delta table the pipeline writes with ``kafka_offsets``: the source
            starts after the position committed there and never reads a transaction it holds,
            and the slot is advanced only to it.
        pipeline_id: The pipeline whose txn to read (the sink's ``pipeline_id``).
        delta_storage_options: Storage options for reading that table (JSON object).
        more_delta_tables: The pipeline's other tables recording the same progress (mirror
            tables), table URI -> storage options (JSON object): the source starts after what
            ALL of them hold, and the slot is advanced only to that.
        connect_timeout: Seconds to wait for a connection.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    host: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    database: str | None = Field(default=None, validation_alias=AliasChoices("database", "dbname"))
    user: str | None = None
    password: SecretStr | None = None
    sslmode: str | None = None
    publication: str = Field(min_length=1)
    slot: str | None = Field(default=None, pattern=r"^[a-z0-9_]{1,63}$")
    snapshot: Literal["initial", "never"] = "initial"
    snapshot_chunk_mb: int = Field(default=128, ge=1)
    max_changes_per_batch: int = Field(default=0, ge=0)
    batch_interval: float = Field(default=0.0, ge=0)
    idle_progress_bytes: int = Field(default=16 << 20, ge=1)
    delta_table_uri: str | None = None
    pipeline_id: PipelineId | None = None
    delta_storage_options: dict[str, str] = Field(default_factory=dict)
    more_delta_tables: dict[str, dict[str, str]] = Field(default_factory=dict)
    connect_timeout: float = Field(default=10.0, gt=0)

    @field_validator("delta_storage_options", "more_delta_tables", mode="before")
    @classmethod
    def _parse_settings(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @model_validator(mode="after")
    def _check(self) -> PostgresCdcOptions:
        if bool(self.delta_table_uri) != bool(self.pipeline_id):
            raise ValueError("set both delta_table_uri and pipeline_id (or neither)")
        if self.more_delta_tables and not self.delta_table_uri:
            raise ValueError("more_delta_tables needs delta_table_uri")
        return self

    def progress_tables(self) -> list[tuple[str, dict[str, str]]]:
        """Every table holding this source's progress, with its storage options."""
        if not self.delta_table_uri:
            return []
        return [(self.delta_table_uri, self.delta_storage_options), *self.more_delta_tables.items()]

    @property
    def slot_name(self) -> str:
        if self.slot:
            return self.slot
        cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in self.publication.lower())
        return f"deltaflow_{cleaned}"[:63]

    def slot_identity(self) -> tuple[str, str, str, str]:
        """Where the slot lives: two pipelines with the same identity would share one slot."""
        return (self.host or "", str(self.port or ""), self.database or "", self.slot_name)

    @property
    def key(self) -> str:
        return slot_key(self.slot_name)

    def connect_kwargs(self) -> dict[str, Any]:
        """psycopg's keyword arguments, the password revealed (never log them)."""
        out: dict[str, Any] = {
            "connect_timeout": max(1, round(self.connect_timeout)),
            "application_name": "deltaflow",
            # pgoutput prints values with the reading session's settings: fix the ones that
            # change the text (a role's or database's defaults could say otherwise).
            "options": SESSION_OPTIONS,
        }
        for name in ("host", "port", "user", "sslmode"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.database is not None:
            out["dbname"] = self.database
        if self.password is not None:
            out["password"] = self.password.get_secret_value()
        return out

    def where(self) -> str:
        """The server for messages: ``host:port/database``, each from the settings, else from
        libpq's environment (``PGHOST``, ``PGPORT``, ``PGDATABASE``), else libpq's default."""
        import getpass
        import os

        env = os.environ
        host = self.host or env.get("PGHOST") or "[local]"  # libpq's default: a Unix socket, as psql says
        port = self.port or env.get("PGPORT") or 5432
        database = self.database or env.get("PGDATABASE") or env.get("PGUSER") or getpass.getuser()
        return f"{host}:{port}/{database}"

    def to_spark_options(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, value in self.model_dump(exclude_defaults=True).items():
            if name == "password" and self.password is not None:
                out[name] = self.password.get_secret_value()
            elif isinstance(value, dict):
                out[name] = json.dumps(value)
            else:
                out[name] = str(value)
        return out

    @classmethod
    def from_spark_options(cls, options: Mapping[str, str]) -> PostgresCdcOptions:
        values: dict[str, Any] = {k.lower(): v for k, v in options.items() if k.lower() != "path"}
        known = set(cls.model_fields) | {"dbname"}
        unknown = set(values) - known
        if unknown:
            from deltaflow.errors import UnknownOptionError

            raise UnknownOptionError(unknown, sorted(known))
        try:
            opts = cls(**values)
        except ValidationError as exc:
            raise ConfigError("invalid postgres-cdc source options: " + "; ".join(problems(exc))) from None
        if opts.snapshot == "initial" and not opts.delta_table_uri:
            raise ConfigError(
                "postgres-cdc: snapshot 'initial' needs delta_table_uri and pipeline_id (the Delta table "
                "the sink writes with kafka_offsets: it records that the snapshot was taken; without it "
                "a replayed first batch would take a second snapshot); or set snapshot: never"
            )
        return opts


@dataclass(frozen=True)
class PgColumn:
    """A column of a PostgreSQL table as its catalog describes it (domains resolved to their
    base type).

    Attributes:
        name: The column's name.
        type_name: The base type's ``pg_type.typname`` (``int4``, ``numeric``, ``_text``, ...).
        kind: ``pg_type.typtype`` of the base type (``b`` base, ``e`` enum, ``c`` composite, ...).
        element: For arrays, the element type's name (``None`` otherwise).
        element_kind: For arrays, the element type's ``typtype``.
        precision, scale: ``numeric(p, s)``'s precision and scale (``None``: unconstrained).
    """

    name: str
    type_name: str
    kind: str = "b"
    element: str | None = None
    element_kind: str | None = None
    precision: int | None = None
    scale: int | None = None


@dataclass(frozen=True)
class PgTable:
    """A PostgreSQL table as a mirror needs it: columns, key, replica identity."""

    stream: str  # schema.table
    columns: tuple[PgColumn, ...]
    primary_key: tuple[str, ...]
    identity_key: tuple[str, ...]  # what a delete carries: the replica identity's columns
    replica_identity: str  # d(efault) | f(ull) | i(ndex) | n(othing)
