"""``vacuum``: delete files older versions no longer need; a dry run unless told otherwise,
never below the table's retention unless forced, and never the files registered in place
(``add-files``, ``convert``, a watch) unless told.

Registered files are the user's: the table did not write them. A compaction tombstones them
like any other file, so in a table holding registered files (:mod:`deltaflow.delta.registered`)
vacuum asks delta-rs for a dry run, leaves out every recorded path, and deletes the rest itself.
In such a table ``full`` does not delete files the log never referenced either (a file landed in
a watched folder and not registered yet, a file ``add-files`` refused look exactly like the
orphans of a failed write): only tombstoned files and deltaflow's staging folder go.
``include_registered`` restores delta-rs' own behaviour for both.

``full`` also clears deltaflow's staging folder (``write_path=spark``), but never the files of a
writer that holds a live claim on the table (:func:`deltaflow.delta.commit.claim_writer`): its
running batch is staged there, and a batch whose staged files vanished would lose its rows.
A writer stages under its epoch (:func:`deltaflow.delta.layout.staging_dir`), and the table's
``txn(deltaflow-writer:<pipeline_id>)`` says which epoch holds the pipeline now.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deltaflow.config.locations import join, normalize_uri
from deltaflow.delta import registered
from deltaflow.delta.commit import fence_app_id
from deltaflow.delta.layout import STAGING_DIR, staging_epoch
from deltaflow.delta.progress import transaction_version
from deltaflow.errors import ConfigError
from deltaflow.io.storage import filesystem
from deltaflow.ops.table import open_table

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    from deltalake import DeltaTable

__all__ = ["DEFAULT_RETENTION", "VacuumResult", "retention", "vacuum"]

logger = logging.getLogger(__name__)


#: Delta's default ``delta.deletedFileRetentionDuration``: vacuum never goes below it unforced.
DEFAULT_RETENTION = dt.timedelta(days=7)

#: ``full`` keeps never-referenced files younger than this while the table was committed to
#: within it, whatever the (forced) retention: a writer's files wait unreferenced between their
#: write and their commit (a micro-batch's tasks write into the table root, the driver commits
#: them together), and a file deleted in that window is either a failed batch or, deleted after
#: the writer checked its files, a commit referencing a missing file (measured by the soak:
#: ``vacuum --full --retention-hours 0 --force`` beside a stream). A writer that takes longer
#: than this from writing a file to committing it is not protected.
IN_FLIGHT = dt.timedelta(hours=1)


_INTERVAL = re.compile(
    r"^\s*(?:interval\s+)?(\d+(?:\.\d+)?)\s*"
    r"(microseconds?|milliseconds?|seconds?|minutes?|hours?|days?|weeks?)\s*$",
    re.IGNORECASE,
)


def _interval(text: str) -> dt.timedelta:
    m = _INTERVAL.match(text)
    if m is None:
        raise ConfigError(f"cannot read the interval {text!r} (expected e.g. 'interval 7 days')", value=text)
    unit = m.group(2).lower().rstrip("s")
    return dt.timedelta(**{f"{unit}s": float(m.group(1))})


def retention(table: DeltaTable) -> dt.timedelta:
    """The table's ``delta.deletedFileRetentionDuration`` (default 7 days)."""
    raw = table.metadata().configuration.get("delta.deletedFileRetentionDuration")
    return _interval(raw) if raw else DEFAULT_RETENTION


@dataclass(frozen=True)
class VacuumResult:
    """Files a vacuum deleted (or, in a dry run, would delete)."""

    table_uri: str
    dry_run: bool
    retention_hours: int
    full: bool
    files: list[str]
    staging_files: list[str] = field(default_factory=list)
    #: Registered files (``_deltaflow/registered/``) vacuum would have deleted and kept.
    kept_registered: int = 0
    #: Never-referenced files kept because the table holds registered files (``full`` only).
    kept_unreferenced: int = 0
    #: Staging files older than the retention kept because their writer holds a live claim on
    #: the table (``full`` only).
    kept_staging: int = 0
    #: Never-referenced files younger than :data:`IN_FLIGHT` kept because the table was
    #: committed to within it: a writer's files waiting for their commit (``full`` only).
    kept_in_flight: int = 0


