"""Many topics, one query: ``deltaflow ingest --topic_pattern REGEX TEMPLATE`` (or ``t1,t2``).

Every topic the pattern matches (or the list names) goes to the table its name renders
(:class:`~deltaflow.config.table_template.TableTemplate`), in ONE streaming query on the Arrow
engine: one source, tasks sized by the messages waiting (many small topic-partitions share a
task), one file per table a task holds, and per batch one commit per table that got messages,
side by side, each with the per-partition txns of its own topics under the same txn ids as
ingest of one topic (a table moves between ``ingest TOPIC`` and ``--topic_pattern`` and keeps
its place). Nothing is planned per topic in Spark.

Start-up resolves each table once (:class:`TablePreparer`): loads it, or makes it (columns from
``--schema``, else inferred from its topic's messages, all topics in one Spark job), claims it,
and hands the planner a :class:`~deltaflow.sources.topic_routes.TopicRoute` per topic. A topic
that starts to match while the query runs is listed by the planner in a batch's end offsets;
that batch makes its table (the same way) and the next one reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltaflow.config.ingest import IngestConfig
from deltaflow.config.locations import normalize_uri
from deltaflow.config.table_template import static_prefix
from deltaflow.errors import ConfigError, DeltaflowError

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from deltaflow.pipeline.arrow_ingest import MainSink
    from deltaflow.sinks.datasource import _DeltaSink
    from deltaflow.sources.kafka import Decoding
    from deltaflow.sources.topic_routes import TopicRouter

__all__ = ["TablePreparer", "ingest_topics", "start"]

logger = logging.getLogger(__name__)


def start(
    spark: SparkSession, config: IngestConfig, *, on_engine: Callable[[str], None] | None = None
) -> StreamingQuery:
    """Start ``deltaflow ingest``: one topic (:func:`deltaflow.pipeline.ingest.ingest`), or
    several into a table each (:func:`ingest_topics`)."""
    if config.topic_tables:
        return ingest_topics(spark, config, on_engine=on_engine)
    from deltaflow.pipeline.ingest import ingest

    return ingest(spark, config, on_engine=on_engine)


def ingest_topics(
    spark: SparkSession, config: IngestConfig, *, on_engine: Callable[[str], None] | None = None
) -> StreamingQuery:
    """Start ingesting every topic of ``config`` (a pattern or a list) into its table."""
    from deltaflow.pipeline.api import register
    from deltaflow.pipeline.arrow_ingest import ArrowIngestWriter, IngestTables, arrow_blockers, arrow_stream
    from deltaflow.pipeline.evolution import SCHEMA_SAMPLE_PER_PARTITION
    from deltaflow.pipeline.session import default_parallelism
    from deltaflow.sources.kafka import KafkaSourceOptions, topic_partitions
    from deltaflow.sources.kafka_ingest import IngestPlan, check_plan

    blockers = arrow_blockers(config)
    if blockers:
        raise ConfigError(
            f"ingest of several topics runs on the Arrow engine, which cannot run {', and '.join(blockers)}",
            pipeline_id=config.pipeline_id,
        )
    if config.value_format == "avro" and (config.avro == "" or config.soe_avro):
        raise ConfigError(
            "ingest of several topics takes Avro values through a schema registry (--avro URL: "
            "each topic's subject <topic>-value) or one .avsc file; container files (--avro '') "
            "and single-object encoding (--soe-avro) need one ingest per topic",
            pipeline_id=config.pipeline_id,
        )
    register(spark)
    location = config.checkpoint_location or _default_checkpoint(config)
    options = topics_source_options(config)
    layout = topic_partitions(KafkaSourceOptions.from_spark_options(options))
    preparer = TablePreparer(spark, config, location)
    matched = sorted(layout)
    logger.info(
        "%d topic(s) match %s: %s",
        len(matched),
        f"--topic_pattern {config.topic_pattern!r}" if config.topic_pattern else "the list",
        ", ".join(matched[:50]) + (" ..." if len(matched) > 50 else ""),
    )
    routes = preparer.prepare(matched, at_start=True)
    plan = IngestPlan(
        source_schema_ipc=preparer.kafka_schema.serialize().to_pybytes(),
        routes=routes,
        router=preparer.router,
        pipeline_id=config.pipeline_id,
        made=preparer.made,
        transforms=tuple(config.transforms),
        dlq_transforms=tuple(config.dlq_transforms),
        dlq_pipeline_id=f"{config.pipeline_id}-dlq" if config.dlq_table_location else None,
        dlq_format=config.dlq_format,
        sample_unknown=SCHEMA_SAMPLE_PER_PARTITION if config.schema_evolution else 0,
        task_parallelism=default_parallelism(spark),
        min_task_messages=config.min_task_messages,
        cdc=config.cdc,
        cdc_mode=config.cdc_mode,
        key_columns=config.key_columns,
        registry_url=config.avro if config.cdc != "none" and config.value_format == "avro" else None,
        registry_auth=config.registry_auth,
    )
    check_plan(plan)  # what the Arrow engine cannot run fails here, before the query starts
    tables = IngestTables(
        preparer.sinks,
        preparer.dead_letter_sinks,
        checkpoint=config.sink_options(location, table_uri=static_prefix(config.table_uri)),
        table_of=preparer.router.table_uri,
        dead_letters_of=preparer.router.dead_letter_uri,
        make=preparer.make,
        open_sink=preparer.open_sink,
        open_dead_letters=preparer.open_dead_letters,
    )
    group = None
    if config.commit_to_group:
        group = {
            "bootstrap.servers": config.brokers,
            **config.kafka_conf,
            "group.id": config.consumer_group or "",
        }
    writer = ArrowIngestWriter(
        tables,
        pipeline_id=config.pipeline_id,
        group_config=group,
        schema_evolution=config.schema_evolution,
        gzipped=config.decompress_gzip,
        follow_table=config.value_format == "json" and config.cdc == "none",
        stop_mirrors=config.cdc_errors == "stop",
    )
    stream = arrow_stream(spark, options, plan, writer)
    stream = stream.option("checkpointLocation", location).queryName(config.pipeline_id)
    if config.ends_at_latest_offsets:
        stream = stream.trigger(availableNow=True)
    if on_engine is not None:
        on_engine("arrow")
    logger.info(
        "ingesting %d topic(s) from %s into %d %s of %s%s (checkpoint %s; arrow engine)",
        len(routes),
        config.brokers,
        len(preparer.sinks),
        "mirror table(s)" if config.mirrors else "table(s)",
        config.table_uri,
        f", dead letters into {config.dlq_table_location}" if config.dlq_table_location else "",
        location,
    )
    from deltaflow.pipeline.session import start_query

    return start_query(stream, spark, config.pipeline_id)


def topics_source_options(config: IngestConfig) -> dict[str, str]:
    """The ``deltaflow-kafka-ingest`` source's options: the topics, pacing and the client's
    settings. Values decode per topic (each table's columns), so the source itself reads bytes."""
    from deltaflow.pipeline.ingest import kafka_reader_options

    options = kafka_reader_options(config)
    if config.topic_pattern:
        options["topic_pattern"] = config.topic_pattern
    else:
        options["topic"] = ",".join(config.topics)
    return options


def _default_checkpoint(config: IngestConfig) -> str:
    """``<the template's folder>/_deltaflow/checkpoints/<pipeline_id>`` for local tables."""
    from deltaflow.delta.layout import checkpoint_dir

    prefix = static_prefix(config.table_uri)
    if "://" in prefix and not prefix.startswith("file://"):
        raise ConfigError(
            f"tables {config.table_uri!r} are not on the local filesystem: pass "
            "--checkpoint_location (a local or HDFS path that survives restarts)",
            table_uri=config.table_uri,
        )
    return checkpoint_dir(prefix, config.pipeline_id)


class TablePreparer:
    """Resolves topics into routes: each table loaded or made, claimed, and its sink opened, once.

    Used at start for every topic that matches, and from the query's batches for topics that
    start to match later (``at_start`` false: a topic that cannot get a table is logged and
    left for later instead of stopping the query).
    """

    def __init__(self, spark: SparkSession, config: IngestConfig, checkpoint_location: str) -> None:
        from deltaflow.delta.schema import spark_to_arrow
        from deltaflow.pipeline.ingest import empty_source

        self._spark = spark
        self._config = config
        self._location = checkpoint_location
        self._template = config.table_template()
        self._dlq_template = config.dlq_template()
        self.sinks: dict[str, MainSink] = {}
        self.dead_letter_sinks: dict[str, _DeltaSink] = {}
        #: Tables this process made, claimed by their creation (URI -> writer epoch).
        self._claimed: dict[str, int] = {}
        raw = empty_source(spark, {"bootstrap_servers": config.brokers, "topic": "x"})
        self.kafka_schema: pa.Schema = spark_to_arrow(raw.schema)
        self._given = self._given_schema()
        self._dlq_schema = self._dead_letter_schema() if config.dlq_table_location else None
        self.router: TopicRouter = self._router()

    # -- what every table shares ---------------------------------------------------------------

    def _given_schema(self) -> pa.Schema | None:
        """``--schema`` as Arrow fields."""
        if not self._config.value_schema:
            return None
        from pyspark.sql.types import StructType

        from deltaflow.delta.schema import spark_to_arrow

        parsed = StructType.fromDDL(self._config.value_schema)
        if not isinstance(parsed, StructType):
            raise ConfigError(f"--schema must list columns, got {self._config.value_schema!r}")
        return spark_to_arrow(parsed)

    def _dead_letter_schema(self) -> pa.Schema:
        """The dead-letter rows' columns (the same for every topic), as ingest of one topic has them."""
        from deltaflow.delta.schema import spark_to_arrow
        from deltaflow.pipeline.dead_letters import ingest_letters
        from deltaflow.pipeline.ingest import build_ingest_frame, empty_source

        one = self._config.model_copy(
            update={"topic": "dead-letters", "topic_pattern": None, "value_format": "raw", "transforms": ()}
        )
        raw = empty_source(self._spark, {"bootstrap_servers": one.brokers, "topic": "x"})
        frame = build_ingest_frame(self._spark, one, raw)
        letters = ingest_letters(frame, self._config.parsed_dlq_transforms(), self._config.dlq_format)
        return spark_to_arrow(letters.schema)

    def _decoding(self) -> Decoding:
        from deltaflow.sources.kafka import METADATA_COLUMNS, Decoding

        config = self._config
        options = topics_source_options(config)
        formats = {"raw": "binary", "json": "json", "avro": "avro"}
        registry = config.json_registry
        avro_schema = config.avro_schema
        if config.value_format == "avro" and config.avro:
            if config.avro.startswith(("http://", "https://")):
                registry = config.avro
            elif not avro_schema:
                try:
                    avro_schema = Path(config.avro).read_text()
                except OSError as exc:
                    raise ConfigError(f"cannot read the Avro schema file {config.avro!r}: {exc}") from None
        return Decoding(
            # Change events are read whole by the tasks (sources/change_topics.py).
            value_format="binary" if config.cdc != "none" else formats[config.value_format],
            arrow_schema=self.kafka_schema,
            compression="gzip" if config.decompress_gzip else "none",
            keep_value=options.get("keep_value") == "true",
            metadata=frozenset(c for c in options["metadata"].split(",") if c in METADATA_COLUMNS),
            avro_schema=avro_schema,
            registry_url=registry,
            registry_auth=config.registry_auth,
        )

    def _router(self) -> TopicRouter:
        from deltaflow.pipeline.arrow_ingest import table_files
        from deltaflow.sources.topic_routes import TopicRouter

        main = self._config.sink_options(self._location, table_uri=self._template.text.replace("{", "_"))
        files = table_files(main, self.kafka_schema)
        letters = None
        if self._dlq_schema is not None and self._dlq_template is not None:
            dlq = self._config.dlq_options(
                self._location, table_uri=self._dlq_template.text.replace("{", "_")
            )
            assert dlq is not None
            letters = table_files(dlq, self._dlq_schema)
        return TopicRouter(
            table=self._template,
            files=files,
            kafka_schema_ipc=self.kafka_schema.serialize().to_pybytes(),
            decoding=self._decoding(),
            dead_letters=self._dlq_template,
            dead_letter_files=letters,
            given_schema_ipc=self._given.serialize().to_pybytes() if self._given is not None else None,
            produced=tuple(t.target for t in self._config.parsed_transforms()),
        )

    # -- per table ----------------------------------------------------------------------------

    def prepare(self, topics: Sequence[str], *, at_start: bool) -> dict[str, Any]:
        """The routes of ``topics``: their tables loaded, or made; claimed; sinks opened.

        Raises:
            ConfigError: at start, a table that cannot be made (no messages to infer its
                columns from is not one: that topic waits) or whose partitioning differs.
        """
        from deltaflow.delta import log as delta_log

        by_table: dict[str, list[str]] = {}
        for topic in topics:
            uri = self._template.render(topic)
            if uri is None:
                logger.warning("topic %r renders no table from %r: not read", topic, self._template.text)
                continue
            if uri in self.dead_letter_sinks or uri == self.router.dead_letter_uri(topic):
                logger.error("topic %r renders the dead-letter table %s as its table: not read", topic, uri)
                continue
            by_table.setdefault(uri, []).append(topic)
        storage = self._storage()
        tables = delta_log.side_by_side(lambda u: delta_log.load(u, storage), list(by_table), name="prepare")
        loaded = dict(zip(by_table, tables, strict=True))
        missing = {uri: ts for uri, ts in by_table.items() if loaded[uri] is None}
        if missing:
            made = self._make_tables(missing, at_start=at_start)
            loaded.update(made)
        self._check_partitioning({u: t for u, t in loaded.items() if t is not None}, at_start=at_start)
        ready = [u for u in by_table if loaded.get(u) is not None]
        self._open_sinks(ready, loaded)
        routes = {}
        for uri in ready:
            for topic in by_table[uri]:
                route = self.router.resolve(topic, loaded[uri])
                if route is not None:
                    routes[topic] = route
        for uri in sorted({r.dead_letters.table_uri for r in routes.values() if r.dead_letters is not None}):
            self.open_dead_letters(uri)
        if not at_start and routes:
            logger.info("new topic(s) %s: their tables are ready, read from the next batch", sorted(routes))
        return routes

    @property
    def made(self) -> frozenset[str]:
        """The tables this process made, claimed by their creation (no progress in them)."""
        return frozenset(self._claimed)

    def make(self, topics: Sequence[str]) -> None:
        """Tables for topics that started to match while the query runs."""
        self.prepare(topics, at_start=False)

    def open_sink(self, uri: str) -> MainSink:
        """The sink of a table the planner routed a topic to (one that exists)."""
        from deltaflow.delta import log as delta_log

        table = delta_log.load(uri, self._storage())
        if table is None:
            raise ConfigError(f"table {uri!r} is gone", table_uri=uri)
        self._open_sinks([uri], {uri: table})
        return self.sinks[uri]

    def _storage(self) -> dict[str, str]:
        return dict(self._config.table_options.get("storage_options") or {})

    def _make_tables(self, missing: Mapping[str, list[str]], *, at_start: bool) -> dict[str, Any]:
        """Make the tables of ``missing`` (URI -> its topics): columns from ``--schema``, raw
        values, or inferred from the topics' messages."""
        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log
        from deltaflow.delta.schema import check_partition_columns
        from deltaflow.sinks.kafka_mirror import mirror_table_schema
        from deltaflow.sources.change_topics import EVENT_SCHEMA
        from deltaflow.sources.kafka_ingest import table_schema

        mirrors = self._config.mirrors
        events = self._config.cdc != "none" and not mirrors
        if events:
            values = {uri: EVENT_SCHEMA for uri in missing}
        elif mirrors:
            values = self._change_fields(missing)
        else:
            values = self._value_fields(missing, at_start=at_start)
        schemas: dict[str, pa.Schema] = {}
        for uri, fields in values.items():
            if events:
                schema = fields
            elif mirrors:
                schema = mirror_table_schema(fields)
            else:
                source = self.router.decoding_for(fields, missing[uri][0]).arrow_schema
                schema = table_schema(source, self._config.transforms)
            try:
                check_partition_columns(schema, list(self._config.partition_by), uri)
            except DeltaflowError as exc:
                if at_start:
                    raise
                logger.error("topic(s) %s get no table: %s", missing[uri], exc)
                continue
            schemas[uri] = schema
        options = self._config.sink_options(self._location)

        def make(uri: str) -> Any:
            # The creating commit claims the table too (one commit per table, not two).
            table, fence = commit.create_claimed_table(
                uri,
                schemas[uri],
                partition_by=list(self._config.partition_by),
                properties=options.table_properties,
                storage_options=self._storage(),
                claim=self._config.pipeline_id,
            )
            if fence is not None:
                self._claimed[normalize_uri(uri)] = fence.epoch
            return table

        made = dict(zip(schemas, delta_log.side_by_side(make, list(schemas), name="prepare"), strict=True))
        if made:
            logger.info("made %d table(s): %s", len(made), ", ".join(sorted(made)[:20]))
        if self._config.auto_offset_reset == "latest" and not at_start:
            self._start_at_latest({uri: missing[uri] for uri in made})
        return made

    def _value_fields(self, missing: Mapping[str, list[str]], *, at_start: bool) -> dict[str, pa.Schema]:
        """Each missing table's value fields: ``--schema``'s, ``value`` for raw values, or
        inferred from its topics' messages (one Spark job for them all)."""
        import pyarrow as pa

        if self._config.value_format == "raw":
            return {uri: pa.schema([]) for uri in missing}
        if self._given is not None:
            return {uri: self._given for uri in missing}
        if self._config.value_format == "avro":
            return {uri: self._avro_fields(topics[0]) for uri, topics in missing.items()}
        from pyspark.sql.types import StructType

        from deltaflow.delta.schema import spark_to_arrow
        from deltaflow.pipeline.evolution import infer_json
        from deltaflow.pipeline.ingest import sample_topics

        topics = sorted({t for ts in missing.values() for t in ts})
        samples = sample_topics(self._config, topics)
        index = {t: i for i, t in enumerate(topics)}
        # One inference for every topic: each message wrapped as {"t<i>": message}.
        wrapped = [f'{{"t{index[t]}":{text}}}' for t, texts in samples.items() for text in texts]
        inferred = infer_json(self._spark, wrapped)
        types = {f.name: f.dataType for f in inferred.fields}
        out = {}
        for uri, ts in missing.items():
            fields: dict[str, Any] = {}
            for t in ts:
                found = types.get(f"t{index[t]}")
                if isinstance(found, StructType):
                    for f in found.fields:
                        fields.setdefault(f.name, f)
            if not fields:
                why = "has no messages" if not any(samples.get(t) for t in ts) else "has no JSON objects"
                logger.warning(
                    "topic(s) %s %s to infer columns from: no table yet (it is made once there are; "
                    "or pass --schema)",
                    ts,
                    why,
                )
                continue
            out[uri] = spark_to_arrow(StructType(list(fields.values())))
        return out

    def _change_fields(self, missing: Mapping[str, list[str]]) -> dict[str, pa.Schema]:
        """Each missing mirror's columns: the row schema of its topics' first change event with
        one (the JSON converter's ``schemas.enable``), else inferred from the events' rows."""
        import json

        from pyspark.sql.types import StructType

        from deltaflow.delta.schema import spark_to_arrow
        from deltaflow.pipeline.evolution import infer_json
        from deltaflow.pipeline.ingest import sample_topics
        from deltaflow.sources.debezium import row_schema

        out: dict[str, pa.Schema] = {}
        if self._config.value_format == "avro":
            for uri, ts in missing.items():
                found = self._avro_row(ts[0])
                if found is not None:
                    out[uri] = found
            return out
        topics = sorted({t for ts in missing.values() for t in ts})
        samples = sample_topics(self._config, topics)
        rows: dict[str, list[str]] = {}
        for uri, ts in missing.items():
            for text in (x for t in ts for x in samples.get(t, [])):
                schema, row = row_schema(text)
                if schema is not None:
                    out[uri] = schema
                    break
                if row is not None:
                    rows.setdefault(uri, []).append(json.dumps(row))
        for uri, texts in rows.items():
            if uri in out:
                continue
            inferred = infer_json(self._spark, texts)
            # A column NULL in every row sampled has no type yet (Spark's inference says STRING):
            # it is added with the type of its first value (sinks/kafka_mirror.py).
            valued = {k for t in texts for k, v in json.loads(t).items() if v is not None}
            if isinstance(inferred, StructType):
                inferred = StructType([f for f in inferred.fields if f.name in valued])
            if isinstance(inferred, StructType) and inferred.fields:
                out[uri] = spark_to_arrow(inferred)
        for uri, ts in missing.items():
            if uri not in out:
                logger.warning(
                    "topic(s) %s have no change event to take the mirror's columns from: no table yet "
                    "(it is made once there is one)",
                    ts,
                )
        return out

    def _avro_row(self, topic: str) -> pa.Schema | None:
        """A Debezium topic's row columns from its registry subject ``<topic>-value`` (the
        envelope's ``after``), ``None`` (logged) while the subject has no schema."""
        import json

        from deltaflow.sources.debezium import connect_schema, envelope_columns
        from deltaflow.sources.decode import SchemaRegistry

        registry = SchemaRegistry(self._config.avro or "", basic_auth=self._config.registry_auth)
        try:
            _, text = registry.latest(f"{topic}-value")
        except ConfigError:
            logger.warning(
                "topic %r: the registry has no subject %r yet: no table yet", topic, f"{topic}-value"
            )
            return None
        columns = envelope_columns(connect_schema(json.loads(text)))
        if columns is None:
            raise ConfigError(
                f"topic {topic!r}: the latest schema of {topic}-value is no Debezium envelope (no 'after')",
                topic=topic,
            )
        return columns

    def _avro_fields(self, topic: str) -> pa.Schema:
        """The columns of ``topic``'s Avro reader schema."""
        from pyspark.sql.types import StructType

        from deltaflow.delta.schema import spark_to_arrow
        from deltaflow.sources.decode import avro_to_spark_ddl

        reader = self.router.reader_schema(topic)
        assert reader is not None
        parsed = StructType.fromDDL(avro_to_spark_ddl(reader))
        assert isinstance(parsed, StructType)
        return spark_to_arrow(parsed)

    def _start_at_latest(self, made: Mapping[str, list[str]]) -> None:
        """``--auto_offset_reset latest`` for topics that appeared while running: their new
        tables record the topics' current ends as progress (no files), so reading starts there."""
        from deltaflow.pipeline.ingest import record_progress
        from deltaflow.sources.kafka import KafkaSourceOptions, topic_partitions, watermarks

        options = KafkaSourceOptions.from_spark_options(topics_source_options(self._config))
        layout = topic_partitions(options)
        for uri, topics in made.items():
            ends = watermarks(options, {t: layout[t] for t in topics if t in layout}, "latest")
            last = {t: {p: o - 1 for p, o in parts.items() if o > 0} for t, parts in ends.items()}
            record_progress(self._config.sink_options(self._location, table_uri=uri), last)

    def _check_partitioning(self, tables: Mapping[str, Any], *, at_start: bool) -> None:
        given = list(self._config.partition_by)
        if not given:
            return
        wrong = {
            u: list(t.metadata().partition_columns)
            for u, t in tables.items()
            if list(t.metadata().partition_columns) != given
        }
        if wrong:
            detail = "; ".join(f"{u} by {p}" for u, p in sorted(wrong.items())[:10])
            raise ConfigError(
                f"--partition_by {given} differs from existing tables' partitioning ({detail}); an "
                "existing table keeps its partitioning: drop --partition_by to use each table's",
                table_uri=next(iter(wrong)),
            )

    def _open_sinks(self, uris: Sequence[str], tables: Mapping[str, Any]) -> None:
        """Claim each table (side by side) and open its sink."""
        import pyarrow as pa

        from deltaflow.delta.schema import plain_schema
        from deltaflow.pipeline.api import claim_all
        from deltaflow.sinks.datasource import _DeltaSink

        new = [u for u in uris if u not in self.sinks]
        options = [
            self._config.sink_options(self._location, table_uri=u).model_copy(
                update={"partition_columns": tuple(tables[u].metadata().partition_columns)}
            )
            for u in new
        ]
        for opts in claim_all(options, claimed=self._claimed):
            uri = normalize_uri(opts.table_uri)
            if self._config.mirrors:
                from deltaflow.sinks.kafka_mirror import KafkaMirrorSink

                self.sinks[uri] = KafkaMirrorSink(opts)
                continue
            schema = plain_schema(pa.schema(tables[uri].schema().to_arrow()))
            self.sinks[uri] = _DeltaSink(opts, schema, overwrite=False)

    def open_dead_letters(self, uri: str) -> _DeltaSink:
        """The dead-letter table at ``uri``: made if missing, claimed, its sink opened (once)."""
        from deltaflow.pipeline.api import _prepare_table_schema, claim_all
        from deltaflow.sinks.datasource import _DeltaSink

        sink = self.dead_letter_sinks.get(uri)
        if sink is None:
            assert self._dlq_schema is not None
            dlq = self._config.dlq_options(self._location, table_uri=uri)
            assert dlq is not None
            _prepare_table_schema(self._dlq_schema, dlq)
            (claimed,) = claim_all([dlq])
            sink = self.dead_letter_sinks[uri] = _DeltaSink(claimed, self._dlq_schema, overwrite=False)
        return sink
