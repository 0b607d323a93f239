"""The files source's listing (``deltaflow-file-listing``): which files of a landing folder each
micro-batch takes. One row per file, its URI; the batch's rows are read from those files by
:func:`deltaflow.sources.files.read_files`, with Spark's readers.

A file is taken only once it is at least ``min_file_age_s`` old (its modification time): a file
still being written changes its modification time with every write, so it waits until its writer
has left it alone that long. A file taken while still written would be read in part and never
again (ids after the cut lost, a cut line a NULL row). A file that changes after it was taken is
logged as a warning: what was written after is not read. Files written elsewhere and renamed into
the folder are never seen half-written.

Offsets carry the files of their batch: ``{"batch": n, "files": [[uri, size, mtime_ms], ...]}``.
Spark writes the end offset to its offset log before it runs the batch, so a replayed batch
reads exactly the same files. Spark keeps only its last offsets, so every file ever taken is
also recorded in the pipeline's checkpoint, one file per batch (``deltaflow-files/<n>.json``,
written before the offset is returned); a start loads those up to the batch it resumes from (a
record past it is a plan Spark never logged, written again). The files of the next batch are
the listing minus the files taken, old enough, oldest first, at most ``max_files_per_trigger``
or ``max_bytes_per_trigger``. The listing is the folder's files and those of its partition
folders (``key=value``, at any depth, as Spark's file source discovers partitions; every
subfolder with ``recursiveFileLookup``); names starting with ``_`` or ``.`` (but a
``_key=value`` folder) and files being copied (``._COPYING_``) are skipped, as Spark skips
them; ``pathGlobFilter`` applies to the names.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxFiles,
    SupportsTriggerAvailableNow,
)

from deltaflow.config.locations import normalize_uri
from deltaflow.config.models import SparkOptions
from deltaflow.io import logs
from deltaflow.io.storage import filesystem, listed_uri

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

__all__ = ["FILE_LISTING_SCHEMA", "FORMAT_NAME", "FileListingDataSource", "FileListingOptions", "Listed"]

logger = logging.getLogger(__name__)

FORMAT_NAME = "deltaflow-file-listing"
#: One row per file of the batch: its URI (a local path for local files).
FILE_LISTING_SCHEMA = "path STRING"
#: The folder of the checkpoint holding the files each batch took.
TAKEN_DIR = "deltaflow-files"
#: How long a trigger that found no file old enough waits before it answers (each call lists the
#: folder; on Spark's default trigger the next call comes at once).
IDLE_POLL_S = 1.0
#: availableNow: how often the files present at its start, not yet old enough, are looked at.
AGE_POLL_S = 0.5
#: The name ``hadoop fs -put`` / ``-copyFromLocal`` gives a file while copying it (Spark skips it).
COPYING_SUFFIX = "._COPYING_"

Offset = dict[str, Any]


class FileListingOptions(SparkOptions):
    """Options of ``deltaflow-file-listing``."""

    what = "the files source's listing"

    path: str = Field(min_length=1)
    checkpoint: str = Field(min_length=1)
    min_file_age_s: float = Field(default=0.0, ge=0)
    max_files_per_trigger: int | None = Field(default=None, ge=1)
    max_bytes_per_trigger: int | None = Field(default=None, ge=1)
    path_glob_filter: str | None = None
    recursive: bool = False

    @field_validator("path", "checkpoint")
    @classmethod
    def _normalized(cls, value: str) -> str:
        return normalize_uri(value)


@dataclass(frozen=True)
class Listed:
    """A file as listed: its URI, size and modification time (ms)."""

    uri: str
    size: int
    mtime_ms: int

    def as_offset(self) -> list[Any]:
        return [self.uri, self.size, self.mtime_ms]


def is_partition_folder(name: str) -> bool:
    """Whether a folder named ``name`` holds a partition (``key=value``, both non-empty), which
    Spark's partition discovery reads its column from; ``.`` names are hidden."""
    key, equals, value = name.partition("=")
    return bool(equals and key and value) and not name.startswith(".")


def _hidden(relative: str) -> bool:
    """Skipped as Spark skips it: a name starting with ``.`` or ``_`` (a ``_key=value`` folder
    is a partition), or a file ``hadoop fs -put`` is still copying (renamed when complete)."""
    *folders, name = relative.split("/")
    if name.startswith(("_", ".")) or name.endswith(COPYING_SUFFIX):
        return True
    return any(f.startswith(".") or (f.startswith("_") and not is_partition_folder(f)) for f in folders)


def _walk(fs: Any, where: str, *, recursive: bool) -> Iterator[Any]:
    """The entries of the folder ``where``: below every subfolder when ``recursive``, else below
    its partition folders only (Spark's file source lists those and no other subfolder)."""
    import pyarrow.fs as pafs

    if recursive:
        yield from fs.get_file_info(pafs.FileSelector(where, recursive=True, allow_not_found=True))
        return
    pending = [where]
    while pending:
        for info in fs.get_file_info(pafs.FileSelector(pending.pop(), allow_not_found=True)):
            if info.type == pafs.FileType.Directory and is_partition_folder(info.base_name):
                pending.append(info.path)
            yield info


def list_files(options: FileListingOptions) -> list[Listed]:
    """The files in the folder a batch may take, oldest first (then by path)."""
    import pyarrow.fs as pafs

    fs, where = filesystem(options.path, {})
    root = where.rstrip("/") + "/"
    out = []
    for info in _walk(fs, where, recursive=options.recursive):
        if info.type != pafs.FileType.File:
            continue
        relative = info.path[len(root) :] if info.path.startswith(root) else info.base_name
        if _hidden(relative):
            continue
        if options.path_glob_filter and not fnmatch.fnmatchcase(info.base_name, options.path_glob_filter):
            continue
        mtime_ms = int(info.mtime_ns or 0) // 10**6
        out.append(Listed(listed_uri(options.path, info.path), int(info.size or 0), mtime_ms))
    return sorted(out, key=lambda f: (f.mtime_ms, f.uri))