def vacuum(
    uri: str,
    *,
    retention_hours: int | None = None,
    dry_run: bool = True,
    full: bool = False,
    force: bool = False,
    include_registered: bool = False,
    storage_options: Mapping[str, str] | None = None,
) -> VacuumResult:
    """Delete data files no version within the retention period needs (a dry run by default).

    ``full`` also deletes files the log never referenced (left by failed or killed writes),
    including deltaflow's staging folder, older than the retention period; the staging files of
    a writer holding a live claim on the table are kept (``kept_staging``) whatever their age.

    Files registered in place are kept (``kept_registered``), and in a table holding any, so
    are never-referenced files (``kept_unreferenced``), unless ``include_registered``.

    Raises:
        ConfigError: ``retention_hours`` is below the table's retention and ``force`` is off.
    """
    table = open_table(uri, storage_options)
    minimum = retention(table)
    min_hours = math.ceil(minimum.total_seconds() / 3600)
    hours = min_hours if retention_hours is None else retention_hours
    if hours < 0:
        raise ConfigError("--retention-hours must be 0 or more")
    if hours < minimum.total_seconds() / 3600 and not force:
        raise ConfigError(
            f"retention of {hours} h is below the table's minimum of {min_hours} h "
            "(delta.deletedFileRetentionDuration, 7 days unless set): readers or streams still "
            "on older versions would lose files. Use --retention-hours "
            f"{min_hours} or more, or --force if nothing reads older versions",
            table_uri=normalize_uri(uri),
        )
    records = registered.load(normalize_uri(uri), storage_options or {})
    kept_registered = kept_unreferenced = kept_in_flight = 0
    keep_unreferenced = records.exists and not include_registered
    guard = full and dt.timedelta(hours=hours) < IN_FLIGHT and _written_within(table, IN_FLIGHT)
    if not keep_unreferenced and not guard:
        files = table.vacuum(
            retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False, full=full
        )
    else:
        # Step 1. What delta-rs would delete: tombstoned files (and, for full, unreferenced ones).
        tombstoned = set(table.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False))
        candidates = tombstoned
        if full:
            candidates = set(
                table.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False, full=True)
            )
        # Step 2. Leave out the user's files (registered ones, and in such a table every
        # never-referenced one), and the never-referenced files a writer may still commit.
        protected = records.paths if keep_unreferenced else set()
        unreferenced = candidates - tombstoned - protected
        kept_registered = len(candidates & protected)
        if keep_unreferenced:
            kept_unreferenced, unreferenced = len(unreferenced), set()
        elif guard:
            young = _younger_than(uri, storage_options or {}, sorted(unreferenced), IN_FLIGHT)
            kept_in_flight, unreferenced = len(young), unreferenced - young
        files = sorted((tombstoned - protected) | unreferenced)
        # Step 3. Delete the rest ourselves (delta-rs' VACUUM START/END entries are not written:
        # commit info only, nothing a reader or a writer of the table needs).
        if not dry_run:
            _delete(uri, storage_options or {}, files)
    staging: list[str] = []
    kept_staging = 0
    if full:
        staging, kept_staging = _vacuum_staging(uri, storage_options or {}, table, hours, dry_run)
    result = VacuumResult(
        normalize_uri(uri),
        dry_run,
        hours,
        full,
        sorted(files),
        staging,
        kept_registered,
        kept_unreferenced,
        kept_staging,
        kept_in_flight,
    )
    if kept_in_flight:
        logger.warning(
            "vacuum of %s kept %d never-referenced file(s) younger than %s: the table was committed "
            "to within that time, and a writer's files wait unreferenced until their commit "
            "(deleting them could leave a commit referencing a missing file)",
            result.table_uri,
            kept_in_flight,
            IN_FLIGHT,
        )
    logger.info(
        "vacuum of %s%s: %d file(s)%s; kept %d registered and %d never-referenced file(s) of the "
        "user, and %d staged file(s) of writers holding a live claim",
        result.table_uri,
        " (dry run)" if dry_run else "",
        len(files) + len(staging),
        " would be deleted" if dry_run else " deleted",
        kept_registered,
        kept_unreferenced,
        kept_staging,
    )
    return result


