"""Every commit deltaflow makes to a Delta log, with one retry policy and one rule.

**The commit rule.** A file the log references is never deleted by a writer, and an unknown
commit outcome is resolved by reading the log.

A call into delta-rs that commits may raise although its commit landed: the request reached the
store, the response was lost (a timeout, a reset, a load balancer's 500). So :func:`commit`
never trusts an error. Every commit carries a token of its own in its commit info
(``deltaflow.commit_token``, the same for all attempts of one commit); after any error the
table is loaded again and the log entries written since the first attempt began are read
(:func:`read_entries`): an entry carrying the token is this commit, landed. Only when it is not
there does the work's own check (``already_done``: "does the log hold this batch's txn?")
decide whether someone else did the work (then, and only then, a writer may delete its own
files: no entry references them) or whether to try again.

The sequence of :func:`commit`, once per attempt (DESIGN.md, "The commit rule"). For a
micro-batch it is step 4 of the batch's sequence (``sinks/datasource.py``), hence the numbers:

Step 4.1. Load the table afresh (its version is the base of the attempt). The first attempt may
        start from the table its caller has just loaded (``loaded``): the caller's own checks
        (a replay, the fence) read that load, and one load per commit is what a batch over
        hundreds of tables pays per table.
Step 4.2. Resolve earlier attempts: a log entry after the first attempt's base that carries this
        commit's token means an attempt landed although it reported an error: COMMITTED.
Step 4.3. Fence: with a writer epoch (:func:`claim_writer`), the table's epoch for the pipeline
        must still be ours; a newer one means another process took the pipeline over, and this
        one stops (:class:`~deltaflow.errors.WriterFencedError`).
Step 4.4. Done check: ``already_done(table)`` (a replay, or another writer's commit of the same
        work, e.g. the winner of a race to create the table): ALREADY_DONE, nothing committed.
        Otherwise a terminal error of the previous attempt is raised now.
Step 4.5. Attempt: ``attempt(table, properties)`` with the token, the txns and the fence's txn in
        the properties. Success: COMMITTED.
Step 4.6. On error: terminal errors go back to step 4.1 at once (they are raised in step 4.4 once
        the log shows the attempt did not land and the work is not done); transient ones
        wait (:class:`RetryPolicy`) and go back to step 4.1. After the last retry
        :class:`~deltaflow.errors.CommitError`: the log does not hold the commit, but a
        request still in flight may land it, so callers keep the files it references.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar
from urllib.parse import unquote

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, DeltaProtocolError
from deltalake.exceptions import SchemaMismatchError as _DeltaSchemaMismatch
from deltalake.exceptions import TableNotFoundError as _DeltaTableNotFound
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from deltaflow.config.locations import join
from deltaflow.delta import log as delta_log
from deltaflow.delta.progress import transaction_version, warn_on_txn_retention
from deltaflow.delta.schema import delta_schema
from deltaflow.errors import (
    ACCESS_DENIED,
    CommitError,
    DeltaflowError,
    StorageAccessError,
    TableNotFoundError,
    TerminalError,
    TransientError,
    WriterFencedError,
)
from deltaflow.errors import brief as _brief
from deltaflow.io.faults import maybe_lose_response
from deltaflow.io.parquet import WrittenFile
from deltaflow.io.storage import filesystem

__all__ = [
    "COMMIT_TOKEN_KEY",
    "CommitResult",
    "Fence",
    "LogEntry",
    "Outcome",
    "RetryPolicy",
    "add_columns",
    "check_fence",
    "claim_writer",
    "commit",
    "commit_files",
    "create_claimed_table",
    "create_table",
    "fence_app_id",
    "is_terminal",
    "read_entries",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: ``loaded`` of :func:`commit` when the caller has not loaded the table (the first attempt loads it).
NOT_LOADED: Any = object()

#: First wait after a failed attempt, doubled after each further failure (100, 200, 400 ms ...),
#: the schedule Rivven's Delta sink uses. Conflicts on a busy table clear within a few hundred ms.
COMMIT_BACKOFF_S = 0.1
#: Cap of one wait, so that a high retry count does not sleep for minutes.
COMMIT_BACKOFF_MAX_S = 10.0
#: Retries after the first failed attempt unless the caller says otherwise (``max_commit_retries``).
DEFAULT_RETRIES = 3
#: delta-rs' own retries inside one attempt (its conflict resolution against newer versions).
DELTA_RS_COMMIT_RETRIES = 15
#: The commit-info key holding the token shared by every attempt of one commit.
COMMIT_TOKEN_KEY = "deltaflow.commit_token"
#: The commit-info key naming the process that committed (``host:pid``).
WRITER_KEY = "deltaflow.writer"
#: Commit-info keys of a writer claim (:func:`claim_writer`).
CLAIM_KEY = "deltaflow.claim"
EPOCH_KEY = "deltaflow.writer_epoch"
#: Txn app ids of writer epochs are this prefix + the pipeline id (a name no Kafka progress txn,
#: ``<app>-<topic>-<partition>``, and no batch-id txn of a sane pipeline id takes).
FENCE_PREFIX = "deltaflow-writer:"
#: How many log entries back the fenced writer looks for the claim that fenced it (its message).
CLAIM_SEARCH_DEPTH = 1000

#: The words of a store or network failure that may heal: 5xx, throttling, timeouts, resets,
#: refused connections.
_STORE_FAILURE = (
    r"error sending request|connection|timed? ?out|timeout|reset by peer|broken pipe"
    r"|\b50[0-4]\b|Internal ?Server ?Error|InternalError|Service ?Unavailable|SlowDown|Throttl"
    r"|temporarily|dns|Io error|I/O error|os error|unexpected EOF|hyper"
)
#: Errors of a store or network that may heal (delta-rs wraps object_store's errors in
#: DeltaError/OSError text, "Generic S3 error: ...").
_STORAGE_TRANSIENT = re.compile(r"Generic \w+ error|" + _STORE_FAILURE, re.IGNORECASE)

#: delta-rs errors about the data itself (a value that does not parse or cast, a schema that does
#: not fit): the same data fails the same way every time, though delta-rs wraps them as
#: "Generic DeltaTable error", the wording of its store failures too. Matched in the error's
#: words before its first quote only: what follows quotes the value, which is the user's text.
_DATA_ERROR = re.compile(
    r"Arrow error|Parser error|Cast error|Schema error|Json error|Invalid argument error|Invalid data"
    r"|Unsupported|not supported|SQL error|Plan\(|Error during planning",
    re.IGNORECASE,
)
#: ... unless a store failure is what the data error wraps (Arrow wraps I/O and external errors).
_STORE_UNDERNEATH = re.compile(
    r"External error|HTTP error|decoding response|" + _STORE_FAILURE, re.IGNORECASE
)


def _data_error(text: str) -> bool:
    """Whether delta-rs' ``text`` is about the data (its words before the quoted value)."""
    words = re.split(r"['\"`]", text, maxsplit=1)[0]
    return bool(_DATA_ERROR.search(words)) and not _STORE_UNDERNEATH.search(words)


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a commit is tried again after an error.

    Attributes:
        max_retries: Attempts after the first one.
        backoff_s: The first wait; doubled after each further failure.
        backoff_max_s: The longest single wait.
    """

    max_retries: int = DEFAULT_RETRIES
    backoff_s: float = COMMIT_BACKOFF_S
    backoff_max_s: float = COMMIT_BACKOFF_MAX_S

    def waits(self) -> Iterator[float]:
        """The wait before each retry (``max_retries`` of them)."""
        wait = self.backoff_s
        for _ in range(self.max_retries):
            yield wait
            wait = min(wait * 2, self.backoff_max_s)


class Outcome(Enum):
    """What a commit came to."""

    #: This commit is in the log (possibly after an attempt that reported an error).
    COMMITTED = "committed"
    #: The log already held the work (a replay, or another writer's commit of it); this commit's
    #: token is in no log entry, so the files it would have added are referenced by none.
    ALREADY_DONE = "already_done"


@dataclass(frozen=True)
class CommitResult(Generic[T]):
    """The outcome of :func:`commit`, decided from the log."""

    outcome: Outcome
    #: The table version of this commit (COMMITTED; ``None`` when it could not be read back) or
    #: the version that held the work (ALREADY_DONE).
    version: int | None
    attempts: int
    token: str
    #: An attempt reported an error, and the log shows it landed.
    recovered: bool = False
    #: What ``attempt`` returned; ``None`` when recovered or already done.
    value: T | None = None
    #: The commit info of this commit's log entry, when it was read from the log (recovered).
    info: Mapping[str, Any] = field(default_factory=dict)
    #: An attempt ended in an error (any error: even delta-rs' conflicts can hide a landed write),
    #: or the log could not show whether one landed: with ALREADY_DONE the files it would have
    #: added must be kept (orphans for ``vacuum --full``), never deleted.
    in_doubt: bool = False

    @property
    def may_delete_files(self) -> bool:
        """Whether the files this commit would have added may be deleted: no log entry holds them
        and no attempt of it can still land."""
        return self.outcome is Outcome.ALREADY_DONE and not self.in_doubt

    @property
    def committed(self) -> bool:
        return self.outcome is Outcome.COMMITTED

    @property
    def retries(self) -> int:
        return max(0, self.attempts - 1)


@dataclass(frozen=True)
class Fence:
    """A writer epoch: ``txn(app_id, epoch)`` rides in every commit of the writer holding it."""

    app_id: str
    epoch: int


@dataclass(frozen=True)
class LogEntry:
    """One commit of the log, as its JSON file holds it."""

    version: int
    info: Mapping[str, Any]
    txns: Mapping[str, int]
    #: Paths of the files added / removed, as on disk (the log percent-encodes them).
    added: frozenset[str]
    removed: frozenset[str]
    #: Paths of its change data files (``cdc`` actions), as on disk.
    changes: frozenset[str] = frozenset()
    #: Whether it changes the table's metadata or protocol (``metaData``, ``protocol``).
    redefines: bool = False


def new_token() -> str:
    """A token for one logical commit (shared by all its attempts)."""
    return uuid.uuid4().hex


def writer_name() -> str:
    """``host:pid`` of this process, recorded in every commit it makes."""
    return f"{socket.gethostname()}:{os.getpid()}"


def fence_app_id(pipeline_id: str) -> str:
    """The txn app id of ``pipeline_id``'s writer epoch."""
    return FENCE_PREFIX + pipeline_id


