"""Table maintenance commands (:mod:`deltaflow.ops`): no Spark, text or ``--json``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import click

from deltaflow.cli.options import JSON, REMOTE, STORAGE, key_values
from deltaflow.cli.output import emit, note, print_rows, progress_shown, run_summary, size, verbose
from deltaflow.io.footers import FOOTER_THREADS

if TYPE_CHECKING:
    from deltaflow.ops.add_files import AddFilesResult

__all__ = [
    "add_files",
    "changes",
    "convert",
    "checkpoint",
    "describe",
    "history",
    "optimize",
    "properties",
    "read",
    "restore",
    "vacuum",
]


@click.command()
@click.argument("table_uri")
@click.option("--where", help="Partition predicate: date = '2026-11-22' AND country IN ('DE', 'FR').")
@click.option(
    "--zorder", multiple=True, help="Z-order by these data columns (repeatable) instead of bin-packing."
)
@click.option("--target-size", default="256MB", help="Target file size (e.g. 128MB, 1GB).")
@STORAGE
@JSON
def optimize(
    table_uri: str,
    where: str | None,
    zorder: tuple[str, ...],
    target_size: str,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Compact small files (bin-packing) or Z-order them; the data does not change."""
    from deltaflow import ops

    note(f"{'z-ordering' if zorder else 'compacting'} {table_uri} ...")
    started = time.monotonic()
    result = ops.optimize(
        table_uri,
        where=where,
        zorder=zorder,
        target_size=target_size,
        storage_options=storage_options,
    )
    emit(
        as_json,
        result,
        lambda: click.echo(
            f"{result.mode}: {result.files_removed} file(s) ({size(result.bytes_removed)}) -> "
            f"{result.files_added} file(s) ({size(result.bytes_added)}) in "
            f"{result.partitions_optimized} partition(s); table version {result.version} "
            f"({time.monotonic() - started:.1f} s)"
        ),
    )


