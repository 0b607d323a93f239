"""Which files of a table were registered in place: the user's files, not the table's writers'.

``add-files``, ``convert`` and a watch register Parquet files they did not write. The log forgets
that (``commitInfo`` is gone after a checkpoint and log cleanup, and a compaction removes the
originals from the active files), so each registration leaves a durable record beside the log::

    <table>/_deltaflow/registered/<id>.json       {"paths": [...], "after": V}, written BEFORE
                                                  the commit (V: the table's version then)
    <table>/_deltaflow/registered/<id>.committed  {"version": N}, written after it landed

Both are written once and never changed by deltaflow. Paths are relative to the table root, as
on disk (not percent-encoded), like the log's ``add`` paths once unquoted.

What each reader makes of them:

* ``vacuum`` keeps every path of every record, committed or not: a crash between the record and
  its commit can only keep files that are not the table's (over-protection, never a loss).
* Registering skips every path of a COMMITTED record (and the table's active files): a path
  registered once is never registered again, even after compaction removed it from the active
  files and a watch lost its checkpoint. A record without its marker (a crash around the commit)
  counts once its paths are found in the table, active or added by a log entry after V
  (:func:`settle` writes the marker then); until then its paths may be registered again (a
  record whose log entries were cleaned up before any registration settled it: warned about).

To register a path again on purpose (e.g. after deleting its rows), remove it from its record
(rewrite the ``.json`` without it, or delete the record and its marker: then vacuum no longer
keeps those files either) and run ``deltaflow add-files`` on it: a watch does not offer a path
the log still names.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from threading import Lock

import pyarrow.fs as pafs

from deltaflow.config.locations import join, normalize_uri
from deltaflow.delta.layout import REGISTERED_DIR
from deltaflow.io.storage import filesystem

__all__ = ["Registered", "load", "mark_committed", "record", "settle"]

logger = logging.getLogger(__name__)

_RECORD = ".json"
_MARKER = ".committed"

# Records are written once: a parsed one is cached by (file, size, mtime), so a long watch reads
# each record once however many batches list the folder (an edited record has a new mtime).
_cache: dict[tuple[str, int, int], Record] = {}
_cache_lock = Lock()


@dataclass(frozen=True)
class Record:
    """One registration: its paths, and the table version before its commit (-1: no table)."""

    paths: frozenset[str]
    after: int


@dataclass(frozen=True)
class Registered:
    """The records of one table."""

    #: Paths of records whose commit landed (marker written).
    committed: frozenset[str] = frozenset()
    #: Record id -> record, for records without a marker yet.
    pending: Mapping[str, Record] = field(default_factory=dict)

    @property
    def paths(self) -> frozenset[str]:
        """Every recorded path (what vacuum keeps)."""
        return self.committed.union(*(r.paths for r in self.pending.values()))

    @property
    def exists(self) -> bool:
        """The table holds (or was about to hold) files registered in place."""
        return bool(self.committed or self.pending)


def _where(table_uri: str, storage_options: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    fs, root = filesystem(normalize_uri(table_uri), storage_options)
    return fs, join(root, REGISTERED_DIR)


def record(table_uri: str, storage_options: Mapping[str, str], paths: Iterable[str], after: int) -> str:
    """Write the record of ``paths`` about to be committed to the table now at version ``after``
    (-1: none yet); its id (for :func:`mark_committed`)."""
    fs, base = _where(table_uri, storage_options)
    record_id = uuid.uuid4().hex
    fs.create_dir(base, recursive=True)
    body = json.dumps({"paths": sorted(paths), "after": after}).encode()
    with fs.open_output_stream(join(base, record_id + _RECORD)) as out:
        out.write(body)
    return record_id


def mark_committed(
    table_uri: str, storage_options: Mapping[str, str], record_id: str, version: int | None
) -> None:
    """The commit of record ``record_id`` landed (as ``version``, when known)."""
    fs, base = _where(table_uri, storage_options)
    with fs.open_output_stream(join(base, record_id + _MARKER)) as out:
        out.write(json.dumps({"version": version}).encode())


def _read(fs: pafs.FileSystem, info: pafs.FileInfo) -> Record | None:
    key = (info.path, info.size or 0, info.mtime_ns or 0)
    with _cache_lock:
        hit = _cache.get(key)
    if hit is not None:
        return hit
    try:
        with fs.open_input_stream(info.path) as f:
            body = json.loads(f.read())
        found = Record(frozenset(str(p) for p in body["paths"]), int(body.get("after", -1)))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        # Only a crash while writing it leaves a broken record, and its commit never started.
        logger.warning("ignoring the unreadable registration record %s: %s", info.path, exc)
        return None
    with _cache_lock:
        _cache[key] = found
    return found


def load(table_uri: str, storage_options: Mapping[str, str]) -> Registered:
    """Every record of the table at ``table_uri`` (none: an empty :class:`Registered`)."""
    fs, base = _where(table_uri, storage_options)
    try:
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    except FileNotFoundError:
        return Registered()
    files = {i.base_name: i for i in infos if i.type == pafs.FileType.File}
    committed: set[str] = set()
    pending: dict[str, Record] = {}
    for name, info in files.items():
        if not name.endswith(_RECORD):
            continue
        found = _read(fs, info)
        if found is None:
            continue
        record_id = name[: -len(_RECORD)]
        if record_id + _MARKER in files:
            committed |= found.paths
        else:
            pending[record_id] = found
    return Registered(frozenset(committed), pending)


def settle(
    table_uri: str,
    storage_options: Mapping[str, str],
    registered: Registered,
    referenced: set[str],
    version: int,
) -> Registered:
    """Records without a marker whose commit landed (the process died before the marker): their
    paths are all active (``referenced``) or all added by the log entries after the record's
    version up to ``version``. Write their markers; the records as they are now."""
    from deltaflow.delta.commit import read_entries

    done: dict[str, Record] = {}
    for record_id, rec in registered.pending.items():
        if rec.paths <= referenced:
            done[record_id] = rec
            continue
        missing: list[int] = []
        entries = read_entries(table_uri, storage_options, rec.after + 1, version, missing)
        added = frozenset().union(*(e.added for e in entries))
        if rec.paths <= added:
            done[record_id] = rec
        elif missing:
            logger.warning(
                "registration record %s of %s: the log entries after version %d are cleaned up; "
                "whether its %d path(s) were committed cannot be read, they may be registered again",
                record_id,
                table_uri,
                rec.after,
                len(rec.paths),
            )
    for record_id in done:
        mark_committed(table_uri, storage_options, record_id, None)
    if not done:
        return registered
    return Registered(
        registered.committed.union(*(r.paths for r in done.values())),
        {rid: r for rid, r in registered.pending.items() if rid not in done},
    )