def is_terminal(error: BaseException) -> bool:
    """Whether retrying ``error`` cannot help (the attempt did not land either way).

    delta-rs conflicts and store or network failures (5xx, throttling, timeouts, resets) are
    transient; denied access, a missing bucket, protocol and schema errors, errors about the data
    (a value that does not parse: ``'infinity'`` as a timestamp), and anything that is not a
    storage error (a bug, bad input) are terminal.
    """
    if isinstance(error, TransientError):
        return False
    if isinstance(error, (TerminalError, DeltaProtocolError, _DeltaSchemaMismatch)):
        return True
    if isinstance(error, CommitFailedError):
        return False
    if isinstance(error, (DeltaError, OSError)):
        text = str(error)
        if _data_error(text):
            return True
        return bool(ACCESS_DENIED.search(text)) or not _STORAGE_TRANSIENT.search(text)
    return True


def read_entries(
    table_uri: str,
    storage_options: Mapping[str, str],
    first: int,
    last: int,
    missing: list[int] | None = None,
) -> list[LogEntry]:
    """The log entries ``first`` to ``last`` (inclusive) that exist, oldest first.

    Read from the JSON files themselves, so they show exactly which paths each commit added.
    Versions whose JSON is gone (log cleanup after a checkpoint) are appended to ``missing``.
    """
    if last < first:
        return []
    fs, root = filesystem(table_uri, storage_options)
    entries = []
    for version in range(max(first, 0), last + 1):
        try:
            with fs.open_input_stream(join(root, "_delta_log", f"{version:020d}.json")) as stream:
                text = stream.read().decode("utf-8")
        except FileNotFoundError:
            if missing is not None:
                missing.append(version)
            continue
        info: dict[str, Any] = {}
        txns: dict[str, int] = {}
        redefines = False
        added: set[str] = set()
        removed: set[str] = set()
        changes: set[str] = set()
        for line in text.splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            if "commitInfo" in action:
                info = action["commitInfo"]
            elif "txn" in action:
                # The first of an app id's txns in one entry, as delta-rs reads it back.
                txns.setdefault(str(action["txn"]["appId"]), int(action["txn"]["version"]))
            elif "metaData" in action or "protocol" in action:
                redefines = True
            elif "add" in action:
                added.add(unquote(action["add"]["path"]))
            elif "remove" in action:
                removed.add(unquote(action["remove"]["path"]))
            elif "cdc" in action:
                changes.add(unquote(action["cdc"]["path"]))
        entries.append(
            LogEntry(version, info, txns, frozenset(added), frozenset(removed), frozenset(changes), redefines)
        )
    return entries


