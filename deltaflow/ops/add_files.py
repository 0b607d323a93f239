"""``add_files`` and ``convert``: existing Parquet files registered in a Delta table where they
are, without reading or rewriting their data.

Everything an ``add`` action holds comes from the store's listing (exact size, modification
time) and the Parquet footer (row count, min/max/nullCount, honouring
``delta.dataSkippingNumIndexedCols``); partition values come from Hive-style ``col=value/``
directories, unescaped as Spark does. All files go into ONE commit through
:func:`deltaflow.delta.commit.commit_files`: a lost response is resolved by reading the log
(the commit's token), and a retry never adds a file twice.

The sequence of :func:`add_files`:

Step 1. Find the files (files, folders, globs) and tell those under the table root from the
        others; the others are refused unless ``copy`` (then they go below the root, keeping
        their Hive directories, after every check passed).
Step 2. Load the table; files it already references, and files registered before (the
        committed records of :mod:`deltaflow.delta.registered`, which outlive compaction and
        log cleanup), are skipped (and reported).
Step 3. Read the footers on a thread pool.
Step 4. Check every file: its partition directories name the table's partition columns (for a
        new table, those of the first file), its schema fits the table's (for a new table, the
        first file's). A file that does not fit stops everything: nothing is copied or committed.
Step 5. Copy the outside files (``copy``).
Step 6. Write the record of the paths (``_deltaflow/registered/``), commit the ``add`` actions
        in one commit (a missing table is created by it: version 0 holds every file), then mark
        the record committed; nothing of this unless ``dry_run``.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from deltaflow.config.locations import join, normalize_uri
from deltaflow.errors import AddFilesError, FileSchemaMismatchError, brief
from deltaflow.io.footers import (
    FOOTER_THREADS,
    Footer,
    FoundFile,
    find_files,
    hive_partitions,
    modification_time_ms,
    read_footer,
    read_footers,
    same_file,
)
from deltaflow.io.storage import filesystem, listed_uri, table_relative

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["AddFilesResult", "AddedFile", "add_files", "convert"]

logger = logging.getLogger(__name__)

#: Files named in an error message before "... and N more".
EXAMPLES = 3


@dataclass(frozen=True)
class AddedFile:
    """One file registered (or, in a dry run, to be registered)."""

    path: str  # relative to the table root, as on disk (not percent-encoded)
    source: str  # where it was found (differs from the table path with ``copy``)
    rows: int
    size: int
    partition_values: dict[str, str | None]


@dataclass(frozen=True)
class AddFilesResult:
    """What :func:`add_files` / :func:`convert` did."""

    table_uri: str
    dry_run: bool
    #: The commit created the table (its version 0 holds the files).
    created: bool
    #: The table version holding the files (``None``: dry run, or nothing to add).
    version: int | None
    files_added: int
    rows_added: int
    bytes_added: int
    files_copied: int
    #: Files the table already referenced: not added again.
    files_skipped: int
    files: tuple[AddedFile, ...]
    skipped: tuple[str, ...]
    #: The commit's response was lost and the log showed it had landed.
    recovered: bool = False
    #: Table paths named more than once (the same file, or identical copies): added once, and
    #: not counted in ``files_skipped``.
    named_twice: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Candidate:
    found: FoundFile
    fs: pafs.FileSystem
    uri: str  # where it is, as a URI (a path for local files)
    path: str  # relative to the table root, where it will be
    inside: bool
    #: A data file of deltaflow's own writers (``part-b<N>-...``) found in a folder or glob of
    #: the table: registered only if named as a file (see :func:`_without_own_orphans`).
    own: bool = False


def add_files(
    table_uri: str,
    paths: Sequence[str],
    *,
    copy: bool = False,
    dry_run: bool = False,
    storage_options: Mapping[str, str] | None = None,
    threads: int = FOOTER_THREADS,
    progress: Callable[[int, int], None] | None = None,
    txn: tuple[str, int] | None = None,
) -> AddFilesResult:
    """Register existing Parquet files in the Delta table at ``table_uri`` (created from the
    first file's schema when missing), in one commit.

    Args:
        table_uri: The table (local path or URI).
        paths: Files, folders (searched recursively for ``*.parquet``) and globs (``*``, ``?``,
            ``[...]``, ``**``), local or in the table's object store.
        copy: Copy files outside the table's root below it first (keeping their Hive
            directories), then register the copies. Without it they are refused.
        dry_run: Check everything and return what would be added; commit nothing.
        storage_options: delta-rs' storage options (also used to reach the files).
        threads: Footers read at once.
        progress: Called with (footers read, total) while reading.
        txn: ``(app_id, version)`` recorded in the same commit (the watching mode: the pipeline
            and its micro-batch). Whether files are added is still decided by their paths: a
            replayed batch finds them in the table and commits nothing.

    Raises:
        AddFilesError: nothing found, files outside the table, partition directories that do
            not match, a file that is not Parquet.
        FileSchemaMismatchError: a file's schema does not fit the table's.
    """
    return _register(
        normalize_uri(table_uri),
        paths,
        copy=copy,
        dry_run=dry_run,
        storage_options=dict(storage_options or {}),
        threads=threads,
        progress=progress,
        convert_partitions=None,
        txn=txn,
    )


def convert(
    path: str,
    *,
    partition_by: Sequence[str] = (),
    dry_run: bool = False,
    storage_options: Mapping[str, str] | None = None,
    threads: int = FOOTER_THREADS,
    progress: Callable[[int, int], None] | None = None,
) -> AddFilesResult:
    """Make the folder of Parquet files at ``path`` a Delta table in place (``CONVERT TO
    DELTA``): version 0 references every ``*.parquet`` file below it.

    Raises:
        AddFilesError: the folder already is a Delta table, holds no Parquet file, or its Hive
            directories do not match ``partition_by``.
        FileSchemaMismatchError: a file's schema differs from the first file's.
    """
    return _register(
        normalize_uri(path),
        [normalize_uri(path)],
        copy=False,
        dry_run=dry_run,
        storage_options=dict(storage_options or {}),
        threads=threads,
        progress=progress,
        convert_partitions=list(partition_by),
        txn=None,
    )


def _register(
    table_uri: str,
    paths: Sequence[str],
    *,
    copy: bool,
    dry_run: bool,
    storage_options: dict[str, str],
    threads: int,
    progress: Callable[[int, int], None] | None,
    convert_partitions: list[str] | None,
    txn: tuple[str, int] | None,
) -> AddFilesResult:
    from deltaflow.delta import log as delta_log
    from deltaflow.delta import registered
    from deltaflow.delta.commit import RetryPolicy, commit_files

    table_fs, root = filesystem(table_uri, storage_options)

    # Step 1. Find the files.
    candidates = _find(table_uri, root, paths, storage_options)
    outside = [c for c in candidates if not c.inside]
    if outside and not copy:
        raise AddFilesError(
            f"{len(outside)} file(s) are outside the table's root {table_uri!r}, e.g. "
            f"{_examples([c.uri for c in outside])}; a Delta table references files below its "
            "root only. Move them there, or pass --copy to copy them below the root first",
            table_uri=table_uri,
            files=len(outside),
        )

    # Step 2. The table, and what it already holds.
    table = delta_log.load(table_uri, storage_options)
    if convert_partitions is not None and table is not None:
        raise AddFilesError(
            f"{table_uri!r} already is a Delta table (version {table.version()}); nothing was "
            "converted. Register further files with `deltaflow add-files`",
            table_uri=table_uri,
        )
    if table is not None:
        mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
        if mode != "none":
            # Its files name columns by physical names (col-<uuid>) or field ids the log maps;
            # a file written outside it names them by logical names: every reader reads NULLs.
            raise AddFilesError(
                f"{table_uri!r} uses column mapping (delta.columnMapping.mode={mode}): its data "
                "files name columns by physical names or ids, which files written elsewhere do not "
                "carry (readers would read NULL); nothing was committed. Register the files in a "
                "table without column mapping, or write them through a Delta writer",
                table_uri=table_uri,
            )
    have = delta_log.active_paths(table)
    # Paths registered before stay registered once, even after compaction replaced them.
    earlier = registered.load(table_uri, storage_options)
    if table is not None and earlier.pending:
        earlier = registered.settle(table_uri, storage_options, earlier, have, table.version())
    candidates = _without_own_orphans(candidates, have, table_uri)
    todo: list[_Candidate] = []
    skipped: list[str] = []
    twice: list[str] = []
    seen: dict[str, _Candidate] = {}
    for c in candidates:
        if (
            c.path in have
            and not c.inside
            and not same_file(c.fs, c.found.path, table_fs, join(root, c.path))
        ):
            raise _taken(c, table_uri)
        if c.path in earlier.committed and c.path not in have:
            logger.info(
                "%s was registered in %s before (no longer an active file: compacted or removed): "
                "skipped; see _deltaflow/registered/ to register it again",
                c.path,
                table_uri,
            )
        if c.path in have or c.path in earlier.committed:
            skipped.append(c.path)
            continue
        other = seen.get(c.path)
        if other is not None:
            # Two sources for one table path (--copy of day1/data_0.parquet and day2/data_0.parquet):
            # only copies of one file may share it, else one of them would be dropped.
            if other.uri != c.uri and not same_file(other.fs, other.found.path, c.fs, c.found.path):
                raise AddFilesError(
                    f"{other.uri!r} and {c.uri!r} would both be {c.path!r} in {table_uri!r} but are "
                    "different files; nothing was committed. Copy from their common parent folder "
                    "(keeping the folders that tell them apart), or rename one",
                    table_uri=table_uri,
                    file=c.uri,
                )
            twice.append(c.path)
            continue
        seen[c.path] = c
        todo.append(c)
    for path in skipped:  # counted at INFO below: a rerun over a big folder skips every file
        logger.debug("%s is already in %s: skipped", path, table_uri)
    for path in twice:
        logger.debug("%s was named twice: added once", path)
    logger.info(
        "found %d Parquet file(s) for %s: %d to add, %d already in the table, %d named twice",
        len(candidates),
        table_uri,
        len(todo),
        len(skipped),
        len(twice),
    )
    if not todo:
        return AddFilesResult(
            table_uri,
            dry_run,
            False,
            table.version() if table is not None else None,
            0,
            0,
            0,
            0,
            len(skipped),
            (),
            tuple(skipped),
            named_twice=tuple(twice),
        )

    # Step 3 and 4. Footers, partitions, schemas.
    if table is not None:
        partition_by = list(table.metadata().partition_columns)
        table_fields = {f.name: f for f in pa.schema(table.schema().to_arrow())}
        data_schema: pa.Schema | None = pa.schema(
            [f for name, f in table_fields.items() if name not in set(partition_by)]
        )
    else:
        first = hive_partitions(todo[0].path)
        partition_by = convert_partitions if convert_partitions is not None else [name for name, _ in first]
        data_schema = None  # the first file's
    values = [_partition_values(c, partition_by, table_uri) for c in todo]
    if table is not None:
        for c, v in zip(todo, values, strict=True):
            _check_partition_types(c, v, table_fields, table_uri)
    indexed = delta_log.indexed_columns(table)
    order = data_schema.names if data_schema is not None else None

    def stats_columns(schema: pa.Schema) -> pa.Schema:
        data = [f for f in schema if f.name not in set(partition_by)]
        if order is None:
            return pa.schema(data)
        by_name = {f.name: f for f in data}
        return pa.schema([by_name[n] for n in order if n in by_name])

    def read(i: int) -> Footer:
        c = todo[i]
        try:
            return read_footer(
                c.fs,
                c.found,
                path=c.path,
                partition_values=values[i],
                stats_columns=stats_columns,
                indexed_columns=indexed,
            )
        except (OSError, pa.ArrowInvalid) as exc:
            raise AddFilesError(
                f"cannot read the Parquet footer of {c.uri!r}: {brief(exc)}; nothing was committed. "
                "Is it a complete Parquet file? Leave it out or rewrite it",
                table_uri=table_uri,
                file=c.uri,
            ) from exc

    footers = read_footers(read, len(todo), threads=threads, progress=progress)
    if data_schema is None:
        data_schema = _as_stored(pa.schema([f for f in footers[0].schema if f.name not in set(partition_by)]))
    for c, footer in zip(todo, footers, strict=True):
        _check_schema(table_uri, c.uri, data_schema, footer.schema, partition_by)
        _check_nulls(table_uri, c.uri, data_schema, footer)

    planned = tuple(
        AddedFile(c.path, c.uri, f.file.num_records, f.file.size, dict(f.file.partition_values))
        for c, f in zip(todo, footers, strict=True)
    )
    rows = sum(f.rows for f in planned)
    size = sum(f.size for f in planned)
    copies = [c for c in todo if not c.inside]
    if dry_run:
        return AddFilesResult(
            table_uri,
            True,
            table is None,
            None,
            len(planned),
            rows,
            size,
            len(copies),
            len(skipped),
            planned,
            tuple(skipped),
            named_twice=tuple(twice),
        )

    # Step 5. Copies.
    files = [f.file for f in footers]
    if copies:
        copied = _copy(copies, table_fs, root, table_uri)
        _check_unchanged(
            table_uri,
            [
                (c.uri, f.size, copied[c.path][0])
                for c, f in zip(todo, files, strict=True)
                if c.path in copied
            ],
        )
        files = [
            replace(f, size=copied[f.path][0], modification_time=copied[f.path][1]) if f.path in copied else f
            for f in files
        ]

    # Step 6. One commit, of files unchanged since their footers were read (an exporter
    # rewriting `latest.parquet` meanwhile would leave a size and stats of another file).
    _check_unchanged(
        table_uri,
        [
            (c.uri, (f.size, c.found.modification_time), _size_and_time(c.fs, c.found.path))
            for c, f in zip(todo, files, strict=True)
            if c.inside
        ],
    )
    schema = pa.schema(
        [*data_schema, *(pa.field(p, pa.string()) for p in partition_by)]
        if table is None
        else list(table_fields.values())
    )
    paths_added = {f.path for f in files}
    recorded = {txn[0]: txn[1]} if txn is not None else {}

    def done(current: DeltaTable | None) -> bool:
        if current is None:
            return False
        if table is None:
            # Another writer created the table after step 2: append only if the files fit it.
            _check_created(current, table_uri, schema, partition_by, todo[0].uri)
        # Another run (or a concurrent one) registered every one of them meanwhile.
        return paths_added <= delta_log.active_paths(current)

    operation = "convert" if convert_partitions is not None else "add files"
    # The record first: a crash before the commit can only make vacuum keep files it may delete.
    record_id = registered.record(
        table_uri, storage_options, paths_added, table.version() if table is not None else -1
    )
    result = commit_files(
        table_uri,
        files,
        what=f"{operation} ({len(files)} file(s)) to {table_uri}",
        schema=schema,
        partition_by=partition_by,
        mode="append",
        metadata={"deltaflow.operation": operation, "deltaflow.files": len(files)},
        storage_options=storage_options,
        policy=RetryPolicy(),
        create_if_missing=True,
        properties={},
        txns=(lambda _table: recorded) if recorded else None,
        already_done=done,
    )
    # Committed, or found registered by another run: the paths are in the table either way.
    registered.mark_committed(
        table_uri, storage_options, record_id, result.version if result.committed else None
    )
    logger.info(
        "%s: %d file(s), %d row(s) registered in %s as version %s (%d skipped)",
        operation,
        len(files),
        rows,
        table_uri,
        result.version,
        len(skipped),
    )
    added = planned if result.committed else ()
    return AddFilesResult(
        table_uri,
        False,
        table is None and result.committed,
        result.version,
        len(added),
        sum(f.rows for f in added),
        sum(f.size for f in added),
        len(copies),
        len(skipped) + (len(planned) if not result.committed else 0),
        added,
        tuple(skipped) + (tuple(f.path for f in planned) if not result.committed else ()),
        recovered=result.recovered,
        named_twice=tuple(twice),
    )


def _check_created(
    table: DeltaTable, table_uri: str, schema: pa.Schema, partition_by: Sequence[str], file: str
) -> None:
    """The table another writer created meanwhile must be the one the files were checked for."""
    parts = list(table.metadata().partition_columns)
    if sorted(parts) != sorted(partition_by):
        raise AddFilesError(
            f"{table_uri!r} was created by another writer meanwhile, partitioned by {parts}, but the "
            f"files' folders name {list(partition_by)}; nothing was committed",
            table_uri=table_uri,
        )
    data = pa.schema([f for f in schema if f.name not in set(parts)])
    have = pa.schema(table.schema().to_arrow())
    _check_schema(table_uri, file, pa.schema([f for f in have if f.name not in set(parts)]), data, parts)


def _taken(c: _Candidate, table_uri: str) -> AddFilesError:
    return AddFilesError(
        f"cannot copy {c.uri!r} to {c.path!r} in {table_uri!r}: another file is there already; "
        "nothing was committed. Rename the file, or copy it elsewhere below the root yourself "
        "and register it there",
        table_uri=table_uri,
        file=c.uri,
    )


def _examples(items: Sequence[str]) -> str:
    shown = ", ".join(repr(i) for i in items[:EXAMPLES])
    return shown + (f" and {len(items) - EXAMPLES} more" if len(items) > EXAMPLES else "")


def _find(
    table_uri: str, root: str, paths: Sequence[str], storage_options: Mapping[str, str]
) -> list[_Candidate]:
    out: list[_Candidate] = []
    unmatched: list[str] = []
    for raw in paths:
        uri = normalize_uri(raw)
        fs, where = filesystem(uri, storage_options)
        found, missing = find_files(fs, [where])
        unmatched += [raw for _ in missing]
        for f in found:
            file_uri = listed_uri(uri, f.path)
            in_table = table_relative(file_uri, table_uri)
            inside = in_table is not None
            rel = in_table if in_table is not None else f.relative
            if inside and rel.split("/")[0].startswith("_"):
                raise AddFilesError(
                    f"{file_uri!r} is in {rel.split('/')[0]!r} of the table, a folder of the log or "
                    "of deltaflow, not of data; nothing was committed",
                    table_uri=table_uri,
                    file=file_uri,
                )
            if inside and isinstance(fs, pafs.LocalFileSystem) and os.path.islink(f.path):
                raise AddFilesError(
                    f"{file_uri!r} is a symbolic link: readers follow it, so the file it points at "
                    "would be registered under a second name (its rows read twice if it is in the "
                    "table too); nothing was committed. Register the file it points at",
                    table_uri=table_uri,
                    file=file_uri,
                )
            own = (
                inside and f.path != where.rstrip("/") and _OWN_FILE.match(rel.rsplit("/", 1)[-1]) is not None
            )
            out.append(_Candidate(f, fs, file_uri, rel, inside, own))
    if unmatched:
        raise AddFilesError(
            f"no Parquet file found at {_examples(unmatched)} (folders are searched for *.parquet; "
            "names starting with _ or . are skipped); nothing was committed",
            table_uri=table_uri,
            paths=unmatched,
        )
    if not out:  # pragma: no cover - every path matched something
        raise AddFilesError(f"no Parquet files given for {table_uri!r}", table_uri=table_uri)
    return out


#: deltaflow's sinks name their data files ``part-b<batch>-...`` (DESIGN.md, the commit path).
_OWN_FILE = re.compile(r"part-b\d+-")


def _without_own_orphans(
    candidates: Sequence[_Candidate], have: set[str], table_uri: str
) -> list[_Candidate]:
    """The candidates without deltaflow's own data files the log does not reference, found by
    searching the table's folder: a pipeline's orphans (a batch whose commit never landed) or
    files a compaction or delete removed (not vacuumed yet). Registering them would bring back
    rows the table dropped or duplicate a batch's rows, so they are left out (with a warning);
    named as files, they are taken."""
    orphans = [c.path for c in candidates if c.own and c.path not in have]
    if orphans:
        logger.warning(
            "%d data file(s) written by deltaflow in %s are not in its log, e.g. %s: orphans of a "
            "batch that never committed or files the table removed (compaction, delete); left out. "
            "Name such a file to register it",
            len(orphans),
            table_uri,
            _examples(orphans),
        )
    return [c for c in candidates if not (c.own and c.path not in have)]


def _partition_values(c: _Candidate, partition_by: Sequence[str], table_uri: str) -> dict[str, str | None]:
    hive = hive_partitions(c.path)
    names = [name for name, _ in hive]
    if sorted(names) != sorted(partition_by) or len(set(names)) != len(names):
        expected = "/".join(f"{p}=..." for p in partition_by) or "no col=value directories"
        raise AddFilesError(
            f"{c.uri!r} sits in partition directories {names or '(none)'}, but the table "
            f"{table_uri!r} is partitioned by {list(partition_by)} (expected {expected}); "
            "nothing was committed",
            table_uri=table_uri,
            file=c.uri,
        )
    return dict(hive)


def _size_and_time(fs: pafs.FileSystem, path: str) -> tuple[int, int] | None:
    info = fs.get_file_info(path)
    return (info.size, modification_time_ms(info)) if info.type == pafs.FileType.File else None


def _check_unchanged(table_uri: str, checks: Sequence[tuple[str, object, object]]) -> None:
    """Each (file, as read, as now) must match: else the file changed after its footer was read."""
    changed = [uri for uri, then, now in checks if then != now]
    if changed:
        raise AddFilesError(
            f"{len(changed)} file(s) changed while being registered (size or modification time "
            f"differs from the footer read), e.g. {_examples(changed)}; nothing was committed. "
            "Register them again once they are complete",
            table_uri=table_uri,
            files=len(changed),
        )


def _check_partition_types(
    c: _Candidate, values: Mapping[str, str | None], fields: Mapping[str, pa.Field], table_uri: str
) -> None:
    """Every partition value must parse as its column's type: the log stores it as text and
    every reader parses it when loading the log, so one bad value makes the whole table
    unreadable (delta-rs: "Failed to parse value 'abc' as 'integer'")."""
    for name, value in values.items():
        field = fields.get(name)
        if value is None or field is None or not _partition_value_ok(value, field.type):
            if value is None and (field is None or field.nullable):
                continue
            raise AddFilesError(
                f"{c.uri!r} sits in partition directory {name}={value if value is not None else 'null'}, "
                f"but the table's partition column {name!r} is {field.type if field else 'unknown'}"
                f"{' NOT NULL' if value is None else ''} and the value does not parse as one; "
                "nothing was committed (readers would fail on the whole table)",
                table_uri=table_uri,
                file=c.uri,
            )


def _partition_value_ok(value: str, t: pa.DataType) -> bool:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t):
        return True
    if pa.types.is_boolean(t):
        return value in ("true", "false")
    text = pa.array([value], pa.string())
    # Timestamps as the log writes them (`2024-01-01 08:00:00[.ffffff]`, UTC), or with an offset.
    casts = [pa.timestamp("us"), pa.timestamp("us", tz="UTC")] if pa.types.is_timestamp(t) else [t]
    for to in casts:
        try:
            return bool(text.cast(to).null_count == 0)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            continue
    return False


def _has_unsigned(t: pa.DataType) -> bool:
    if pa.types.is_unsigned_integer(t):
        return True
    return any(_has_unsigned(t.field(i).type) for i in range(t.num_fields))


def _check_nulls(table_uri: str, file: str, table: pa.Schema, footer: Footer) -> None:
    """A NOT NULL column of the table may hold no null in the file: its footer must say so
    (the column required in the file's schema, or every row group's null count 0). Readers
    trust the constraint (chdb reads such nulls as 0)."""
    fields = {f.name: f for f in footer.schema}
    problems = []
    for column in table:
        f = fields.get(column.name)
        if column.nullable or f is None or not f.nullable:
            continue  # a missing NOT NULL column is _check_schema's
        nulls = footer.null_counts.get(column.name)
        if nulls is None:
            problems.append(
                f"column {column.name!r} is NOT NULL in the table, and the file's footer does not "
                "tell whether it holds nulls (no null count)"
            )
        elif nulls:
            problems.append(
                f"column {column.name!r} is NOT NULL in the table but holds {nulls} null(s) in the file"
            )
    if problems:
        raise FileSchemaMismatchError(table_uri, file, problems)


def _as_stored(schema: pa.Schema) -> pa.Schema:
    """The Delta types a file's columns are registered as. Parquet timestamps are instants
    (zoned: any zone is UTC on disk) or wall-clock times (zone-less) in s, ms, us or ns; Delta has
    TIMESTAMP (us, UTC) and TIMESTAMP_NTZ (us) that every reader reads. delta-rs would type ns
    columns ``timestamp_nanos`` (reader feature ``timestampNanos``: DuckDB, Polars, chdb and
    delta-rs itself cannot read the table) and refuses zones other than UTC."""

    def stored(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t):
            return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
        return t

    return pa.schema([f.with_type(stored(f.type)) for f in schema], metadata=schema.metadata)


def _check_schema(
    table_uri: str, file: str, table: pa.Schema, data: pa.Schema, partition_by: Sequence[str]
) -> None:
    """The file may leave out nullable table columns (readers fill in nulls); it may not bring
    columns the table lacks (readers would never see them) or change a column's type."""
    from deltaflow.delta.schema import compare, delta_schema

    data = pa.schema([f for f in data if f.name not in set(partition_by)])
    # Delta stores microseconds; delta-rs fails reading a file whose ns values have digits below
    # the microsecond ("would lose data"), which the footer cannot rule out.
    problems = [
        f"column {f.name!r} is {f.type}: Delta stores timestamps in microseconds and delta-rs cannot "
        "read nanoseconds; rewrite it with microsecond timestamps (pyarrow: coerce_timestamps='us')"
        for f in data
        if pa.types.is_timestamp(f.type) and f.type.unit == "ns"
    ]
    problems += [
        f"column {f.name!r} is {f.type}: Delta has no unsigned integers and delta-rs registers it "
        "as the signed type of the same width, which Polars cannot read and others misread above "
        "the signed maximum; rewrite it as a signed type wide enough (uint32 -> int64)"
        for f in data
        if _has_unsigned(f.type)
    ]
    if problems:
        raise FileSchemaMismatchError(table_uri, file, problems)
    data = _as_stored(data)
    try:
        diff = compare(delta_schema(table), data)
    except Exception as exc:  # noqa: BLE001 - delta-rs refuses types it cannot store
        raise FileSchemaMismatchError(table_uri, file, [f"a type Delta cannot store: {brief(exc)}"]) from None
    nullable = {f.name: f.nullable for f in table}
    problems = [
        f"column {n!r} ({t}) is NOT NULL in the table but missing from the file"
        for n, t in diff.missing_in_data
        if not nullable.get(n, True)
    ]
    problems += [f"column {n!r} ({t}) is in the file but not in the table" for n, t, _ in diff.new_in_data]
    problems += [f"column {n!r} is {tt} in the table but {dt} in the file" for n, tt, dt in diff.type_changes]
    if problems:
        raise FileSchemaMismatchError(table_uri, file, problems)


def _copy(
    copies: Sequence[_Candidate], table_fs: pafs.FileSystem, root: str, table_uri: str
) -> dict[str, tuple[int, int]]:
    """Copy files below the table root; the size and modification time of each copy."""
    out: dict[str, tuple[int, int]] = {}
    for c in copies:
        target = join(root, c.path)
        info = table_fs.get_file_info(target)
        if info.type == pafs.FileType.File and not same_file(c.fs, c.found.path, table_fs, target):
            raise _taken(c, table_uri)
        if info.type != pafs.FileType.File:
            table_fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            pafs.copy_files(c.found.path, target, source_filesystem=c.fs, destination_filesystem=table_fs)
            info = table_fs.get_file_info(target)
        out[c.path] = (info.size, modification_time_ms(info))
    return out
