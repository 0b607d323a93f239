"""Spark's own checkpoint, read from the sink: the source offsets Spark logged for a batch, and
the checkpoint's identity (its query id) seen from a ``foreachBatch`` function.

Kafka progress goes into the Delta commit of the batch (:mod:`deltaflow.delta.progress`); the
offsets it records are the ones Spark wrote to its offset log before running the batch.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

import pyarrow as pa

from deltaflow.config.locations import normalize_uri
from deltaflow.config.sink import SinkOptions
from deltaflow.delta.progress import WENT_BACK, DataLoss, split_offsets
from deltaflow.errors import ConfigError, storage_error
from deltaflow.io.storage import filesystem

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = [
    "read_batch_end",
    "read_batch_offsets",
    "read_batch_source",
    "read_checkpoint_file",
    "restarts_offsets_went_back",
    "streaming_query_id",
]

#: The local property Spark's stream execution sets to the query's id (the ``id`` of the
#: checkpoint's ``metadata`` file) on the thread that runs a micro-batch, and so on its tasks.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
#: The checkpoint's file holding the query id (``{"id": ...}``).
QUERY_METADATA_FILE = "metadata"

logger = logging.getLogger(__name__)


def streaming_query_id(batch: DataFrame, options: SinkOptions | None = None) -> str | None:
    """The id of the streaming query whose micro-batch ``batch`` is, from a ``foreachBatch``
    function on the driver. Stable across restarts of one checkpoint, new for a new one.

    Read from the driver's local property; where the session has no ``SparkContext`` (a Spark
    Connect ``foreachBatch`` worker), from the ``id`` of the checkpoint's ``metadata`` file at
    ``options.checkpoint_location`` (the same id: Spark reads it from there). ``None`` outside
    a stream with neither.
    """
    try:
        context: Any = batch.sparkSession.sparkContext
        value = context.getLocalProperty(QUERY_ID_PROPERTY)
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext: read the checkpoint
        value = None
    if value:
        return str(value)
    if options is None or not options.checkpoint_location:
        return None
    try:  # Spark writes it when the query starts, before its first batch
        text = read_checkpoint_file(options.checkpoint_location, QUERY_METADATA_FILE, options)
    except FileNotFoundError:  # no query has run on this checkpoint: called outside a stream
        return None
    query_id = json.loads(text.splitlines()[0]).get("id") if text.strip() else None
    return str(query_id) if query_id else None


def read_batch_offsets(options: SinkOptions, batch_id: int) -> dict[str, dict[str, int]]:
    """The end offsets of the query's single source for ``batch_id``, from Spark's offset log."""
    return read_batch_source(options, batch_id)[0]


def read_batch_source(
    options: SinkOptions, batch_id: int
) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, DataLoss]]]:
    """The end offsets of the query's single source for ``batch_id``, from Spark's offset log,
    and the partitions the batch restarted at the broker's earliest offset (``fail_on_data_loss``
    false: :mod:`deltaflow.delta.progress`'s ``DATA_LOSS_KEY``).
    """
    return split_offsets(read_batch_end(options, batch_id))


def read_batch_end(options: SinkOptions, batch_id: int) -> dict[str, Any]:
    """The end offsets of the query's single source for ``batch_id`` as Spark logged them
    (restarts and topics waiting for a table included: :func:`read_batch_source` splits them).

    Spark writes ``<checkpoint>/offsets/<batch_id>`` (a write-ahead log) before it runs the
    batch: ``v1``, a metadata line, then one line of offsets per source.
    """
    if not options.checkpoint_location:
        raise ConfigError("kafka_offsets needs the query's checkpoint location", table_uri=options.table_uri)
    path = f"{options.checkpoint_location.rstrip('/')}/offsets/{batch_id}"
    lines = read_checkpoint_file(options.checkpoint_location, f"offsets/{batch_id}", options).splitlines()
    sources = [line for line in lines[2:] if line.strip()]
    if len(sources) != 1 or not sources[0].startswith("{"):
        raise ConfigError(
            f"kafka_offsets needs a query with exactly one deltaflow-kafka source; {path} lists "
            f"{len(sources)} source offset(s)",
            table_uri=options.table_uri,
        )
    offsets = json.loads(sources[0])
    assert isinstance(offsets, dict)
    return offsets


def restarts_offsets_went_back(options: SinkOptions, batch_id: int) -> bool:
    """Whether ``batch_id`` restarted a partition whose offsets went back (a re-created topic):
    every table holding the pipeline's progress must then commit the batch, so that its
    progress from the old topic moves back too (a dead-letter table commits only batches with
    dead letters otherwise, and would keep skipping the new topic's offsets below it)."""
    _, lost = read_batch_source(options, batch_id)
    return any(r.get("reason") == WENT_BACK for parts in lost.values() for r in parts.values())


def read_checkpoint_file(location: str, relative: str, options: SinkOptions) -> str:
    """The text of a file in Spark's checkpoint at ``location``, wherever Spark keeps it.

    Local paths are read directly. In the driver's own Python process (``foreachBatch``) the
    file is read through Spark's Hadoop filesystems, so any checkpoint Spark can write (HDFS,
    ``s3a://`` with its jars) can be read. Elsewhere (the data source's commit runs in a Python
    worker Spark starts, with no JVM at hand) pyarrow's filesystems read it, with the sink's
    storage options: object stores, and HDFS where libhdfs is installed.
    """
    uri = normalize_uri(location)
    target = f"{uri.rstrip('/')}/{relative}"
    if not urlparse(uri).scheme:
        return Path(target).read_text()
    text = _read_with_hadoop(f"{location.rstrip('/')}/{relative}")
    if text is not None:
        return text
    try:
        fs, path = filesystem(target, options.storage_options)
        with fs.open_input_stream(path) as stream:
            return bytes(stream.read()).decode("utf-8")
    except (OSError, pa.ArrowException) as exc:
        raise storage_error(exc, location, f"reading {relative} of Spark's checkpoint") from exc


def _read_with_hadoop(location: str) -> str | None:
    """The file at ``location`` read through the JVM of this process's SparkContext, if any."""
    try:
        from pyspark import SparkContext
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    sc = SparkContext._active_spark_context
    if sc is None or sc._jvm is None or sc._jsc is None:
        return None
    from py4j.protocol import Py4JError

    jvm = sc._jvm
    try:
        path = jvm.org.apache.hadoop.fs.Path(location)
        stream = path.getFileSystem(sc._jsc.hadoopConfiguration()).open(path)
        try:
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()
    except Py4JError as exc:  # e.g. no Hadoop filesystem for the scheme: pyarrow may have one
        logger.debug("Spark's filesystems cannot read %s: %s", location, exc)
        return None
