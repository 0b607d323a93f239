"""The exception hierarchy of deltaflow.

Every error deltaflow raises derives from :class:`DeltaflowError`. Two mixins decide what a
long-running process does with an error:

* :class:`TerminalError`: retrying cannot help (bad configuration, a schema that does not
  match the table). The pipeline stops and the message says what to change.
* :class:`TransientError`: the same call may succeed later (a commit conflict that outlived its
  retries, a storage hiccup). A daemon may restart the pipeline with backoff.

Exceptions keep their context (``pipeline_id``, ``batch_id``, ``table_uri``) as attributes and
stay picklable, because Spark ships them from Python workers back to the driver.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "AddFilesError",
    "BatchInterruptedError",
    "CdcDecodeError",
    "CdcPositionError",
    "CheckpointMismatchError",
    "CommitError",
    "ConfigError",
    "DataFilesGoneError",
    "DeltaSourceError",
    "DeltaflowError",
    "EngineUnavailableError",
    "ExpectationFailedError",
    "FileSchemaMismatchError",
    "JobGaveUpError",
    "KafkaAccessError",
    "KafkaDataLossError",
    "KafkaUnavailableError",
    "LeaseHeldError",
    "MergeError",
    "PipelineConfigError",
    "PostgresAccessError",
    "PostgresSetupError",
    "PostgresUnavailableError",
    "QueryFailedError",
    "SchemaEvolvedError",
    "SchemaMismatchError",
    "SourceFilesGoneError",
    "StorageAccessError",
    "StorageUnavailableError",
    "TableNotFoundError",
    "TerminalError",
    "TransientError",
    "UnknownOptionError",
    "WriteValidationError",
    "WriterFencedError",
    "WrittenFilesLostError",
    "storage_error",
]

#: Storage errors that say "not allowed / not there": retrying cannot fix them.
ACCESS_DENIED = re.compile(
    r"\b403\b|Forbidden|AccessDenied|InvalidAccessKeyId|SignatureDoesNotMatch|NoSuchBucket"
    r"|AuthorizationFailure|AuthenticationFailed|InvalidAuthenticationInfo|ContainerNotFound"
    r"|Permission denied|PermissionDenied|ExpiredToken|InvalidToken",
    re.IGNORECASE,
)
#: Characters of an underlying error quoted in deltaflow's messages.
ERROR_CHARS = 400


class DeltaflowError(Exception):
    """Root of every error raised by deltaflow."""

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context
        for key, value in context.items():
            setattr(self, key, value)

    def __reduce__(self) -> tuple[Any, ...]:
        # Keep the context through pickling (Spark moves errors between processes).
        return (_rebuild, (type(self), self.message, self.context))

    def __str__(self) -> str:
        return self.message


def _rebuild(cls: type[DeltaflowError], message: str, context: dict[str, Any]) -> DeltaflowError:
    err = cls.__new__(cls)
    DeltaflowError.__init__(err, message, **context)
    return err


class TerminalError(DeltaflowError):
    """Retrying cannot help: the input or the configuration must change."""


class TransientError(DeltaflowError):
    """The operation may succeed if retried later."""


class ConfigError(TerminalError, ValueError):
    """An option has a value that is not allowed."""


class UnknownOptionError(ConfigError):
    """An option name deltaflow does not know (usually a typo)."""

    def __init__(self, names: Iterable[str], known: Iterable[str]) -> None:
        names = sorted(names)
        known = sorted(known)
        hints = []
        for name in names:
            close = _closest(name, known)
            hints.append(f"{name!r}" + (f" (did you mean {close!r}?)" if close else ""))
        super().__init__(
            f"unknown sink option(s): {', '.join(hints)}; known options are: {', '.join(known)}",
            unknown=names,
            known=known,
        )


class SchemaMismatchError(TerminalError):
    """A DataFrame's schema does not fit the target table under the chosen ``schema_mode``."""

    def __init__(self, table_uri: str, differences: Sequence[str], *, hint: str = "") -> None:
        lines = "\n".join(f"  - {d}" for d in differences)
        message = f"schema of the data does not match the Delta table {table_uri!r}:\n{lines}"
        if hint:
            message += f"\n{hint}"
        super().__init__(message, table_uri=table_uri, differences=list(differences))


