"""What ``deltaflow ingest`` runs: kafka-delta-ingest's options as one frozen, validated model.

The CLI's flags (and kafka-delta-ingest's environment variables) land here; so do the Python
callers (the demo, benchmarks). Every problem is reported before Spark starts, naming the flag.
"""

from __future__ import annotations

from typing import Any, Literal, Self

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
from deltaflow.config.locations import absolute_local, normalize_uri
from deltaflow.config.models import problems
from deltaflow.config.sink import StreamSinkOptions
from deltaflow.config.table_template import TableTemplate
from deltaflow.config.transforms import Transform, parse_transform
from deltaflow.errors import ConfigError

__all__ = ["DlqFormat", "IngestConfig", "client_security_settings"]

#: Row shapes of the dead-letter table: deltaflow's (coordinates, raw key and value) or
#: kafka-delta-ingest's (``base64_bytes``, ``json_string``, ``error``, ``timestamp``, ``date``).
DlqFormat = Literal["deltaflow", "kafka-delta-ingest"]

#: Sink options ingest sets itself (progress, who writes, the claim; append only).
_INGEST_OWNED = frozenset(
    {
        "table_uri",
        "pipeline_id",
        "kafka_offsets",
        "write_path",
        "checkpoint_location",
        "txn_version",
        "writer_epoch",
        "write_mode",
        "key_columns",
        "cdc_format",
        "op_column",
        "sequence_by",
    }
)