def _find_token(
    table_uri: str, storage_options: Mapping[str, str], token: str, after: int, table: DeltaTable
) -> tuple[LogEntry | None, bool]:
    """The log entry carrying ``token`` after version ``after``, and whether the search could
    decide: ``False`` when an entry of the window was already cleaned up (it may have been ours;
    a writer paused longer than the log retention), or the store failed while reading."""
    missing: list[int] = []
    try:
        entries = read_entries(table_uri, storage_options, after + 1, table.version(), missing)
    except (OSError, ValueError) as exc:
        logger.warning("cannot read the log of %s back: %s", table_uri, _brief(exc))
        return None, False
    for entry in entries:
        if entry.info.get(COMMIT_TOKEN_KEY) == token:
            return entry, True
    if missing:
        logger.warning(
            "the log of %s no longer holds versions %d..%d (cleaned up): whether an earlier "
            "attempt landed there cannot be read; its files are kept",
            table_uri,
            missing[0],
            missing[-1],
        )
    return None, not missing


def _load(table_uri: str, storage_options: Mapping[str, str]) -> DeltaTable | None:
    return delta_log.load(table_uri, storage_options)


def check_fence(table: DeltaTable | None, table_uri: str, fence: Fence | None) -> None:
    """Stop a writer that another process took the pipeline from (``fence`` ``None``: nothing
    to check). Every commit checks it before each attempt; a sink also checks it before it skips
    a batch that has nothing to commit (a replay, no rows), or a writer that only ever found
    its batches done by the newer one would never learn it was taken over.

    Raises:
        WriterFencedError: the table holds another writer epoch for the pipeline than
            ``fence.epoch`` (or there is no table any more).
    """
    if fence is None:
        return
    held = transaction_version(table, fence.app_id)
    if held == fence.epoch or (held is None and table is not None):
        # None in an existing table: no claim is visible (expired under the table's
        # delta.setTransactionRetentionDuration), so no newer writer either; this writer's next
        # commit records its epoch again.
        return
    claim = _claim_info(table, fence.app_id, held) if table is not None else {}
    who = claim.get(WRITER_KEY, "another process")
    when = claim.get("timestamp")
    since = (
        time.strftime(" at %Y-%m-%dT%H:%M:%SZ", time.gmtime(int(when) / 1000))
        if isinstance(when, int)
        else ""
    )
    pipeline = fence.app_id.removeprefix(FENCE_PREFIX)
    raise WriterFencedError(
        f"pipeline {pipeline!r} was taken over on {table_uri!r} by {who} (writer epoch {held}, "
        f"claimed{since}); this process holds epoch {fence.epoch} and stops so that the two never "
        "commit the same data. Nothing of this batch was committed by this process; the other one "
        "continues from the table. If that other writer is the mistake, stop it, then restart this "
        "pipeline",
        table_uri=table_uri,
        pipeline_id=pipeline,
        epoch=fence.epoch,
        held_by=who,
        held_epoch=held,
    )


