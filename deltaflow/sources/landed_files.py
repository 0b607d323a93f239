"""Parquet files landing below a folder or an object-store prefix, as a Spark streaming source
(``deltaflow-landed-files``): one row per file, its URI; no file content is read.

Spark's ``binaryFile`` source lists through Hadoop, which has no object-store connector here
(no jars); this source lists with pyarrow's filesystems (:mod:`deltaflow.io.storage`), on the
driver side, for any location a table can be at.

Offsets carry the files of their batch: ``{"batch": n, "files": [uri, ...]}``. Spark writes the
end offset to its offset log before it runs the batch, so a replayed batch takes exactly the
same files. The files of the next batch are the listing (``*.parquet``, names starting with
``_`` or ``.`` skipped, as ``add-files FOLDER``) minus the table's active files, minus every path
its registration records hold (:mod:`deltaflow.delta.registered`: what was registered once,
even if compaction replaced it since), minus every path the log's retained entries added or
removed (files the table's own writers wrote, in a watch of the table's root), minus the files
of the previous offset; in path order, at most ``max_files_per_trigger``. A lost checkpoint
therefore re-registers nothing: the new query's first batch starts from what the table and its
records hold.

A watch of the table's own root (or of a folder the root is in) also sees the files a running
compaction has written and not committed yet: taken, they would double their rows. So when the
table's compaction lease (:mod:`deltaflow.delta.leases`, held by every deltaflow compaction
from before it writes until after it commits) is held after the listing, the trigger offers
nothing and the next one lists again. The order matters: list, load the table, then look at the
lease; a compaction that committed in between has its file in the log (add-files skips it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from deltaflow.config.locations import normalize_uri
from deltaflow.config.models import JsonObject, SparkOptions
from deltaflow.io import logs
from deltaflow.io.footers import find_files, named_relative
from deltaflow.io.storage import filesystem, listed_uri, table_relative

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = [
    "FORMAT_NAME",
    "LANDED_FILES_SCHEMA",
    "LandedFilesDataSource",
    "LandedFilesOptions",
    "LogPaths",
    "compaction_running",
    "new_files",
]

logger = logging.getLogger(__name__)

FORMAT_NAME = "deltaflow-landed-files"
#: One row per file: its URI (a local path for local files).
LANDED_FILES_SCHEMA = "path STRING"

Offset = dict[str, Any]
#: How long a trigger that found no new file waits before it answers. On Spark's default
#: trigger the next call comes at once, and each call lists the whole folder and loads the
#: table: without the wait an idle watch would do that about 100 times a second.
IDLE_POLL_S = 1.0


class LandedFilesOptions(SparkOptions):
    """Options of ``deltaflow-landed-files`` (``path``: the folder or prefix watched)."""

    what = "the landed-files source"

    path: str = Field(min_length=1)
    table_uri: str = Field(min_length=1)
    storage_options: JsonObject = Field(default_factory=dict)
    max_files_per_trigger: int | None = Field(default=None, ge=1)

    @field_validator("path", "table_uri")
    @classmethod
    def _normalized(cls, value: str) -> str:
        return normalize_uri(value)


class LogPaths:
    """Every path the table's log added or removed (the table's own writers' files included, and
    files a compaction replaced), read incrementally: a log entry never changes."""

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.version = -1

    def update(self, table_uri: str, storage_options: dict[str, str], version: int) -> set[str]:
        from deltaflow.delta.commit import read_entries

        if version > self.version:
            for entry in read_entries(table_uri, storage_options, self.version + 1, version):
                self.paths |= entry.added | entry.removed
            self.version = version
        return self.paths


def new_files(
    options: LandedFilesOptions, exclude: Sequence[str] = (), log: LogPaths | None = None
) -> list[str]:
    """URIs of the Parquet files below ``options.path`` the table has not registered, in path
    order (``exclude``: URIs taken by the previous offset; ``log``: the paths the log named so
    far, kept between calls)."""
    import pyarrow.fs as pafs

    from deltaflow.delta import registered
    from deltaflow.delta.log import active_paths, load

    fs, where = filesystem(options.path, options.storage_options)
    if fs.get_file_info(where).type != pafs.FileType.Directory:
        return []  # not there yet (an empty prefix)
    found, _ = find_files(fs, [where])
    table_uri = options.table_uri
    table = load(table_uri, options.storage_options)
    taken = active_paths(table) | registered.load(table_uri, options.storage_options).paths
    if table is not None:
        taken |= (log or LogPaths()).update(table_uri, options.storage_options, table.version())
    if _overlaps(options.path, table_uri) and compaction_running(table_uri, options.storage_options):
        logger.debug(  # every trigger (1 s) while it runs
            "a compaction of %s is running: its files may be in %s uncommitted; the watch lists again "
            "next trigger",
            table_uri,
            options.path,
        )
        return []
    skip = set(exclude)
    out = []
    for f in found:
        uri = listed_uri(options.path, f.path)
        if uri in skip:
            continue
        # The path add-files gives the file in the table (a watch names each file directly).
        rel = table_relative(uri, table_uri)
        if (rel if rel is not None else named_relative(f.path)) not in taken:
            out.append(uri)
    return out


def _overlaps(folder: str, table_uri: str) -> bool:
    """Whether files written below the table's root can show up in a listing of ``folder``."""
    folder, root = folder.rstrip("/"), table_uri.rstrip("/")
    return folder == root or root.startswith(folder + "/") or folder.startswith(root + "/")