@click.command()
@click.argument("table_uri")
@click.option(
    "--retention-hours",
    type=click.IntRange(min=0),
    help="Keep files needed by versions this recent "
    "[default: the table's delta.deletedFileRetentionDuration, 168 h unless set].",
)
@click.option("--dry-run/--execute", default=True, help="List the files (default) or delete them.")
@click.option("--full", is_flag=True, help="Also delete files no commit ever referenced (failed writes).")
@click.option("--force", is_flag=True, help="Allow a retention below the table's minimum.")
@click.option(
    "--include-registered",
    is_flag=True,
    help="Also delete files registered in place (add-files, convert, a watch) and, with --full, "
    "never-referenced files of a table holding such files (kept by default: they are the user's).",
)
@STORAGE
@JSON
def vacuum(
    table_uri: str,
    retention_hours: int | None,
    dry_run: bool,
    full: bool,
    force: bool,
    include_registered: bool,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Delete data files older versions no longer need (a dry run unless --execute)."""
    from deltaflow import ops

    result = ops.vacuum(
        table_uri,
        retention_hours=retention_hours,
        dry_run=dry_run,
        full=full,
        force=force,
        include_registered=include_registered,
        storage_options=storage_options,
    )

    def text() -> None:
        for path in [*result.files, *result.staging_files]:
            click.echo(path)
        count = len(result.files) + len(result.staging_files)
        if result.kept_registered or result.kept_unreferenced:
            note(
                f"kept {result.kept_registered} file(s) registered in place and "
                f"{result.kept_unreferenced} never-referenced file(s) of a table holding such files "
                "(--include-registered deletes them too)",
            )
        if result.kept_staging:
            note(
                f"kept {result.kept_staging} staged file(s) of writers that hold a live claim on the "
                "table (a running stream's batch in progress)",
            )
        if result.kept_in_flight:
            note(
                f"kept {result.kept_in_flight} never-referenced file(s) younger than an hour: the "
                "table was committed to within the hour, and a writer's files wait unreferenced "
                "until their commit",
            )
        if result.dry_run:
            note(
                f"dry run: {count} file(s) would be deleted (retention {result.retention_hours} h); "
                "add --execute to delete them",
            )
        else:
            note(f"deleted {count} file(s) (retention {result.retention_hours} h)")

    emit(as_json, result, text)


@click.command()
@click.argument("table_uri")
@click.option(
    "--cleanup", is_flag=True, help="Also delete log entries older than delta.logRetentionDuration."
)
@STORAGE
@JSON
def checkpoint(table_uri: str, cleanup: bool, storage_options: dict[str, str], as_json: bool) -> None:
    """Write a Delta log checkpoint of the current version."""
    from deltaflow import ops

    result = ops.checkpoint(table_uri, cleanup=cleanup, storage_options=storage_options)
    removed = (
        f"; {result['log_files_removed']} expired log file(s) removed (older than "
        "delta.logRetentionDuration and before the checkpoint)"
        if cleanup
        else ""
    )
    emit(as_json, result, lambda: click.echo(f"checkpoint written at version {result['version']}{removed}"))


@click.command()
@click.argument("table_uri")
@click.option("--limit", type=click.IntRange(min=1), help="Newest N commits only.")
@STORAGE
@JSON
def history(table_uri: str, limit: int | None, storage_options: dict[str, str], as_json: bool) -> None:
    """The table's commits, newest first."""
    from deltaflow import ops

    entries = ops.history(table_uri, limit=limit, storage_options=storage_options)

    def text() -> None:
        for e in entries:
            params = e.get("operationParameters") or {}
            extra = {k: v for k, v in e.items() if k.startswith("deltaflow.")}
            detail = ", ".join(f"{k}={v}" for k, v in {**params, **extra}.items())
            click.echo(
                f"{e.get('version', '?'):>6}  {e.get('timestamp', '')}  {e.get('operation', ''):<10} {detail}"
            )

    emit(as_json, entries, text)


@click.command()
@click.argument("table_uri")
@click.option("--small-file-size", default="128MB", help="Files below this size count as small.")
@STORAGE
@JSON
def describe(table_uri: str, small_file_size: str, storage_options: dict[str, str], as_json: bool) -> None:
    """Schema, partitioning, properties, protocol, version, files and their sizes."""
    from deltaflow import ops

    info = ops.describe(
        table_uri,
        small_file_size=small_file_size,
        storage_options=storage_options,
    )

    def text() -> None:
        files = info["files"]
        protocol = info["protocol"]
        click.echo(f"table      {info['table_uri']}")
        click.echo(f"version    {info['version']} (created {info['created']}, id {info['id']})")
        click.echo(
            f"partitions {', '.join(info['partition_columns']) or '-'} ({files['partitions']} value(s))"
        )
        click.echo(
            f"protocol   reader {protocol['min_reader_version']}, writer {protocol['min_writer_version']}"
            + (f", features {', '.join(protocol['writer_features'])}" if protocol["writer_features"] else "")
        )
        click.echo(
            f"files      {files['count']} ({size(files['bytes'])}, {files['rows']} rows); small "
            f"(< {size(files['small_file_size'])}): {files['small_files']} "
            f"({files['small_file_ratio']:.0%})"
        )
        for bucket in files["size_histogram"]:
            upper = size(bucket["to_bytes"]) if bucket["to_bytes"] is not None else "+"
            click.echo(f"  {size(bucket['from_bytes']):>9} .. {upper:<9} {bucket['files']}")
        click.echo("schema")
        for f in info["schema"]:
            click.echo(f"  {f['name']}: {f['type']}{'' if f['nullable'] else ' NOT NULL'}")
        if info["properties"]:
            click.echo("properties")
            for key, value in sorted(info["properties"].items()):
                click.echo(f"  {key} = {value}")

    emit(as_json, info, text)


@click.command()
@click.argument("table_uri")
@click.option("--version", "version", type=click.IntRange(min=0), help="The version to restore.")
@click.option("--timestamp", help="Restore the last version committed at or before this ISO-8601 time.")
@STORAGE
@JSON
def restore(
    table_uri: str,
    version: int | None,
    timestamp: str | None,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Make an earlier version the current content again (a new commit; history is kept)."""
    from deltaflow import ops

    result = ops.restore(
        table_uri,
        version=version,
        timestamp=timestamp,
        storage_options=storage_options,
    )
    emit(
        as_json,
        result,
        lambda: click.echo(
            f"restored {result.table_uri} to version {result.restored_to}: now version {result.version}"
        ),
    )
    if result.version != result.version_before:
        # On stderr, also with --json: the rows are gone for the running pipelines too.
        note(
            f"warning: the rows added after version {result.restored_to} (up to version "
            f"{result.version_before}) are gone from the table and will NOT be written again by the "
            "pipelines that wrote them: a "
            "restore does not roll back their progress (txn), so they continue after what they had "
            "committed. To have those rows again, replay them from the source (a new pipeline_id "
            "and checkpoint) or restore a newer version",
            level=logging.WARNING,
        )


@click.command()
@click.argument("table_uri")
@click.argument("action", type=click.Choice(["show", "set", "unset"]), default="show")
@click.argument("items", nargs=-1)
@STORAGE
@JSON
def properties(
    table_uri: str, action: str, items: tuple[str, ...], storage_options: dict[str, str], as_json: bool
) -> None:
    """Show table properties, or `set k=v ...` / `unset k ...` them."""
    from deltaflow import ops

    if action != "show" and not items:
        raise click.BadParameter(f"{action} needs at least one property", param_hint="ITEMS")
    result = ops.properties(
        table_uri,
        set_=key_values(items, "ITEMS") if action == "set" else None,
        unset=items if action == "unset" else (),
        storage_options=storage_options,
    )
    emit(as_json, result, lambda: click.echo("\n".join(f"{k} = {v}" for k, v in sorted(result.items()))))


@click.command()
@click.argument("table_uri")
@click.option("--version", "version", type=click.IntRange(min=0), help="Read this version (time travel).")
@click.option("--timestamp", help="Read the table as of this ISO-8601 time.")
@click.option("--where", help="SQL predicate over the columns, e.g. \"country = 'DE' AND amount > 10\".")
@click.option("--column", "columns", multiple=True, help="Only these columns (repeatable).")
@click.option("--limit", type=click.IntRange(min=0), default=20, help="At most N rows (0 = all).")
@STORAGE
@JSON
def read(
    table_uri: str,
    version: int | None,
    timestamp: str | None,
    where: str | None,
    columns: tuple[str, ...],
    limit: int,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Print rows of the table, now or at an earlier version."""
    from deltaflow import ops

    rows = ops.read(
        table_uri,
        version=version,
        timestamp=timestamp,
        where=where,
        columns=columns,
        limit=limit or None,
        storage_options=storage_options,
    )
    emit(as_json, rows, lambda: print_rows(rows))


@click.command()
@click.argument("table_uri")
@click.option("--from-version", type=click.IntRange(min=0), default=0, help="First version to include.")
@click.option("--to-version", type=click.IntRange(min=0), help="Last version to include [default: current].")
@click.option("--limit", type=click.IntRange(min=0), default=0, help="At most N rows (0 = all).")
@STORAGE
@JSON
def changes(
    table_uri: str,
    from_version: int,
    to_version: int | None,
    limit: int,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Print the change data feed (tables with delta.enableChangeDataFeed=true)."""
    from deltaflow import ops

    rows = ops.changes(
        table_uri,
        from_version=from_version,
        to_version=to_version,
        limit=limit or None,
        storage_options=storage_options,
    )
    emit(as_json, rows, lambda: print_rows(rows))


#: Without a terminal, a progress line on stderr every this many footers read.
PROGRESS_EVERY = 1000
#: Shortest interval between redraws of the progress bar on a terminal.
PROGRESS_REDRAW_S = 0.2
#: Skipped paths listed one per line before the rest are only counted: a rerun over a folder of
#: 10,000 registered files says so in a few lines (``deltaflow -v`` lists every one).
LISTED_PATHS = 10


def _footer_progress() -> tuple[Callable[[int, int], None], Callable[[], None]]:
    """A progress callback for footer reading, and the function that ends its output."""
    from deltaflow.cli.output import ProgressLine

    started = time.monotonic()
    bar = ProgressLine("footers", "files") if progress_shown() else None
    shown = [0.0]

    def progress(done: int, total: int) -> None:
        rate = done / max(time.monotonic() - started, 1e-6)
        if bar is not None:
            now = time.monotonic()
            if done == total or now - shown[0] >= PROGRESS_REDRAW_S:
                shown[0] = now
                bar.show(done, total - done, rate)
        elif done % PROGRESS_EVERY == 0 or (done == total and total >= PROGRESS_EVERY):
            note(f"read {done:,}/{total:,} footers ({rate:,.0f} files/s)")

    return progress, bar.close if bar is not None else (lambda: None)


def _list_paths(what: str, paths: Sequence[str]) -> None:
    shown = paths if verbose() else paths[:LISTED_PATHS]
    for path in shown:
        note(f"{what}: {path}")
    if len(paths) > len(shown):
        note(f"{what}: {len(paths) - len(shown):,} more (deltaflow -v lists every one)")


def _print_added(result: AddFilesResult, started: float) -> None:
    _list_paths("skipped (already in the table)", result.skipped)
    _list_paths("named twice (added once)", result.named_twice)
    if result.dry_run:
        for f in result.files:
            parts = ", ".join(f"{k}={v}" for k, v in f.partition_values.items())
            click.echo(f"{f.path}\t{f.rows} rows\t{size(f.size)}" + (f"\t{parts}" if parts else ""))
        note(
            f"dry run: {result.files_added} file(s) ({result.rows_added} rows, "
            f"{size(result.bytes_added)}) would be added to {result.table_uri}"
            + (" (a new table)" if result.created else "")
            + (f", {result.files_copied} of them copied below its root first" if result.files_copied else "")
            + f"; {result.files_skipped} skipped; nothing was committed",
        )
        return
    if not result.files_added:
        note(f"nothing to add to {result.table_uri} ({result.files_skipped} file(s) skipped)")
        return
    click.echo(
        f"added {result.files_added} file(s) ({result.rows_added} rows, {size(result.bytes_added)}) to "
        f"{result.table_uri} as version {result.version}"
        + (" (created the table)" if result.created else "")
        + (f"; {result.files_copied} copied below its root" if result.files_copied else "")
        + f"; {result.files_skipped} skipped ({time.monotonic() - started:.1f} s)"
    )


def _watch(
    table_uri: str,
    path: str,
    *,
    copy: bool,
    available_now: bool,
    pipeline_id: str,
    checkpoint_location: str | None,
    trigger_interval: str | None,
    max_files_per_trigger: int | None,
    spark_master: str | None,
    storage_options: dict[str, str],
) -> None:
    """``add-files --watch``: the pipeline a YAML ``parquet-files`` source makes, run as ``run``
    runs pipelines (restarts on transient errors, stops on signals)."""
    from pydantic import ValidationError

    import deltaflow
    from deltaflow.config.pipeline import PipelineSpec
    from deltaflow.pipeline.session import stop_session
    from deltaflow.service.daemon import run_pipelines

    source: dict[str, object] = {"type": "parquet-files", "path": path, "copy": copy}
    if max_files_per_trigger:
        source["max_files_per_trigger"] = max_files_per_trigger
    try:
        spec = PipelineSpec.model_validate(
            {
                "pipeline_id": pipeline_id,
                "source": source,
                "sinks": [{"table_uri": table_uri, "storage_options": storage_options}],
                "checkpoint_location": checkpoint_location,
                "trigger_interval": trigger_interval,
            }
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise click.UsageError(problems) from None
    spark = deltaflow.spark_session(spark_master, job=f"watch:{pipeline_id}")
    try:
        summaries = run_pipelines(spark, [spec], available_now=available_now)
    finally:
        stop_session(spark)
    summary = summaries[spec.pipeline_id]
    click.echo(run_summary(spec.pipeline_id, summary))


@click.command("add-files")
@click.argument("table_uri")
@click.argument("paths", nargs=-1, required=True)
@click.option(
    "--copy",
    is_flag=True,
    help="Copy files outside the table's root below it first (keeping their col=value folders), "
    "then register the copies. Without it such files are refused.",
)
@click.option(
    "--dry-run", is_flag=True, help="List what would be added (path, rows, size, partition values)."
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=FOOTER_THREADS,
    help="Parquet footers read at once (object stores are latency-bound).",
)
@click.option(
    "--watch",
    is_flag=True,
    help="Keep registering the files that land in PATH (one folder or object-store prefix), each "
    "exactly once, through a Spark streaming query (one commit per micro-batch) until SIGTERM/SIGINT.",
)
@click.option(
    "--available-now",
    is_flag=True,
    help="With --watch: register what has landed since the last run, then exit.",
)
@click.option(
    "--pipeline-id",
    default="add-files",
    help="With --watch: the query's identity (txn app id, default checkpoint folder).",
)
@click.option(
    "--checkpoint-location",
    help="With --watch: Spark's checkpoint (which files it took) "
    "[default: TABLE/_deltaflow/checkpoints/PIPELINE_ID for a local table].",
)
@click.option("--trigger-interval", help="With --watch: time between micro-batches, e.g. '30 seconds'.")
@click.option(
    "--max-files-per-trigger", type=click.IntRange(min=1), help="With --watch: files per commit at most."
)
@click.option(
    "--spark-master",
    default=None,
    envvar="DELTAFLOW_SPARK_MASTER",
    show_envvar=True,
    help="With --watch: Spark master URL [default: local[*]].",
)
@REMOTE
@STORAGE
@JSON
def add_files(
    table_uri: str,
    paths: tuple[str, ...],
    copy: bool,
    dry_run: bool,
    threads: int,
    watch: bool,
    available_now: bool,
    pipeline_id: str,
    checkpoint_location: str | None,
    trigger_interval: str | None,
    max_files_per_trigger: int | None,
    spark_master: str | None,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Register existing Parquet files (files, folders, globs) in a Delta table without rewriting
    them, in one commit; the table is created from the first file when missing. Statistics come
    from the footers, partition values from col=value folders."""
    from deltaflow import ops

    if watch:
        if dry_run or len(paths) != 1:
            raise click.UsageError("--watch takes exactly one folder and no --dry-run")
        _watch(
            table_uri,
            paths[0],
            copy=copy,
            available_now=available_now,
            pipeline_id=pipeline_id,
            checkpoint_location=checkpoint_location,
            trigger_interval=trigger_interval,
            max_files_per_trigger=max_files_per_trigger,
            spark_master=spark_master,
            storage_options=storage_options,
        )
        return
    if available_now:
        raise click.UsageError("--available-now goes with --watch")
    _register(
        as_json,
        lambda progress: ops.add_files(
            table_uri,
            paths,
            copy=copy,
            dry_run=dry_run,
            storage_options=storage_options,
            threads=threads,
            progress=progress,
        ),
    )


@click.command()
@click.argument("path")
@click.option(
    "--partition-by",
    multiple=True,
    help="A partition column (repeatable, in folder order); the col=value folders must match.",
)
@click.option("--dry-run", is_flag=True, help="List what version 0 would hold; commit nothing.")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=FOOTER_THREADS,
    help="Parquet footers read at once (object stores are latency-bound).",
)
@STORAGE
@JSON
def convert(
    path: str,
    partition_by: tuple[str, ...],
    dry_run: bool,
    threads: int,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Make a folder of Parquet files a Delta table in place (CONVERT TO DELTA): version 0
    references every *.parquet file below it; no data is read or rewritten."""
    from deltaflow import ops

    _register(
        as_json,
        lambda progress: ops.convert(
            path,
            partition_by=partition_by,
            dry_run=dry_run,
            storage_options=storage_options,
            threads=threads,
            progress=progress,
        ),
    )


def _register(as_json: bool, call: Callable[[Callable[[int, int], None]], AddFilesResult]) -> None:
    """Run ``add_files``/``convert`` with footer progress on stderr, then print the result."""
    started = time.monotonic()
    progress, done = _footer_progress()
    try:
        result = call(progress)
    finally:
        done()
    emit(as_json, result, lambda: _print_added(result, started))