def _claim_info(table: DeltaTable, app_id: str, epoch: int | None) -> Mapping[str, Any]:
    try:
        for info in table.history(CLAIM_SEARCH_DEPTH):
            if info.get(CLAIM_KEY) == app_id and info.get(EPOCH_KEY) == epoch:
                return info
    except (DeltaError, OSError):  # only for the message
        logger.debug("could not read the claim of %s", app_id, exc_info=True)
    return {}


def commit(
    table_uri: str,
    storage_options: Mapping[str, str],
    attempt: Callable[[DeltaTable | None, CommitProperties], T],
    *,
    what: str,
    metadata: Mapping[str, Any] | None = None,
    txns: Callable[[DeltaTable | None], Mapping[str, int]] | None = None,
    already_done: Callable[[DeltaTable | None], bool] | None = None,
    fence: Fence | None = None,
    policy: RetryPolicy = RetryPolicy(),
    delta_rs_retries: int = DELTA_RS_COMMIT_RETRIES,
    terminal: Callable[[BaseException], bool] = is_terminal,
    loaded: DeltaTable | None = NOT_LOADED,
) -> CommitResult[T]:
    """Commit through ``attempt`` under the commit rule (the steps in the module docstring).

    Args:
        table_uri: The table (normalised).
        storage_options: delta-rs' storage options.
        attempt: Makes ONE commit: ``attempt(table, properties)`` with the table as just loaded
            (``None``: no table yet) and the properties to pass to delta-rs (token, txns, retries).
        what: What is committed, for log lines and errors ("batch 7 of 'orders'").
        metadata: Commit info to record (the token and the writer are added).
        txns: The txns (app id -> version) to record, computed from the table as loaded for
            each attempt.
        already_done: Whether the log already holds the work (checked before each attempt, after
            this commit's own earlier attempts were looked for).
        fence: The writer epoch this process holds for the pipeline (see :func:`claim_writer`).
        policy: Retries and waits.
        delta_rs_retries: delta-rs' internal conflict retries per attempt (0 for creates and
            leases, which must fail rather than be rebased).
        terminal: Decides which errors are not retried.
        loaded: The table as the caller loaded it just now (``None``: there was none), for the
            first attempt; later attempts load it afresh. Only a load made after everything
            the caller committed itself (a schema change) may be handed over.

    Raises:
        CommitError: the last retry failed and the log does not hold the commit (a request in
            flight may still land it: keep the files it references).
        WriterFencedError: another process holds a newer writer epoch.
        StorageAccessError: the store refused the commit (credentials, permissions).
        Exception: a terminal error ``already_done`` or ``attempt`` raised, as raised (once the
            log showed that the attempt did not land).
    """
    token = new_token()
    info = {**(metadata or {}), COMMIT_TOKEN_KEY: token, WRITER_KEY: writer_name()}
    waits = policy.waits()
    attempts = 0
    first_base: int | None = None  # the version the first attempt started from (-1: no table)
    last_error: BaseException | None = None
    in_doubt = False  # an attempt's request may still be in flight
    while True:
        # Step 4.1. Load the table afresh (the first attempt: unless the caller just did).
        try:
            table = _load(table_uri, storage_options) if loaded is NOT_LOADED else loaded
            loaded = NOT_LOADED
        except DeltaflowError as exc:
            if isinstance(exc, TerminalError):
                raise
            last_error = exc
            if not _wait(waits, what, table_uri, exc, attempts):
                raise _gave_up(
                    what, table_uri, attempts, exc, first_base is not None, log_read=False
                ) from exc
            continue
        base = table.version() if table is not None else -1

        # Step 4.2. Resolve earlier attempts from the log.
        if first_base is not None and table is not None:
            entry, decided = _find_token(table_uri, storage_options, token, first_base, table)
            in_doubt = in_doubt or not decided
            if entry is not None:
                logger.warning(
                    "%s: an attempt reported an error but landed as version %d of %s (found in the log)",
                    what,
                    entry.version,
                    table_uri,
                )
                return CommitResult(
                    Outcome.COMMITTED, entry.version, attempts, token, recovered=True, info=entry.info
                )
        # Step 4.3. Fence.
        check_fence(table, table_uri, fence)

        # Step 4.4. Done check.
        if already_done is not None and already_done(table):
            return CommitResult(Outcome.ALREADY_DONE, base, attempts, token, in_doubt=in_doubt)
        if last_error is not None and terminal(last_error):
            raise _terminal(last_error, what, table_uri)

        # Step 4.5. Attempt.
        if first_base is None:
            first_base = base
        attempts += 1
        now_ms = int(time.time() * 1000)
        recorded = dict(txns(table)) if txns is not None else {}
        if fence is not None:
            recorded[fence.app_id] = fence.epoch
        props = CommitProperties(
            custom_metadata=info,
            max_commit_retries=delta_rs_retries if table is not None else 0,
            app_transactions=[Transaction(a, v, now_ms) for a, v in recorded.items()] or None,
        )
        try:
            value = attempt(table, props)
            maybe_lose_response(what)
        except Exception as exc:  # noqa: BLE001 - every error is resolved by reading the log
            # Step 4.6. Terminal: raised after step 4.2 looked at the log; transient: wait, retry.
            last_error = exc
            # Any failed attempt may have landed or may still land: on S3 a log PUT whose response
            # was lost comes back from delta-rs as a conflict (CommitFailedError) although the
            # entry is in the log (measured against moto through FaultyHttpProxy.lose_response).
            in_doubt = True
            if terminal(exc):
                continue
            if not _wait(waits, what, table_uri, exc, attempts):
                return _last_look(table_uri, storage_options, token, first_base, what, attempts, exc)
            continue
        return CommitResult(
            Outcome.COMMITTED,
            _version_after(table, table_uri, storage_options, token),
            attempts,
            token,
            value=value,
        )