class FileSchemaMismatchError(SchemaMismatchError):
    """A Parquet file to register (``deltaflow add-files``, ``convert``) does not fit the table's
    schema; nothing was committed. ``file`` names it."""

    def __init__(self, table_uri: str, file: str, differences: Sequence[str]) -> None:
        lines = "\n".join(f"  - {d}" for d in differences)
        message = (
            f"Parquet file {file!r} does not match the schema of {table_uri!r}:\n{lines}\n"
            "nothing was committed; leave the file out, or rewrite it with the table's schema"
        )
        DeltaflowError.__init__(self, message, table_uri=table_uri, file=file, differences=list(differences))


class AddFilesError(TerminalError):
    """Parquet files cannot be registered as asked (``deltaflow add-files``, ``convert``): files
    outside the table without ``--copy``, partition directories that do not match the table's
    columns, a file that is not Parquet, a folder that already is a table. Nothing was
    committed; the message names the file and what to change."""


class TableNotFoundError(TerminalError):
    """The table does not exist and ``auto_create_table`` is off."""


class WriteValidationError(TerminalError):
    """Files written by the executors are not what their commit messages claim."""


class WrittenFilesLostError(TransientError):
    """Files a batch wrote vanished before their commit (deleted by another process, e.g.
    ``vacuum --full`` with a retention shorter than a batch takes): the rows the write tasks
    reported are not all in the files found. Nothing of the batch was committed and its files
    that remain are deleted; the batch is written again (Spark never recorded it as done)."""


class DataFilesGoneError(TerminalError):
    """Data files a version of the table references are gone from storage (vacuumed, or deleted
    by hand): that version cannot be read or restored. Retrying cannot bring them back; the
    message names one file, and says what can be read (or restored) instead."""

    def __init__(
        self, table_uri: str, doing: str, missing: Sequence[str], total: int, *, of: str, instead: str
    ) -> None:
        message = (
            f"cannot {doing}: {len(missing)} of {total} data files of {of} are gone (vacuumed?), "
            f"e.g. {missing[0]!r}. {instead}, or recover the files first"
        )
        super().__init__(message, table_uri=table_uri, missing=len(missing), files=total)


class SourceFilesGoneError(TerminalError):
    """Files a micro-batch of a files source took were deleted before the batch read them. The
    batch is replayed with the same files, so retrying fails the same way: the message names
    them and the two ways on (put them back, or ``ignoreMissingFiles``)."""


class CheckpointMismatchError(TerminalError):
    """The stream's checkpoint does not match the progress its pipeline recorded in the table."""


class BatchInterruptedError(TransientError):
    """A micro-batch's call into Spark was interrupted: its query is being stopped. Nothing of
    the batch is lost: its commit landed whole, or the batch runs again at the next start."""


class CommitError(TransientError):
    """A Delta commit failed after all retries; nothing of the batch was committed."""


class StorageUnavailableError(TransientError):
    """The table's storage did not answer or failed (5xx, throttling, timeouts, resets); the
    same request may work later."""


class StorageAccessError(TerminalError):
    """The table's storage refused the request (credentials, permissions, a missing bucket or
    container): retrying cannot fix it."""


class WriterFencedError(TerminalError):
    """Another process took the pipeline over (a newer writer epoch in the table); this one stops
    so that the two never commit the same data. The message names the other writer."""


class SchemaEvolvedError(TransientError):
    """Columns were added to the table for new message fields; the query must restart (nothing
    of the batch was committed) so that its source decodes them. The daemon does that."""


class DeltaSourceError(TerminalError):
    """A Delta table read as a stream changed in a way the stream cannot follow with its
    options (rows deleted or rewritten, log entries expired, deletion vectors)."""


class MergeError(TerminalError):
    """A CDC batch cannot be merged as it is (changes without a sequence, a type the target
    cannot take); nothing of the batch was committed."""


