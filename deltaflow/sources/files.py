"""Files in a folder as a Spark streaming source: json, csv, parquet, avro and text.

Which files a micro-batch takes is decided by :mod:`deltaflow.sources.file_listing` (a file is
taken once, whole: only when it is ``min_file_age`` old); the batch then reads them with Spark's
readers, with what pipelines need on top: JSON with a rescued-data column for unknown fields,
wrong types and bad lines (or, with a dead-letter table, lines that are no JSON object split
off); CSV by header names; Avro through Spark's ``binaryFile`` and fastavro (no jar); a schema
given or inferred once and kept in the pipeline's checkpoint; limits per trigger.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.config.pipeline import FilesSourceSpec
from deltaflow.errors import ConfigError, SourceFilesGoneError, brief

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "BINARY_FILE_SCHEMA",
    "ERROR_COLUMN",
    "RECORD_COLUMN",
    "SOURCE_SCHEMA_FILE",
    "BatchFiles",
    "files_stream",
    "read_files",
    "source_schema",
]

logger = logging.getLogger(__name__)

#: Where a file source's inferred schema is kept (inside the pipeline's checkpoint).
SOURCE_SCHEMA_FILE = "deltaflow-source-schema.json"
#: Reader options about finding files, not parsing them (not given to ``from_json``).
_FILE_ONLY_OPTIONS = frozenset(
    {
        "pathGlobFilter",
        "recursiveFileLookup",
        "basePath",
        "modifiedBefore",
        "modifiedAfter",
        "latestFirst",
        "cleanSource",
        "sourceArchiveDir",
        "maxFileAge",
        "fileNameOnly",
    }
)
#: With dead letters: why a line is no record (null for records), and the file and line as JSON.
ERROR_COLUMN = "_deltaflow_error"
RECORD_COLUMN = "_deltaflow_record"
#: The reason of a JSON line that is not one JSON object.
MALFORMED_LINE = "malformed JSON: the line is not one JSON object"
#: The rows of Spark's ``binaryFile`` source (Avro files are read through it).
BINARY_FILE_SCHEMA = "path STRING, modificationTime TIMESTAMP, length BIGINT, content BINARY"


def files_stream(spark: SparkSession, src: FilesSourceSpec, checkpoint: str) -> DataFrame:
    """The files each micro-batch takes, one row (``path``) per file
    (:mod:`deltaflow.sources.file_listing`); :class:`BatchFiles` reads their rows.

    ``checkpoint`` is the pipeline's Spark checkpoint, where the files taken are recorded.
    """
    from deltaflow.sources.file_listing import FileListingDataSource
    from deltaflow.sources.streams import load_stream

    options = {k.lower(): v for k, v in src.options.items()}
    listing = {
        "path": src.path,
        "checkpoint": checkpoint,
        "min_file_age_s": str(src.min_file_age),
        "recursive": options.get("recursivefilelookup", "false").lower(),
    }
    glob = options.get("pathglobfilter") or ("*.avro" if src.format == "avro" else None)
    if glob:
        listing["path_glob_filter"] = glob
    if src.max_files_per_trigger:
        listing["max_files_per_trigger"] = str(src.max_files_per_trigger)
    if src.max_bytes_per_trigger:
        listing["max_bytes_per_trigger"] = str(src.max_bytes_per_trigger)
    return load_stream(spark, FileListingDataSource, listing)


class BatchFiles:
    """A micro-batch of :func:`files_stream` (its files) as the rows of those files.

    With ``dead_letters`` (a JSON source of a pipeline with a dead-letter table) the rows carry
    :data:`ERROR_COLUMN` (why a line is no record: it does not parse as one JSON object; null for
    the others) and :data:`RECORD_COLUMN` (the file and the line, as JSON).
    """

    def __init__(self, src: FilesSourceSpec, schema: StructType, *, dead_letters: bool) -> None:
        self.src, self.schema, self.dead_letters = src, schema, dead_letters

    def __call__(self, listing: DataFrame) -> DataFrame:
        paths = sorted({row[0] for row in listing.collect()})
        gone = _gone(paths)
        if gone:
            # The same outcome for the batch and for its replay (which takes the same files).
            shown = ", ".join(gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
            if not _ignore_missing(self.src):
                raise SourceFilesGoneError(
                    f"{len(gone)} of the {len(paths)} file(s) a batch of the files source {self.src.path} "
                    f"took were deleted before the batch read them: {shown}; nothing of the batch was "
                    "committed, and its replay takes the same files. Put them back and restart, or set "
                    "the reader option ignoreMissingFiles: 'true' (options of the source, Spark's name) "
                    "to skip files deleted after they were listed, each named in a warning",
                    path=self.src.path,
                    files=len(gone),
                )
            logger.warning(
                "files source %s: %d file(s) the batch took were deleted before it read them, skipped "
                "(ignoreMissingFiles): %s",
                self.src.path,
                len(gone),
                shown,
            )
            skipped = set(gone)
            paths = [p for p in paths if p not in skipped]
        return read_files(listing.sparkSession, self.src, self.schema, paths, dead_letters=self.dead_letters)


def _ignore_missing(src: FilesSourceSpec) -> bool:
    return any(k.lower() == "ignoremissingfiles" and str(v).lower() == "true" for k, v in src.options.items())


def _gone(paths: Sequence[str]) -> list[str]:
    """Those of ``paths`` (URIs as the listing gave them) that storage no longer has
    (:func:`deltaflow.delta.log.missing_files`, once per store).

    A listed URI is the store's location plus the key as listed: never parsed as a URL, whose
    ``#`` or ``?`` would cut a legal key short (``a#1.json``).

    Raises:
        StorageUnavailableError / StorageAccessError: storage could not be asked.
    """
    import os

    from deltaflow.delta.log import missing_files

    stores: dict[str, list[tuple[str, str]]] = {}  # store -> (URI, key below the store's root)
    for uri in paths:
        scheme, sep, rest = uri.partition("://")
        netloc, _, key = rest.partition("/") if sep else ("", "", os.path.abspath(uri))
        stores.setdefault(f"{scheme}://{netloc}" if sep else "/", []).append((uri, key))
    gone = []
    for store, items in stores.items():
        missing = set(missing_files(store, {}, [key for _, key in items]))
        gone += [uri for uri, key in items if key in missing]
    return gone


def read_files(
    spark: SparkSession,
    src: FilesSourceSpec,
    schema: StructType,
    paths: list[str],
    *,
    dead_letters: bool = False,
) -> DataFrame:
    """The rows of the files ``paths`` (no path: an empty frame of the rows' columns), read with
    Spark's readers and ``src``'s options.

    JSON, CSV and Parquet files in partition folders (``landing/country=fr/...``) are read with
    the landing folder as Spark's ``basePath``, so a column of ``schema`` named as a partition
    key is filled from the path, as Spark's file source filled it (the path wins over a field of
    the same name in the file); a key the schema does not name is no column. Files directly in
    the folder are read apart: Spark drops them from a read that finds partitions.
    """
    plain, partitioned, keys = _by_partition(src, paths)
    frames = []
    if plain or not partitioned:
        frames.append(_read(spark, src, schema, plain, keys=[], dead_letters=dead_letters))
    if partitioned:
        frames.append(_read(spark, src, schema, partitioned, keys=keys, dead_letters=dead_letters))
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    return df


def _by_partition(src: FilesSourceSpec, paths: list[str]) -> tuple[list[str], list[str], list[str]]:
    """``paths`` split into those directly in the landing folder and those in its partition
    folders, with the partition keys (in path order); one group for formats read without
    partition columns (text, Avro) and with ``recursiveFileLookup`` (Spark infers none)."""
    from urllib.parse import unquote

    from deltaflow.sources.file_listing import is_partition_folder

    options = {k.lower(): v.lower() for k, v in src.options.items()}
    if src.format in ("text", "avro") or options.get("recursivefilelookup") == "true":
        return paths, [], []
    root = normalize_uri(src.path).rstrip("/") + "/"
    plain: list[str] = []
    partitioned: list[str] = []
    keys: list[str] = []
    for path in paths:
        folders = path[len(root) :].split("/")[:-1] if path.startswith(root) else []
        if folders and all(is_partition_folder(f) for f in folders):
            partitioned.append(path)
            keys.extend(k for k in (unquote(f.partition("=")[0]) for f in folders) if k not in keys)
        else:
            plain.append(path)
    return plain, partitioned, keys


def _read(
    spark: SparkSession,
    src: FilesSourceSpec,
    schema: StructType,
    paths: list[str],
    *,
    keys: Sequence[str],
    dead_letters: bool,
) -> DataFrame:
    """The rows of ``paths``; with partition ``keys``, read below the landing folder as
    ``basePath`` and with the columns of ``schema`` only (see :func:`read_files`)."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StringType, StructField, StructType

    options = dict(src.options)
    if src.format == "csv":
        options.setdefault("header", "true")
        # Columns by their header names, not by position (files with reordered columns).
        options.setdefault("enforceSchema", "false")
    if keys:
        options.setdefault("basePath", normalize_uri(src.path))
    reader = spark.read.options(**options)
    if src.format == "text":
        df = reader.format("text").load(paths)
    elif src.format == "avro":
        files = reader.schema(BINARY_FILE_SCHEMA).format("binaryFile").load(paths)
        return _avro_files(files, schema, src)
    elif src.format == "json":
        # The partition keys as columns of the lines: of the schema's type where it names them
        # (as Spark's JSON reader types them), else strings (unused).
        types = {f.name.lower(): f.dataType for f in schema.fields}
        from_path = {f.name: k for k in keys for f in schema.fields if f.name.lower() == k.lower()}
        if keys:
            columns = [StructField(k, types.get(k.lower(), StringType())) for k in keys]
            reader = reader.schema(StructType([StructField("value", StringType()), *columns]))
        lines = reader.format("text").load(paths)
        df = _json_lines(
            lines, schema, src.rescued_data_column, options, dead_letters=dead_letters, from_path=from_path
        )
    else:
        read_as = schema
        if src.format == "csv" and src.rescued_data_column:
            read_as = StructType([*schema.fields, StructField(src.rescued_data_column, StringType())])
            reader = reader.option("mode", "PERMISSIVE").option(
                "columnNameOfCorruptRecord", src.rescued_data_column
            )
        df = reader.schema(read_as).format(src.format).load(paths)
        if keys:  # Spark adds the keys the schema does not name, and moves those it does last
            df = df.select(*(F.col(f"`{f.name}`") for f in read_as.fields))
    if src.source_file_column:
        df = df.withColumn(src.source_file_column, F.col("_metadata.file_path"))
    return df