def _terminal(error: BaseException, what: str, table_uri: str) -> BaseException:
    """The error to raise for a terminal failure (the log showed the attempt did not land)."""
    refused = isinstance(error, (OSError, _DeltaTableNotFound)) or (
        isinstance(error, DeltaError) and ACCESS_DENIED.search(str(error))
    )
    if refused:
        return StorageAccessError(
            f"{what}: {table_uri!r} refused the commit: {_brief(error)}; nothing was "
            "committed. Check the storage settings (credentials, permissions, bucket or container)",
            table_uri=table_uri,
        )
    return error


def _wait(waits: Iterator[float], what: str, table_uri: str, error: BaseException, attempts: int) -> bool:
    wait = next(waits, None)
    if wait is None:
        return False
    logger.warning(
        "%s: commit to %s failed (attempt %d): %s; looking at the log and retrying in %.0f ms",
        what,
        table_uri,
        attempts,
        _brief(error),
        wait * 1000,
    )
    time.sleep(wait)
    return True


def _last_look(
    table_uri: str,
    storage_options: Mapping[str, str],
    token: str,
    first_base: int,
    what: str,
    attempts: int,
    error: BaseException,
) -> CommitResult[Any]:
    """After the last failed attempt: the log decides once more (it may have landed)."""
    try:
        table = _load(table_uri, storage_options)
    except DeltaflowError as exc:
        raise _gave_up(what, table_uri, attempts, exc, True, log_read=False) from error
    if table is not None:
        entry, _ = _find_token(table_uri, storage_options, token, first_base, table)
        if entry is not None:
            logger.warning(
                "%s: the last attempt reported an error but landed as version %d", what, entry.version
            )
            return CommitResult(
                Outcome.COMMITTED, entry.version, attempts, token, recovered=True, info=entry.info
            )
    raise _gave_up(what, table_uri, attempts, error, True) from error