class _Files(InputPartition):
    def __init__(self, files: Sequence[str]) -> None:
        self.files = list(files)


class FileListingDataSource(DataSource):
    """Spark data source ``deltaflow-file-listing`` (streaming only)."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return FILE_LISTING_SCHEMA

    def streamReader(self, schema: StructType) -> FileListingStreamReader:  # noqa: N802
        return FileListingStreamReader(FileListingOptions.from_spark_options(self.options))


class FileListingStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Lists the folder on the driver side; offsets hold each batch's files."""

    def __init__(self, options: FileListingOptions) -> None:
        logs.configure_worker()  # planned in a Python worker Spark starts
        self._options = options
        self._taken: dict[str, Listed] | None = None  # every file taken, loaded at the first plan
        self._warned: set[Listed] = set()
        self._target: set[str] | None = None  # availableNow: only files listed at its start

    # -- the files taken -------------------------------------------------------------------

    def _record_path(self, batch: int) -> tuple[Any, str]:
        fs, root = filesystem(self._options.checkpoint, {})
        return fs, f"{root.rstrip('/')}/{TAKEN_DIR}/{batch}.json"

    def _load_taken(self, start: Offset) -> dict[str, Listed]:
        """The files of every batch up to ``start`` (records past it: plans Spark never logged)."""
        import pyarrow.fs as pafs

        if self._taken is not None:
            return self._taken
        upto = int(start.get("batch", 0))
        fs, root = filesystem(self._options.checkpoint, {})
        folder = f"{root.rstrip('/')}/{TAKEN_DIR}"
        taken: dict[str, Listed] = {}
        for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
            stem = info.base_name.removesuffix(".json")
            if info.type != pafs.FileType.File or not stem.isdigit() or int(stem) > upto:
                continue
            with fs.open_input_stream(info.path) as f:
                for entry in json.loads(f.read()):
                    listed = Listed(*entry)
                    taken[listed.uri] = listed
        for entry in start.get("files", []):
            listed = Listed(*entry)
            taken[listed.uri] = listed
        self._taken = taken
        logger.info("files source %s: %d file(s) taken up to batch %d", self._options.path, len(taken), upto)
        return taken

    def _record(self, batch: int, files: Sequence[Listed]) -> None:
        fs, path = self._record_path(batch)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(path) as out:
            out.write(json.dumps([f.as_offset() for f in files]).encode())

    def _warn_changed(self, listing: Sequence[Listed], taken: dict[str, Listed]) -> None:
        for f in listing:
            before = taken.get(f.uri)
            if before is not None and before != f and f not in self._warned:
                self._warned.add(f)
                logger.warning(
                    "files source %s: %s changed after a batch read it (%d bytes, modified at %d ms; now "
                    "%d bytes at %d ms): what was written since is not read. Write files elsewhere and "
                    "rename them into the folder, or raise min_file_age",
                    self._options.path,
                    f.uri,
                    before.size,
                    before.mtime_ms,
                    f.size,
                    f.mtime_ms,
                )

    # -- Spark's calls -----------------------------------------------------------------------

    def initialOffset(self) -> Offset:  # noqa: N802
        return {"batch": 0, "files": []}

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self._target = {f.uri for f in list_files(self._options)}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self._options.max_files_per_trigger:
            return ReadMaxFiles(self._options.max_files_per_trigger)
        if self._options.max_bytes_per_trigger:
            return ReadMaxBytes(self._options.max_bytes_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:  # noqa: N802
        taken = self._load_taken(start)
        min_age_ms = self._options.min_file_age_s * 1000
        while True:
            listing = list_files(self._options)
            self._warn_changed(listing, taken)
            new = [f for f in listing if f.uri not in taken]
            if self._target is not None:
                new = [f for f in new if f.uri in self._target]
            now_ms = time.time() * 1000
            ready = [f for f in new if now_ms - f.mtime_ms >= min_age_ms]
            if ready or not new or self._target is None:
                break
            # availableNow: files present at its start are still being written; wait for them.
            logger.info(
                "files source %s: waiting for %d file(s) modified less than %g s ago",
                self._options.path,
                len(new),
                self._options.min_file_age_s,
            )
            time.sleep(AGE_POLL_S)
        if isinstance(limit, ReadMaxFiles):
            ready = ready[: max(1, limit.max_files)]
        elif isinstance(limit, ReadMaxBytes):
            kept: list[Listed] = []
            for f in ready:
                if kept and sum(k.size for k in kept) + f.size > limit.max_bytes:
                    break
                kept.append(f)
            ready = kept
        if not ready:
            if self._target is None:  # availableNow ends at once instead
                time.sleep(IDLE_POLL_S)
            return start
        batch = int(start.get("batch", 0)) + 1
        self._record(batch, ready)
        for f in ready:
            taken[f.uri] = f
        return {"batch": batch, "files": [f.as_offset() for f in ready]}

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        if end == start or not end.get("files"):
            return []
        return [_Files([entry[0] for entry in end["files"]])]

    def read(self, partition: InputPartition) -> Iterator[tuple[str]]:
        assert isinstance(partition, _Files)
        for uri in partition.files:
            yield (uri,)

    def commit(self, end: Offset) -> None:
        """Nothing to release: the checkpoint records what was taken."""