def source_schema(spark: SparkSession, src: FilesSourceSpec, checkpoint: str) -> StructType:
    """The given schema, else the one inferred at the first start and kept in the checkpoint."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    if src.schema_:
        parsed = _parse_datatype_string(src.schema_)
        if not isinstance(parsed, StructType):
            raise ConfigError(f"files source schema {src.schema_!r} is not a list of columns")
        return parsed
    stored = Path(checkpoint) / SOURCE_SCHEMA_FILE
    if stored.exists():
        loaded = StructType.fromJson(json.loads(stored.read_text()))
        logger.info("files source %s: schema from %s", src.path, stored)
        return loaded
    if src.format == "avro":
        schema = _avro_file_schema(spark, src)
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_text(json.dumps(schema.jsonValue()))
        logger.info("files source %s: schema %s from the first Avro file", src.path, schema.simpleString())
        return schema
    options = dict(src.options)
    if src.format == "csv":
        options.setdefault("header", "true")
        options.setdefault("inferSchema", "true")
    try:
        inferred = spark.read.options(**options).format(src.format).load(src.path).schema
    except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException for an empty folder
        raise ConfigError(
            f"cannot infer the schema of the {src.format} files in {src.path!r} ({brief(exc)}); "
            "add files first or give the source a schema",
            path=src.path,
        ) from None
    fields = [f for f in inferred.fields if f.name != "_corrupt_record"]
    if not fields:
        raise ConfigError(f"no columns could be inferred from the files in {src.path!r}; give a schema")
    schema = StructType(fields)
    stored.parent.mkdir(parents=True, exist_ok=True)
    stored.write_text(json.dumps(schema.jsonValue()))
    logger.info("files source %s: inferred schema %s (kept in %s)", src.path, schema.simpleString(), stored)
    return schema


def _avro_file_schema(spark: SparkSession, src: FilesSourceSpec) -> StructType:
    """The Spark schema of the writer schema of the first Avro file in the folder."""
    import io

    import fastavro
    from pyspark.sql.types import StructType, _parse_datatype_string

    from deltaflow.sources.decode import avro_to_spark_ddl

    try:
        files = spark.read.options(**{"pathGlobFilter": "*.avro", **src.options}).format("binaryFile")
        path = files.load(src.path).select("path").orderBy("path").first()
        first = files.load(path["path"]).select("content").first() if path else None
    except Exception as exc:  # noqa: BLE001 - Spark's AnalysisException for a missing folder
        raise ConfigError(f"cannot list the Avro files in {src.path!r}: {brief(exc)}") from None
    if first is None:
        raise ConfigError(f"no Avro file in {src.path!r} to take the schema from; add one or give a schema")
    writer = fastavro.reader(io.BytesIO(first["content"])).writer_schema
    parsed = _parse_datatype_string(avro_to_spark_ddl(json.dumps(writer)))
    assert isinstance(parsed, StructType)
    return parsed


def _avro_files(files: DataFrame, schema: StructType, src: FilesSourceSpec) -> DataFrame:
    """Avro object container files (rows of Spark's ``binaryFile`` source) decoded in the tasks."""
    import pyarrow as pa
    from pyspark.sql.types import StringType, StructField, StructType

    from deltaflow.delta.schema import spark_to_arrow

    fields = list(schema.fields)
    if src.rescued_data_column:
        fields.append(StructField(src.rescued_data_column, StringType()))
    if src.source_file_column:
        fields.append(StructField(src.source_file_column, StringType()))
    out_type = StructType(fields)
    arrow_schema = spark_to_arrow(out_type)
    names = [f.name for f in schema.fields]
    rescued, source_file = src.rescued_data_column, src.source_file_column

    def decode(batches: Any) -> Any:
        import io

        import fastavro

        for batch in batches:
            for path, content in zip(
                batch.column("path").to_pylist(), batch.column("content").to_pylist(), strict=True
            ):
                try:
                    records: list[dict[str, Any]] = list(fastavro.reader(io.BytesIO(content)))  # type: ignore[arg-type]
                except Exception as exc:  # noqa: BLE001 - fastavro raises many types; name the file
                    raise ConfigError(f"Avro file {path} cannot be read: {exc}", path=path) from None
                columns: dict[str, list[Any]] = {n: [r.get(n) for r in records] for n in names}
                if rescued:
                    columns[rescued] = [
                        json.dumps({k: v for k, v in r.items() if k not in names}, default=str)
                        if set(r) - set(names)
                        else None
                        for r in records
                    ]
                if source_file:
                    columns[source_file] = [path] * len(records)
                yield pa.RecordBatch.from_pydict(columns, schema=arrow_schema)

    return files.select("path", "content").mapInArrow(decode, out_type)


def _json_lines(
    lines: DataFrame,
    schema: StructType,
    rescued: str | None,
    options: Mapping[str, str],
    *,
    dead_letters: bool = False,
    from_path: Mapping[str, str] | None = None,
) -> DataFrame:
    """JSON objects (one per line) parsed to ``schema`` with the reader ``options``
    (``timestampFormat``, ``allowComments``, ...); ``rescued`` holds what did not fit. With
    ``dead_letters`` a line that is not one JSON object is marked (see :class:`BatchFiles`).
    ``from_path`` maps columns of ``schema`` to the partition columns of ``lines`` they are
    taken from."""
    from pyspark.sql import functions as F  # noqa: N812
    from pyspark.sql.types import StringType, StructField, StructType

    corrupt = "_deltaflow_corrupt"
    full = StructType([*schema.fields, StructField(corrupt, StringType())])
    parse_options = {k: v for k, v in options.items() if k not in _FILE_ONLY_OPTIONS}
    parse_options.update(mode="PERMISSIVE", columnNameOfCorruptRecord=corrupt)
    parsed = F.from_json(F.col("value"), full, parse_options).alias("r")
    file = F.col("_metadata.file_path").alias("file")
    from_path = from_path or {}
    partitions = [F.col(f"`{k}`") for k in sorted(set(from_path.values()))]
    df = lines.filter(F.trim(F.col("value")) != "").select(F.col("value"), parsed, file, *partitions)
    columns: list[Column] = [
        F.col(f"`{from_path[f.name]}`" if f.name in from_path else f"r.`{f.name}`").alias(f.name)
        for f in schema.fields
    ]
    # Null for a line that is not one JSON object (cut short, an array, a bare value).
    as_map = F.from_json(F.col("value"), "map<string,string>")
    if rescued:
        names = F.array(*(F.lit(f.name) for f in schema.fields))
        unknown = F.map_filter(as_map, lambda k, _v: ~F.array_contains(names, k))
        columns.append(
            F.when(F.col(f"r.{corrupt}").isNotNull(), F.col("value"))
            .when(F.size(unknown) > 0, F.to_json(unknown))
            .alias(rescued)
        )
    if dead_letters:
        malformed = as_map.isNull()
        columns.append(F.when(malformed, F.lit(MALFORMED_LINE)).alias(ERROR_COLUMN))
        record = F.to_json(F.struct(F.col("file"), F.col("value").alias("line")))
        columns.append(F.when(malformed, record).alias(RECORD_COLUMN))
    return df.select(*columns)