def _gave_up(
    what: str, table_uri: str, attempts: int, error: BaseException, tried: bool, *, log_read: bool = True
) -> CommitError:
    kept = "everything it references is kept (orphans for `vacuum --full` if it never lands)"
    if not tried:
        tail = "nothing was committed"
    elif log_read:
        tail = f"the log does not hold it, but a request still in flight may yet land it, so {kept}"
    else:
        # The log could not be read back (store down, or an entry no reader can parse): whether
        # an attempt landed is unknown, and saying "not held" would be a guess.
        tail = f"the log could not be read back, so whether it landed is unknown; {kept}"
    return CommitError(
        f"{what}: commit to {table_uri!r} failed after {attempts} attempt(s): {_brief(error)}; {tail}",
        table_uri=table_uri,
        attempts=attempts,
    )


def _version_after(
    table: DeltaTable | None, table_uri: str, storage_options: Mapping[str, str], token: str
) -> int | None:
    """The version a successful attempt made: the entry after the load when it carries the
    attempt's token (the usual case: one small read), else the table's version read back
    (delta-rs rebased the commit past others; the result may then include later commits)."""
    try:
        if table is None:
            loaded = _load(table_uri, storage_options)
            return loaded.version() if loaded is not None else None
        following = table.version() + 1
        entries = read_entries(table_uri, storage_options, following, following)
        if entries and entries[0].info.get(COMMIT_TOKEN_KEY) == token:
            return following
        table.update_incremental()  # reads only the commits since the load: ours and others
        return table.version()
    except (DeltaflowError, DeltaError, OSError, ValueError):
        logger.debug("committed to %s; could not read the new version back", table_uri, exc_info=True)
        return None


# -- the commits deltaflow makes ---------------------------------------------------------------


def _actions(files: Sequence[WrittenFile]) -> list[AddAction]:
    return [
        AddAction(f.path, f.size, dict(f.partition_values), f.modification_time, True, f.stats) for f in files
    ]


