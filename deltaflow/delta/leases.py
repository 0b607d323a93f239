"""Leases that keep two compactions of one table apart, on any storage delta-rs writes to.

delta-rs 1.6 lets two concurrent OPTIMIZE commits remove the same files (its conflict checker
accepts concurrent removes with ``dataChange=false``): both commit, both rewritten copies stay,
and every row of those files is in the table twice (measured, see ``tests/integration/test_storage.py``).
So every compaction deltaflow runs (auto-compaction, ``deltaflow optimize``) first takes the
table's compaction lease.

The lease is a small Delta table of its own, ``<table>/_deltaflow/locks/<name>`` (readers and
vacuum ignore ``_``-prefixed folders): taking it is committing its next version with the
owner and an expiry in the commit metadata, with NO commit retries. Commits are put-if-absent
(a rename on local disks, a conditional PUT on S3), so of two processes that saw the lease
free, exactly one commits that version and the other fails. Releasing commits an empty owner.
A holder that died leaves the lease until it expires (``ttl_s``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltaflow.config.locations import normalize_uri
from deltaflow.delta.layout import lock_dir
from deltaflow.errors import LeaseHeldError

if TYPE_CHECKING:
    from deltalake import DeltaTable

__all__ = ["LeaseState", "TableLease", "compaction_lease", "lease_state"]

logger = logging.getLogger(__name__)

#: How long a lease lasts without release (a compaction that runs longer renews nothing: keep
#: it above the longest compaction).
DEFAULT_TTL_S = 1800.0
#: Retries of a release (a conflict there means someone took over an expired lease: fine).
RELEASE_RETRIES = 3
_OWNER = "deltaflow.lease_owner"
_EXPIRES = "deltaflow.lease_expires_ms"
_SCHEMA = pa.schema([("unused", pa.string())])


@dataclass(frozen=True)
class LeaseState:
    owner: str
    expires_ms: int

    def free_at(self, now_ms: int) -> bool:
        return not self.owner or self.expires_ms <= now_ms


class TableLease:
    """The ``name`` lease of the table at ``table_uri``."""

    def __init__(
        self,
        table_uri: str,
        storage_options: Mapping[str, str],
        name: str = "compaction",
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        self.table_uri = normalize_uri(table_uri)
        self.uri = lock_dir(self.table_uri, name)
        self._storage_options = dict(storage_options)
        self._ttl_ms = int(ttl_s * 1000)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}:{uuid.uuid4().hex[:8]}"
        self.held = False

    def _table(self) -> DeltaTable:
        from deltaflow.delta import commit
        from deltaflow.delta import log as delta_log

        table = delta_log.load(self.uri, self._storage_options)
        if table is None:
            table = commit.create_table(
                self.uri,
                _SCHEMA,
                partition_by=(),
                properties={"delta.logRetentionDuration": "interval 1 days"},
                storage_options=self._storage_options,
            )
        return table

    def state(self) -> LeaseState:
        """Who holds the lease now (empty owner: nobody)."""
        return lease_state(self._table())

    def _commit(
        self, owner: str, expires_ms: int, *, refused: Callable[[LeaseState], bool], retries: int
    ) -> bool:
        """Record ``owner`` as the holder unless ``refused(state)``; whether this commit is in the
        log (a commit whose response was lost counts: the log decides)."""
        from deltaflow.delta import commit
        from deltaflow.errors import CommitError

        def attempt(table: DeltaTable | None, props: Any) -> None:
            assert table is not None  # _table() created it
            table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=props)

        self._table()
        try:
            result = commit.commit(
                self.uri,
                self._storage_options,
                attempt,
                what=f"lease {self.uri} for {owner or 'nobody'}",
                metadata={_OWNER: owner, _EXPIRES: expires_ms},
                already_done=lambda table: table is None or refused(lease_state(table)),
                policy=commit.RetryPolicy(max_retries=retries),
                # Of two takers that saw the lease free, the second must fail, not be rebased.
                delta_rs_retries=0,
            )
        except CommitError:
            return False  # another taker committed that version first (the log says: not ours)
        return result.committed

    def try_acquire(self) -> bool:
        """Take the lease if it is free (or expired); ``False`` if another holds it or won."""
        now = int(time.time() * 1000)
        taken = self._commit(
            self.owner,
            now + self._ttl_ms,
            refused=lambda state: not state.free_at(now) and state.owner != self.owner,
            retries=0,
        )
        self.held = self.held or taken
        return taken

    def acquire(self, timeout_s: float, poll_s: float = 1.0) -> None:
        """Wait up to ``timeout_s`` for the lease.

        Raises:
            LeaseHeldError: it stayed held; the message names the holder and its expiry.
        """
        deadline = time.monotonic() + timeout_s
        while not self.try_acquire():
            if time.monotonic() >= deadline:
                state = self.state()
                until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(state.expires_ms / 1000))
                raise LeaseHeldError(
                    f"another compaction of {self.table_uri} holds its lease ({state.owner}, until "
                    f"{until}); try again when it is done",
                    table_uri=self.table_uri,
                    owner=state.owner,
                )
            time.sleep(poll_s)

    def release(self) -> None:
        """Give the lease back (unless it expired and another took it meanwhile)."""
        if not self.held:
            return
        self.held = False
        try:
            self._commit("", 0, refused=lambda state: state.owner != self.owner, retries=RELEASE_RETRIES)
        except Exception:
            logger.warning("could not release the %s lease; it expires on its own", self.uri, exc_info=True)


def lease_state(table: DeltaTable) -> LeaseState:
    """The lease as the lock table's last commit records it."""
    last = table.history(1)[0]
    return LeaseState(str(last.get(_OWNER) or ""), int(last.get(_EXPIRES) or 0))


@contextmanager
def compaction_lease(
    table_uri: str, storage_options: Mapping[str, str], *, wait_s: float | None = None
) -> Iterator[bool]:
    """Hold the table's compaction lease for the block; yields whether it was taken.

    ``wait_s=None``: one attempt (auto-compaction skips a round); else wait that long and raise
    :class:`LeaseHeldError` if it stays taken.
    """
    lease = TableLease(table_uri, storage_options)
    if wait_s is None:
        taken = lease.try_acquire()
    else:
        lease.acquire(wait_s)
        taken = True
    try:
        yield taken
    finally:
        lease.release()