class ExpectationFailedError(TerminalError):
    """Rows of a micro-batch violated an expectation with ``action: fail``; nothing of that
    batch was committed and the pipeline stopped."""


class QueryFailedError(TerminalError):
    """A streaming query failed with an error deltaflow does not know to be transient."""


class JobGaveUpError(TransientError):
    """A job (a run that ends on its own: ``--available-now``, ``--ends_at_latest_offsets``)
    made no progress through its restarts for its bounded wait (``--give_up_after``). Transient:
    the same job may succeed later, run again by its scheduler."""


class KafkaUnavailableError(TransientError):
    """The Kafka cluster did not answer as asked (down, restarting, unreachable, no leader, a
    timeout); the same request may succeed later."""


class KafkaAccessError(TerminalError):
    """Kafka refused the client (authentication, authorization, an invalid or unsupported
    setting); retrying cannot help until the Kafka settings change."""


class KafkaDataLossError(TerminalError):
    """Offsets the pipeline holds as its progress are not on the broker (beyond its latest
    offset: the topic was re-created; below its earliest: retention removed them). Continuing
    would skip messages without a trace; nothing was written (Spark's ``failOnDataLoss``)."""


class PostgresUnavailableError(TransientError):
    """PostgreSQL did not answer (down, restarting, unreachable, a slot still held by a session
    that is going away); the same request may succeed later."""


class PostgresAccessError(TerminalError):
    """PostgreSQL refused the connection (authentication, an unknown role or database, TLS);
    retrying cannot help until the connection settings change."""


class PostgresSetupError(TerminalError):
    """The server cannot serve change data capture as configured (``wal_level``, a missing
    publication, a role without REPLICATION, a slot of another plugin); the message says what
    to change there."""


class CdcPositionError(TerminalError):
    """The Delta table and the replication slot disagree about where the changes stand (the
    slot is gone or has moved past the table): continuing would lose changes."""


class CdcDecodeError(TerminalError):
    """A change PostgreSQL sent could not be decoded; the message names its LSN (retrying reads
    the same bytes again)."""


class EngineUnavailableError(TransientError):
    """No Spark Connect server answers at the ``--remote`` URL (not started, stopped, or
    restarting); a later run may find it."""


class EngineMismatchError(TerminalError):
    """The Spark Connect server cannot run deltaflow's parts: its Python workers lack deltaflow,
    or have another version than the client's."""


class PipelineConfigError(ConfigError):
    """A pipeline file that cannot run: every problem with its YAML path."""

    def __init__(self, path: str, problems: list[str]) -> None:
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{path}: {len(problems)} problem(s):\n{lines}", file=path, problems=problems)


class LeaseHeldError(TransientError):
    """Another process (or thread) holds a table lease (e.g. compaction's); retry later."""


#: Where a Rust backtrace starts in a delta-rs error ("\n   0: <unknown>\n   1: ..."): cut off.
_BACKTRACE = re.compile(r"\n\s*(?:Stack backtrace:|0: )")


def brief(error: BaseException) -> str:
    """The error's text on one line, bounded (delta-rs and pyarrow errors span lines)."""
    text = " ".join(_BACKTRACE.split(str(error), maxsplit=1)[0].split()) or type(error).__name__
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


def storage_error(error: BaseException, table_uri: str, doing: str) -> DeltaflowError:
    """The deltaflow error for a storage failure while ``doing`` something to ``table_uri``:
    :class:`StorageAccessError` when access was refused, else :class:`StorageUnavailableError`."""
    if ACCESS_DENIED.search(str(error)):
        return StorageAccessError(
            f"{doing} {table_uri!r} failed: {brief(error)}; check the storage settings "
            "(credentials, permissions, bucket or container name)",
            table_uri=table_uri,
        )
    return StorageUnavailableError(
        f"{doing} {table_uri!r} failed: {brief(error)}; the storage may be down or unreachable, "
        "retrying later may work",
        table_uri=table_uri,
    )


def _closest(name: str, known: Sequence[str]) -> str | None:
    import difflib

    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return match[0] if match else None