def commit_files(
    table_uri: str,
    files: Sequence[WrittenFile],
    *,
    what: str,
    schema: pa.Schema,
    partition_by: Sequence[str],
    mode: str,
    metadata: Mapping[str, Any],
    storage_options: Mapping[str, str],
    policy: RetryPolicy,
    create_if_missing: bool,
    properties: Mapping[str, str],
    txns: Callable[[DeltaTable | None], Mapping[str, int]] | None = None,
    already_done: Callable[[DeltaTable | None], bool] | None = None,
    fence: Fence | None = None,
    partition_filters: Sequence[tuple[str, str, Any]] | None = None,
    replace_schema: bool = False,
    loaded: DeltaTable | None = NOT_LOADED,
) -> CommitResult[None]:
    """Commit ``files`` in ONE transaction with the txns ``txns(table)`` returns.

    ``loaded``: the table as the caller just loaded it (:func:`commit`).

    ``mode="overwrite"`` removes every file of the table, or with ``partition_filters`` only
    those of the partitions they select; with ``replace_schema`` the commit also makes
    ``schema`` and ``partition_by`` the table's.

    A missing table is created by the commit itself (version 0 holds the files), with no
    delta-rs retries: a create that lost a race fails, and the next attempt appends to the
    winner's table.
    """
    hooks = PostCommitHookProperties(create_checkpoint=True)

    def attempt(table: DeltaTable | None, props: CommitProperties) -> None:
        if table is None:
            if not create_if_missing:
                raise TableNotFoundError(
                    f"no Delta table at {table_uri!r} and auto_create_table is off; "
                    "create the table or set auto_create_table=true",
                    table_uri=table_uri,
                )
            try:
                create_table_with_add_actions(
                    table_uri,
                    delta_schema(schema),
                    _actions(files),
                    mode="error",
                    partition_by=list(partition_by) or None,
                    configuration=dict(properties) or None,
                    storage_options=dict(storage_options) or None,
                    commit_properties=props,
                    post_commithook_properties=hooks,
                )
            except DeltaError as exc:
                # Another writer created the table after our load: retry, appending to it.
                # delta-rs says so only in text ("A Delta Lake table already exists").
                if "already exists" in str(exc):
                    raise CommitError(
                        f"{table_uri!r} was created by another writer meanwhile: {_brief(exc)}",
                        table_uri=table_uri,
                    ) from exc
                raise
            return
        actions: list[AddAction | RemoveAction] = [*_actions(files)]
        table.create_write_transaction(
            actions,
            mode=mode,
            schema=delta_schema(schema) if replace_schema else table.schema(),
            partition_by=list(partition_by) or None,
            partition_filters=list(partition_filters) if partition_filters else None,
            commit_properties=props,
            post_commithook_properties=hooks,
        )

    result = commit(
        table_uri,
        storage_options,
        attempt,
        what=what,
        metadata=metadata,
        txns=txns,
        already_done=already_done,
        fence=fence,
        policy=policy,
        loaded=loaded,
    )
    if result.recovered and files:
        _check_paths(result, files, table_uri, storage_options, what)
    return result


def _check_paths(
    result: CommitResult[Any],
    files: Sequence[WrittenFile],
    table_uri: str,
    storage_options: Mapping[str, str],
    what: str,
) -> None:
    """The landed entry must add exactly these paths (it carries our token: anything else is a bug)."""
    assert result.version is not None
    (entry,) = read_entries(table_uri, storage_options, result.version, result.version)
    missing = {f.path for f in files} - entry.added
    if missing:
        raise CommitError(
            f"{what}: version {result.version} of {table_uri!r} carries this commit's token but not "
            f"{len(missing)} of its files, e.g. {sorted(missing)[0]!r}; refusing to continue",
            table_uri=table_uri,
        )


def create_table(
    table_uri: str,
    schema: pa.Schema,
    *,
    partition_by: Sequence[str],
    properties: Mapping[str, str],
    storage_options: Mapping[str, str],
    policy: RetryPolicy = RetryPolicy(),
) -> DeltaTable:
    """Create an empty table once, from the driver; adopt the table when another one won.

    Creation is not safe to race: delta-rs rebases a create that lost the race for version 0 onto
    a later version, a second CREATE that replaces the table's metadata (measured). So the create
    commits with NO delta-rs retries: of racing writers exactly one creates version 0; the others
    fail, find a table that is not theirs, and adopt it.
    """
    table, _ = create_claimed_table(
        table_uri,
        schema,
        partition_by=partition_by,
        properties=properties,
        storage_options=storage_options,
        policy=policy,
    )
    return table


def create_claimed_table(
    table_uri: str,
    schema: pa.Schema,
    *,
    partition_by: Sequence[str],
    properties: Mapping[str, str],
    storage_options: Mapping[str, str],
    claim: str | None = None,
    policy: RetryPolicy = RetryPolicy(),
) -> tuple[DeltaTable, Fence | None]:
    """:func:`create_table`; with ``claim`` (a pipeline id) the creating commit also claims the
    table for that pipeline as :func:`claim_writer` does, at epoch 1 (no table, so no claim
    before it): one commit instead of two for each table an ingest of many topics makes.

    Returns:
        The table, and the pipeline's fence when this call created it (``None`` when another
        writer did and it was adopted: that table is claimed with :func:`claim_writer`).
    """
    app = fence_app_id(claim) if claim is not None else None

    def attempt(table: DeltaTable | None, props: CommitProperties) -> DeltaTable:
        return DeltaTable.create(
            table_uri,
            schema,
            mode="error",
            partition_by=list(partition_by) or None,
            configuration=dict(properties) or None,
            storage_options=dict(storage_options) or None,
            commit_properties=props,
        )

    metadata: dict[str, Any] = {"deltaflow.operation": "create"}
    if app is not None:
        metadata.update({CLAIM_KEY: app, EPOCH_KEY: 1})
    result = commit(
        table_uri,
        storage_options,
        attempt,
        what=f"creating {table_uri}",
        metadata=metadata,
        txns=(lambda _table: {app: 1}) if app is not None else None,
        already_done=lambda table: table is not None,
        policy=policy,
        delta_rs_retries=0,
    )
    if result.committed:
        logger.info("created Delta table %s (partitioned by %s)", table_uri, list(partition_by))
    else:
        logger.info("table %s exists (created concurrently?); adopting it", table_uri)
    # The table DeltaTable.create returned is the one just made (no load); else load it.
    table = result.value if result.committed else None
    if table is None:
        table = _load(table_uri, storage_options)
    if table is None:  # pragma: no cover - the log said it exists
        raise CommitError(f"table {table_uri!r} vanished right after its creation", table_uri=table_uri)
    if app is None or claim is None or not result.committed:
        return table, None
    warn_on_txn_retention(table, table_uri, claim)
    return table, _claimed(claim, table_uri, Fence(app, 1))