class IngestConfig(BaseModel):
    """What ``deltaflow ingest`` runs (the CLI flags, validated).

    Attributes:
        topic: One topic, or several separated by commas (``t1,t2``).
        topic_pattern: A regular expression the whole topic name must match (instead of
            ``topic``): every matching topic is read, topics created later included.
        table_uri: The table, or with several topics a template naming each topic's table
            (:class:`~deltaflow.config.table_template.TableTemplate`: ``{topic}``, ``{1}`` ...).
        dlq_table_location: The dead-letter table: one for every topic (its rows carry the
            topic), or a template as ``table_uri``.
        pipeline_id: The pipeline's identity (kafka-delta-ingest's ``--app_id``; ``app_id`` is
            accepted for it): the txn prefix ``<pipeline_id>-<topic>-<partition>``, the
            checkpoint folder, the metric label.
        value_schema: The JSON value's schema as Spark DDL (``--schema``; ``schema`` is accepted).
        engine: ``arrow`` keeps the rows in Arrow inside Spark's tasks (decode, transforms, dead
            letters, Parquet), ``spark`` runs them through Spark SQL; ``auto`` takes the Arrow
            engine whenever it can run the configuration (no ``sql:`` transforms, no schema
            evolution).
        kafka_settings: librdkafka settings (``-K key=value``); values are secrets (masked).
        avro: ``--avro``: a schema registry URL (Confluent wire format), an ``.avsc`` file (bare
            datums), or ``""``: each message an Avro object container file (kafka-delta-ingest's
            meaning; the table or ``--schema`` gives the columns).
        avro_schema: The Avro reader schema as text (a YAML pipeline's ``avro_schema``); with
            ``avro`` a registry URL it replaces the registry's latest schema as reader schema.
        json_registry: ``--json-registry``: JSON values in the Confluent wire format, their
            schema ids known to this registry.
        schema_registry_username / schema_registry_password: Basic auth for the schema
            registry (``--avro`` or ``--json-registry`` URL); the password is a secret (masked).
        soe_avro: ``--soe-avro``: an ``.avsc`` file or a folder of them: values in Avro
            single-object encoding, each read with the schema of its fingerprint (the columns
            come from the file, or the folder's last file in name order).
        dlq_format: The dead-letter rows' shape (``--dlq_format``): ``deltaflow`` or
            ``kafka-delta-ingest`` (see :mod:`deltaflow.pipeline.dead_letters`).
        fail_on_data_loss: Offsets of the table's progress the broker no longer holds stop
            ingest (``--fail_on_data_loss``, Spark's ``failOnDataLoss``); with false those
            partitions restart at the broker's earliest offset (:mod:`deltaflow.sources.kafka_data_loss`).
        table_options / dlq_table_options: Further sink options of the main / dead-letter
            table (:class:`~deltaflow.config.sink.SinkOptions` names: ``compression``,
            ``storage_options``, ``table_properties``, ...), as a YAML pipeline's sink sets them.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    topic: str = ""
    topic_pattern: str | None = Field(default=None, min_length=1)
    table_uri: str = Field(min_length=1)
    brokers: str = "localhost:9092"
    pipeline_id: PipelineId = Field(validation_alias=AliasChoices("pipeline_id", "app_id"))
    allowed_latency: float | None = Field(default=None, ge=0)
    max_messages_per_batch: int = Field(default=0, ge=0)
    #: Arrow engine: a task reads at least this many messages when the batch holds more.
    min_task_messages: int = Field(default=20_000, ge=1)
    auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    seek_offsets: dict[str, int] | None = None
    transforms: tuple[str, ...] = ()
    value_format: Literal["json", "raw", "avro"] = "json"
    value_schema: str | None = Field(default=None, validation_alias=AliasChoices("value_schema", "schema"))
    avro: str | None = None
    avro_schema: str | None = None
    json_registry: str | None = None
    soe_avro: str | None = None
    schema_registry_username: str | None = None
    schema_registry_password: SecretStr | None = None
    decompress_gzip: bool = False
    dlq_table_location: str | None = None
    dlq_transforms: tuple[str, ...] = ()
    dlq_format: DlqFormat = "deltaflow"
    min_bytes_per_file: int | None = Field(default=None, ge=1)
    schema_evolution: bool = False
    ends_at_latest_offsets: bool = False
    fail_on_data_loss: bool = True
    checkpoint_location: str | None = None
    partition_by: tuple[str, ...] = ()
    kafka_settings: dict[str, SecretStr] = Field(default_factory=dict)
    consumer_group: str | None = None
    commit_to_group: bool = False
    write_path: Literal["auto", "spark", "arrow"] = "auto"
    engine: Literal["auto", "spark", "arrow"] = "auto"
    auto_compact: bool = True
    auto_compact_min_files: int = Field(default=50, ge=2)
    vacuum_interval_hours: float = Field(default=0.0, ge=0)
    table_options: dict[str, Any] = Field(default_factory=dict)
    dlq_table_options: dict[str, Any] = Field(default_factory=dict)
    #: ``debezium``: each topic is a Debezium change stream kept as a mirror table (one row
    #: per key, updates applied, deletes removed) instead of appended.
    cdc: Literal["none", "debezium"] = "none"
    #: ``mirror``: a table per topic kept equal to the database's; ``append``: every change
    #: event a row (``data``, ``event_type``, ``timestamp``, ``stream``: Rivven's shape).
    cdc_mode: Literal["mirror", "append"] = "mirror"
    #: A mirror's key columns (default: the message key's fields).
    key_columns: tuple[str, ...] = ()
    #: A change a mirror cannot apply: ``stop`` the pipeline (the mirror never skips a change),
    #: or ``dead_letter``: into the dead-letter table, and the mirror goes on.
    cdc_errors: Literal["stop", "dead_letter"] = "stop"

    @classmethod
    def build(cls, **values: Any) -> Self:
        """Validate ``values``; every problem in one :class:`ConfigError` naming the option,
        the value received and what is allowed."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(_describe(exc), errors=exc.errors(include_url=False)) from None

    @field_validator("checkpoint_location")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        return absolute_local(value) if value else value  # a Spark Connect server opens it too

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        self._check_topics()
        if self.value_format == "avro" and self.avro is None and not (self.avro_schema or self.soe_avro):
            raise ValueError("Avro values need --avro <schema registry URL, .avsc file or ''> or --soe-avro")
        if sum(x is not None for x in (self.avro, self.soe_avro, self.json_registry)) > 1:
            raise ValueError("--avro, --soe-avro and --json-registry exclude each other")
        if self.json_registry is not None and not self.json_registry.startswith(("http://", "https://")):
            raise ValueError(f"--json-registry must be a schema registry URL, got {self.json_registry!r}")
        if self.decompress_gzip and self.value_format == "raw":
            raise ValueError("--decompress-gzip applies to decoded values (--json or --avro), not --raw")
        if self.dlq_table_location and normalize_uri(self.dlq_table_location) == normalize_uri(
            self.table_uri
        ):
            raise ValueError("--dlq-table-location must be another table than the main one")
        if self.dlq_transforms and not self.dlq_table_location:
            raise ValueError("--dlq-transform needs --dlq-table-location")
        if self.schema_evolution and self.value_format != "json":
            raise ValueError("--schema-evolution applies to JSON values (Avro columns follow the registry)")
        if self.commit_to_group and not self.consumer_group:
            raise ValueError("committing offsets to the consumer group needs --consumer-group-id")
        for key in (*self.table_options, *self.dlq_table_options):
            if key in _INGEST_OWNED or key not in StreamSinkOptions.model_fields:
                raise ValueError(f"table option {key!r} is not one ingest takes from its caller")
        for text in (*self.transforms, *self.dlq_transforms):
            try:
                parse_transform(text).check()
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        self._check_cdc()
        return self

    def _check_cdc(self) -> None:
        if self.cdc == "none":
            if self.key_columns:
                raise ValueError("--key_columns names a mirror's key: it needs --cdc debezium")
            if self.cdc_mode != "mirror" or self.cdc_errors != "stop":
                raise ValueError("--cdc_mode and --cdc_errors apply to --cdc debezium")
            return
        if self.cdc_errors == "dead_letter" and not self.dlq_table_location:
            raise ValueError(
                "--cdc_errors dead_letter needs --dlq_table_location (the changes a mirror passes over "
                "must be kept somewhere)"
            )
        if self.cdc_mode == "append" and self.key_columns:
            raise ValueError("--key_columns names a mirror's key: --cdc_mode append keeps every event")
        refused = {
            "--transform (a mirror's columns are the database table's)": self.transforms,
            "--schema-evolution (a mirror's columns follow the change events)": self.schema_evolution,
            "--engine spark": self.engine == "spark",
            "--seek_offsets": self.seek_offsets,
            "--soe-avro, --json-registry, or --avro other than a schema registry URL (the Avro "
            "converter's messages name their schemas in a registry)": self.soe_avro
            or self.json_registry
            or (self.value_format == "avro" and not (self.avro or "").startswith(("http://", "https://"))),
            "--raw": self.value_format == "raw",
            "--schema (the columns come from the change events)": self.value_schema,
        }
        for what, given in refused.items():
            if given:
                raise ValueError(f"{what} is not available with --cdc {self.cdc}")

    def _check_topics(self) -> None:
        """TOPIC or --topic_pattern, and table templates that fit them."""
        import re

        if bool(self.topics) == bool(self.topic_pattern):
            raise ValueError(
                "give a TOPIC (or several: t1,t2) or --topic_pattern REGEX, not both"
                if self.topic_pattern
                else "give a TOPIC (or several: t1,t2) or --topic_pattern REGEX"
            )
        if self.topic_pattern is not None:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise ValueError(
                    f"--topic_pattern {self.topic_pattern!r} is not a regular expression: {exc}"
                ) from None
        for name, text in (("TABLE_URI", self.table_uri), ("--dlq_table_location", self.dlq_table_location)):
            if text is not None:
                try:
                    TableTemplate.of(
                        text,
                        pattern=self.topic_pattern,
                        several=self.several_topics and name == "TABLE_URI",
                        what=name,
                    )
                except ConfigError as exc:
                    raise ValueError(str(exc)) from None
        if not self.several_topics:
            return
        refused = {
            "--seek_offsets (it names partitions of one topic)": self.seek_offsets,
            "--engine spark": self.engine == "spark",
        }
        for what, given in refused.items():
            if given:
                raise ValueError(f"{what} is not available with several topics (--topic_pattern or t1,t2)")

    @property
    def topics(self) -> tuple[str, ...]:
        """The topics named (none with ``topic_pattern``)."""
        return tuple(t.strip() for t in self.topic.split(",") if t.strip())

    @property
    def mirrors(self) -> bool:
        """Whether each topic's table is a mirror (``--cdc`` with ``--cdc_mode mirror``)."""
        return self.cdc != "none" and self.cdc_mode == "mirror"

    @property
    def topic_tables(self) -> bool:
        """Whether the run takes the many-topics path (a table per topic, one query): several
        topics, or change topics kept as mirrors (one or more)."""
        return self.several_topics or self.cdc != "none"

    @property
    def several_topics(self) -> bool:
        """Whether several topics may be read: a pattern, or a list of topics (each into the
        table its name renders, in one query)."""
        return self.topic_pattern is not None or len(self.topics) > 1

    def table_template(self) -> TableTemplate:
        return TableTemplate.of(self.table_uri, pattern=self.topic_pattern, several=self.several_topics)

    def dlq_template(self) -> TableTemplate | None:
        if self.dlq_table_location is None:
            return None
        return TableTemplate.of(self.dlq_table_location, pattern=self.topic_pattern, several=False)

    def for_one_topic(self) -> Self:
        """One topic whose table URIs are templates: the URIs rendered for it (one table, the
        single-topic ingest)."""
        if self.several_topics:
            return self
        (topic,) = self.topics
        update: dict[str, Any] = {"topic": topic}
        for key in ("table_uri", "dlq_table_location"):
            text = getattr(self, key)
            if text is not None and "{" in text:
                rendered = TableTemplate.of(text, pattern=None, several=False).render(topic)
                if rendered is None:
                    raise ConfigError(f"{key} {text!r} renders no table for topic {topic!r}", topic=topic)
                update[key] = rendered
        return self.model_copy(update=update)

    @property
    def registry_auth(self) -> str | None:
        """``user:password`` for the schema registry's basic auth, if set (never print)."""
        if self.schema_registry_username is None:
            return None
        password = self.schema_registry_password.get_secret_value() if self.schema_registry_password else ""
        return f"{self.schema_registry_username}:{password}"

    @property
    def kafka_conf(self) -> dict[str, str]:
        """The librdkafka settings with their values (for the clients only: never print)."""
        return {k: v.get_secret_value() for k, v in self.kafka_settings.items()}

    def parsed_transforms(self) -> list[Transform]:
        return [parse_transform(t) for t in self.transforms]

    def parsed_dlq_transforms(self) -> list[Transform]:
        return [parse_transform(t) for t in self.dlq_transforms]

    def sink_options(
        self, checkpoint_location: str | None, table_uri: str | None = None
    ) -> StreamSinkOptions:
        """The main table's sink options (``table_uri``: the table a template rendered)."""
        extra: dict[str, Any] = {"partition_columns": list(self.partition_by)}
        if self.min_bytes_per_file:
            extra["target_file_size_mb"] = max(1, self.min_bytes_per_file // (1024 * 1024))
        extra.update(self.table_options)
        return self._table_options(table_uri or self.table_uri, self.pipeline_id, checkpoint_location, extra)

    def dlq_options(self, checkpoint_location: str, table_uri: str | None = None) -> StreamSinkOptions | None:
        """The dead-letter table's sink options (its own txn app id)."""
        if not self.dlq_table_location:
            return None
        app_id = f"{self.pipeline_id}-dlq"
        extra = dict(self.dlq_table_options)
        return self._table_options(table_uri or self.dlq_table_location, app_id, checkpoint_location, extra)

    def _table_options(
        self, table_uri: str, pipeline_id: str, checkpoint_location: str | None, extra: dict[str, Any]
    ) -> StreamSinkOptions:
        return StreamSinkOptions.build(
            {
                "table_uri": table_uri,
                "pipeline_id": pipeline_id,
                "kafka_offsets": True,
                "schema_mode": "merge",
                "write_path": self.write_path,
                "checkpoint_location": checkpoint_location,
                "auto_compact": self.auto_compact,
                "auto_compact_min_files": self.auto_compact_min_files,
                "vacuum_interval_hours": self.vacuum_interval_hours,
                **extra,
            }
        )


def client_security_settings(
    *,
    certificate_pem: str | None = None,
    key_pem: str | None = None,
    ca_pem: str | None = None,
    scram_json: str | None = None,
) -> dict[str, str]:
    """librdkafka settings from kafka-delta-ingest's TLS and SCRAM environment variables.

    ``KAFKA_DELTA_INGEST_CERT``/``_KEY``/``_CA`` hold PEM text (``ssl.certificate.pem``,
    ``ssl.key.pem``, ``ssl.ca.pem``); ``KAFKA_DELTA_INGEST_SCRAM_JSON`` holds
    ``{"username": ..., "password": ...}`` (``sasl.username``, ``sasl.password``). Like
    kafka-delta-ingest, nothing else is implied: ``security.protocol`` and ``sasl.mechanism``
    come from ``-K``.

    Raises:
        ConfigError: the SCRAM JSON is not an object with string ``username`` and ``password``.
    """
    out = {
        key: value
        for key, value in (
            ("ssl.certificate.pem", certificate_pem),
            ("ssl.key.pem", key_pem),
            ("ssl.ca.pem", ca_pem),
        )
        if value
    }
    if scram_json:
        import json

        try:
            scram = json.loads(scram_json)
        except ValueError:
            scram = None
        if not isinstance(scram, dict) or not all(
            isinstance(scram.get(k), str) for k in ("username", "password")
        ):
            # The value is a secret: never quote it.
            raise ConfigError(
                'KAFKA_DELTA_INGEST_SCRAM_JSON must be a JSON object {"username": "...", '
                '"password": "..."} (value not shown)'
            )
        out["sasl.username"] = scram["username"]
        out["sasl.password"] = scram["password"]
    return out


def _describe(exc: ValidationError) -> str:
    return "invalid ingest options: " + "; ".join(problems(exc))
