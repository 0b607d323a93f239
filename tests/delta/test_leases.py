"""The compaction lease: one holder at a time, also on first use, and compactions that never
rewrite the same files twice (delta-rs alone lets two concurrent OPTIMIZEs both commit)."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltaflow import ops
from deltaflow.delta.leases import TableLease
from deltaflow.errors import LeaseHeldError


def _race(count: int, work) -> list:  # type: ignore[no-untyped-def]
    results: list = []
    start = threading.Barrier(count)

    def run() -> None:
        start.wait()
        try:
            results.append(work())
        except Exception as exc:  # noqa: BLE001 - collected for the assertions
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


@pytest.mark.parametrize("trial", range(8))
def test_exactly_one_of_racing_takers_holds_a_fresh_lease(tmp_path, trial):
    leases = [TableLease(str(tmp_path / "t"), {}) for _ in range(4)]
    it = iter(leases)
    won = _race(4, lambda: next(it).try_acquire())
    assert sorted(won) == [False, False, False, True]
    holder = next(lease for lease in leases if lease.held)
    assert holder.state().owner == holder.owner
    holder.release()
    assert leases[0].state().owner == ""
    assert leases[0].try_acquire()  # free again


def test_an_expired_lease_can_be_taken_over_and_a_held_one_is_reported(tmp_path):
    # A TTL of seconds, not fractions: the first holder's expiry counts from before it creates
    # the lease's table, and a loaded machine can take most of a second for that.
    first = TableLease(str(tmp_path / "t"), {}, ttl_s=5)
    assert first.try_acquire()
    second = TableLease(str(tmp_path / "t"), {})
    with pytest.raises(LeaseHeldError, match=r"another compaction of .* holds its lease"):
        second.acquire(timeout_s=0.2, poll_s=0.05)
    deadline = time.monotonic() + 60
    while not second.try_acquire():  # until the first holder's lease expires
        assert time.monotonic() < deadline, "an expired lease was never taken over"
        time.sleep(0.2)
    first.release()  # too late: not the holder any more, nothing happens
    assert second.state().owner == second.owner


def test_concurrent_optimize_calls_never_duplicate_rows(tmp_path):
    uri = str(tmp_path / "t")
    for i in range(20):
        write_deltalake(uri, pa.table({"id": list(range(i * 50, i * 50 + 50))}), mode="append")
    results = _race(3, lambda: ops.optimize(uri, lock_timeout_s=60))
    assert all(isinstance(r, ops.OptimizeResult) for r in results), results
    assert sorted(r.files_removed for r in results) == [0, 0, 20]  # one did the work
    table = DeltaTable(uri)
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(1000))
    assert len(table.file_uris()) == 1