def compaction_running(table_uri: str, storage_options: dict[str, str]) -> bool:
    """Whether a deltaflow compaction holds the table's lease now (no lease table: none ever ran)."""
    from deltaflow.delta import log as delta_log
    from deltaflow.delta.layout import lock_dir
    from deltaflow.delta.leases import lease_state

    lock = delta_log.load(lock_dir(table_uri, "compaction"), storage_options)
    return lock is not None and not lease_state(lock).free_at(int(time.time() * 1000))


class _Files(InputPartition):
    def __init__(self, files: Sequence[str]) -> None:
        self.files = list(files)


class LandedFilesDataSource(DataSource):
    """Spark data source ``deltaflow-landed-files`` (streaming only)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return LANDED_FILES_SCHEMA

    def streamReader(self, schema: StructType) -> LandedFilesStreamReader:  # noqa: N802
        return LandedFilesStreamReader(LandedFilesOptions.from_spark_options(self.options))


class LandedFilesStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lists the folder on the driver side; offsets hold each batch's files."""

    def __init__(self, options: LandedFilesOptions) -> None:
        logs.configure_worker()  # planned in a Python worker Spark starts
        self._options = options
        self._target: set[str] | None = None  # availableNow: only files listed at its start
        self._log = LogPaths()

    def initialOffset(self) -> Offset:  # noqa: N802
        return {"batch": 0, "files": []}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = set(new_files(self._options, log=self._log))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        n = self._options.max_files_per_trigger
        return ReadMaxFiles(n) if n else ReadAllAvailable()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802
        files = new_files(self._options, exclude=start.get("files", []), log=self._log)
        if self._target is not None:
            files = [f for f in files if f in self._target]
        if isinstance(limit, ReadMaxFiles):
            files = files[: max(1, limit.max_files)]
        if not files:
            if self._target is None:  # availableNow ends at once instead
                time.sleep(IDLE_POLL_S)
            return start
        return {"batch": int(start.get("batch", 0)) + 1, "files": files}

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        if end == start or not end.get("files"):
            return []
        return [_Files(end["files"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
        assert isinstance(partition, _Files)
        for uri in partition.files:
            yield (uri,)

    def commit(self, end: Offset) -> None:
        """Nothing to release: the table and its records are the progress."""