def add_columns(
    table_uri: str,
    storage_options: Mapping[str, str],
    fields: Sequence[pa.Field],
    *,
    policy: RetryPolicy = RetryPolicy(),
) -> None:
    """Add nullable columns to the table (a commit of its own); done when they exist."""
    nullable = [f.with_nullable(True) for f in fields]
    names = {f.name.lower() for f in nullable}

    def present(table: DeltaTable | None) -> bool:
        have = {f.name.lower() for f in table.schema().fields} if table is not None else set()
        return names <= have

    def attempt(table: DeltaTable | None, props: CommitProperties) -> None:
        if table is None:
            raise TableNotFoundError(
                f"no Delta table at {table_uri!r} to add columns to", table_uri=table_uri
            )
        have = {f.name.lower() for f in table.schema().fields}
        todo = [f for f in nullable if f.name.lower() not in have]
        table.alter.add_columns(list(delta_schema(pa.schema(todo)).fields), commit_properties=props)

    result = commit(
        table_uri,
        storage_options,
        attempt,
        what=f"adding column(s) {sorted(names)}",
        metadata={"deltaflow.operation": "add columns"},
        already_done=present,
        policy=policy,
    )
    if result.committed:
        logger.info("added column(s) %s to %s", [f.name for f in fields], table_uri)


def claim_writer(
    table_uri: str,
    storage_options: Mapping[str, str],
    pipeline_id: str,
    *,
    policy: RetryPolicy = RetryPolicy(),
) -> Fence:
    """Become the only process that commits ``pipeline_id``'s batches to the table.

    Commits ``txn(deltaflow-writer:<pipeline_id>, previous epoch + 1)``. Every later commit of
    this writer carries that txn too (:class:`Fence`): a process that claimed earlier finds a
    newer epoch before its next commit and stops; one racing with the claim conflicts on the
    txn in delta-rs, looks again and stops. Two claims racing each other conflict the same way,
    and the loser claims the next epoch.
    """
    app = fence_app_id(pipeline_id)
    claimed: dict[str, int] = {}

    def next_epoch(table: DeltaTable | None) -> Mapping[str, int]:
        if not claimed:  # the first attempt: said once per claim
            warn_on_txn_retention(table, table_uri, pipeline_id)
        claimed[app] = (transaction_version(table, app) or 0) + 1
        return dict(claimed)

    def attempt(table: DeltaTable | None, props: CommitProperties) -> None:
        if table is None:
            raise TableNotFoundError(f"no Delta table at {table_uri!r} to claim", table_uri=table_uri)
        # The epoch goes into the commit info too, so that a fenced writer can name this one.
        props = CommitProperties(
            custom_metadata={**(props.custom_metadata or {}), EPOCH_KEY: claimed[app]},
            max_commit_retries=props.max_commit_retries,
            app_transactions=props.app_transactions,
        )
        table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=props)

    result = commit(
        table_uri,
        storage_options,
        attempt,
        what=f"claiming pipeline {pipeline_id!r}",
        metadata={
            CLAIM_KEY: app,
            "deltaflow.operation": "claim writer",
        },
        txns=next_epoch,
        policy=policy,
    )
    epoch = int(result.info.get(EPOCH_KEY, claimed[app])) if result.recovered else claimed[app]
    return _claimed(pipeline_id, table_uri, Fence(app, epoch))


def _claimed(pipeline_id: str, table_uri: str, fence: Fence) -> Fence:
    """Say which writer epoch this process holds for the pipeline on the table; ``fence``."""
    logger.info(
        "pipeline %r writes %s as epoch %d (%s)",
        pipeline_id,
        table_uri,
        fence.epoch,
        writer_name(),
        extra={"pipeline": pipeline_id, "table": table_uri},
    )
    return fence