def _written_within(table: DeltaTable, span: dt.timedelta) -> bool:
    """Whether the table's newest commit is younger than ``span`` (a writer may be active)."""
    newest = table.history(1)
    stamp = newest[0].get("timestamp") if newest else None
    if stamp is None:
        return True  # unknown: assume a writer
    age_ms = dt.datetime.now(dt.UTC).timestamp() * 1000 - int(stamp)
    return age_ms < span.total_seconds() * 1000


def _younger_than(
    uri: str, storage_options: Mapping[str, str], paths: list[str], span: dt.timedelta
) -> set[str]:
    """Which of ``paths`` (relative to the table root) were modified less than ``span`` ago."""
    if not paths:
        return set()
    fs, root = filesystem(normalize_uri(uri), storage_options)
    cutoff = dt.datetime.now(dt.UTC) - span
    young = set()
    for path, info in zip(paths, fs.get_file_info([join(root, p) for p in paths]), strict=True):
        mtime = _mtime(info)
        if mtime is not None and mtime > cutoff:  # None: gone already
            young.add(path)
    return young


def _mtime(info: pafs.FileInfo) -> dt.datetime | None:
    """A listed file's modification time, in UTC (``None`` when storage gives none)."""
    mtime: dt.datetime | None = info.mtime
    if mtime is None:
        return None
    return mtime if mtime.tzinfo else mtime.replace(tzinfo=dt.UTC)


def _delete(uri: str, storage_options: Mapping[str, str], paths: list[str]) -> None:
    """Delete table files (paths relative to the root, as delta-rs' vacuum lists them)."""
    fs, root = filesystem(normalize_uri(uri), storage_options)
    for path in paths:
        with contextlib.suppress(FileNotFoundError):  # another vacuum was faster
            fs.delete_file(join(root, path))


def _vacuum_staging(
    uri: str, storage_options: Mapping[str, str], table: DeltaTable, hours: int, dry_run: bool
) -> tuple[list[str], int]:
    """Staging files of ``write_path=spark`` batches older than ``hours`` (the deleted ones),
    and how many of that age were kept because their writer holds a live claim.

    Step 1. Read the claims: the table's writer epoch per pipeline (``table`` was loaded before
            the listing, so a claim made since is newer than the one read: its files are kept).
    Step 2. List the staging folder; a file staged under epoch N of a pipeline whose table epoch
            is at most N (or shows no claim: expired txns hide it) belongs to a live claim and
            stays, whatever its age. Older epochs are writers another one took over from (they
            stop at their next commit) or that died; their files and those of writers without
            a claim go by age.
    """
    import pyarrow.fs as pafs

    fs, root = filesystem(normalize_uri(uri), storage_options)
    base = join(root, STAGING_DIR)
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    except (OSError, FileNotFoundError):
        return [], 0
    # Step 1. The claims, one look per pipeline.
    held: dict[str, int | None] = {}

    def live(parts: tuple[str, ...]) -> bool:
        claim = staging_epoch(parts)
        if claim is None:
            return False
        pipeline, epoch = claim
        if pipeline not in held:
            held[pipeline] = transaction_version(table, fence_app_id(pipeline))
        current = held[pipeline]
        return current is None or epoch >= current

    # Step 2. Keep a live claim's files; the rest go by age.
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(hours=hours)
    old = []
    kept = 0
    for info in infos:
        mtime = _mtime(info)
        if info.type != pafs.FileType.File or mtime is None or mtime > cutoff:
            continue
        if live(tuple(info.path[len(base) :].strip("/").split("/"))):
            kept += 1
        else:
            old.append(info.path)
    if not dry_run:
        for path in old:
            with contextlib.suppress(FileNotFoundError):  # its batch moved it meanwhile
                fs.delete_file(path)
    return sorted(p[len(root) :].lstrip("/") for p in old), kept
