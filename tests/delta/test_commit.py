"""The commit rule (deltaflow.delta.commit) on local tables: every outcome decided from the log.

A "lost response" here is an attempt that commits through delta-rs and then raises, as a
timeout or a reset after the store took the request does; ``tests/integration/test_faults.py`` does the
same through a real S3 server behind a proxy that forwards the request and loses the answer.
"""

import time

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from deltaflow.delta import commit, progress
from deltaflow.delta import log as delta_log
from deltaflow.errors import CommitError, StorageAccessError, WriterFencedError
from deltaflow.io.parquet import PartitionedFileWriter

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


def _files(root, ids, prefix):
    writer = PartitionedFileWriter(
        fs=pafs.LocalFileSystem(),
        root=str(root),
        schema=SCHEMA,
        partition_columns=[],
        compression="snappy",
        target_file_size=1 << 30,
        max_records_per_file=0,
        file_prefix=prefix,
    )
    batch = pa.RecordBatch.from_pydict({"id": ids, "name": [f"n{i}" for i in ids]}, schema=SCHEMA)
    return writer.write_batches([batch])


def _replayed(app, version):
    def done(table):
        held = progress.transaction_version(table, app)
        return held is not None and held >= version

    return done


def _commit(uri, files, version, *, app="pipe", retries=3, fence=None):
    return commit.commit_files(
        uri,
        files,
        what=f"batch {version}",
        schema=SCHEMA,
        partition_by=[],
        mode="append",
        metadata={"deltaflow.epoch": version},
        storage_options={},
        policy=commit.RetryPolicy(max_retries=retries),
        create_if_missing=True,
        properties={},
        txns=lambda _table: {app: version},
        already_done=_replayed(app, version),
        fence=fence,
    )


def _ids(uri):
    return sorted(DeltaTable(uri).to_pyarrow_table()["id"].to_pylist())


def test_commit_records_txn_and_skips_a_replayed_version(tmp_path):
    uri = str(tmp_path / "t")
    first = _commit(uri, _files(tmp_path / "t", [1, 2], "a"), 0)
    assert first.committed and first.version == 0 and not first.recovered
    assert _commit(uri, _files(tmp_path / "t", [3], "b"), 1).committed
    replay = _commit(uri, _files(tmp_path / "t", [3], "c"), 1)
    assert replay.outcome is commit.Outcome.ALREADY_DONE and replay.attempts == 0
    table = DeltaTable(uri)
    assert table.version() == 1
    assert table.transaction_version("pipe") == 1
    assert _ids(uri) == [1, 2, 3]
    assert table.history(1)[0]["deltaflow.epoch"] == 1
    assert table.history(1)[0][commit.COMMIT_TOKEN_KEY] == _commit_token(uri, 1)


def _commit_token(uri, version):
    (entry,) = commit.read_entries(uri, {}, version, version)
    return entry.info[commit.COMMIT_TOKEN_KEY]


def test_a_failure_retries_with_backoff_then_raises_and_says_the_files_stay(tmp_path):
    uri = str(tmp_path / "t")
    commit.create_table(uri, SCHEMA, partition_by=(), properties={}, storage_options={})
    calls = []

    def attempt(table, props):
        calls.append(1)
        raise OSError("error sending request: connection refused")  # never lands

    started = time.monotonic()
    with pytest.raises(CommitError) as err:
        commit.commit(uri, {}, attempt, what="batch 0", policy=commit.RetryPolicy(max_retries=2))
    elapsed = time.monotonic() - started
    assert err.value.attempts == 3 == len(calls)
    assert err.value.table_uri == uri
    assert "the log does not hold it, but a request still in flight may yet land it" in str(err.value)
    assert elapsed >= 0.1 + 0.2  # backoff 100 ms then 200 ms


def test_a_location_that_cannot_hold_a_table_is_terminal(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the table's parent folder should be")
    with pytest.raises(StorageAccessError, match="Not a directory"):
        _commit(str(blocker / "t"), [], 0, retries=2)


def _landing_then_failing(error):
    """An attempt whose commit lands and whose answer is then lost (``error`` instead)."""
    calls = []

    def attempt(table, props):
        calls.append(table.version() if table is not None else None)
        table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=props)
        if len(calls) == 1:
            raise error

    return attempt, calls


@pytest.mark.parametrize(
    "error",
    [OSError("Generic S3 error: connection reset by peer"), ValueError("a terminal-looking error")],
    ids=["transient", "terminal"],
)
def test_an_attempt_that_raised_but_landed_is_found_in_the_log_and_not_repeated(tmp_path, error):
    uri = str(tmp_path / "t")
    commit.create_table(uri, SCHEMA, partition_by=(), properties={}, storage_options={})
    attempt, calls = _landing_then_failing(error)
    result = commit.commit(uri, {}, attempt, what="test", txns=lambda _t: {"app": 7})
    assert result.committed and result.recovered and result.version == 1
    assert calls == [0]  # never attempted twice
    table = DeltaTable(uri)
    assert table.version() == 1 and table.transaction_version("app") == 7
    assert result.info[commit.COMMIT_TOKEN_KEY] == result.token


def test_files_of_a_commit_whose_answer_was_lost_are_in_the_table(tmp_path):
    uri = str(tmp_path / "t")
    _commit(uri, _files(tmp_path / "t", [1], "a"), 0)
    files = _files(tmp_path / "t", [2, 3], "b")
    lost = {"done": False}

    def attempt(table, props):
        table.create_write_transaction(
            commit._actions(files), mode="append", schema=table.schema(), commit_properties=props
        )
        if not lost["done"]:
            lost["done"] = True
            raise OSError("error sending request: operation timed out")

    result = commit.commit(
        uri, {}, attempt, what="batch 1", txns=lambda _t: {"pipe": 1}, already_done=_replayed("pipe", 1)
    )
    # Resolved as OURS although the txn is in the log: the writer must keep (not delete) the files.
    assert result.committed and result.recovered
    (entry,) = commit.read_entries(uri, {}, result.version, result.version)
    assert {f.path for f in files} <= entry.added
    assert _ids(uri) == [1, 2, 3]


def test_another_writer_committing_the_batch_between_attempts_is_already_done(tmp_path):
    uri = str(tmp_path / "t")
    _commit(uri, _files(tmp_path / "t", [1], "a"), 0)
    ours = _files(tmp_path / "t", [2], "ours")
    theirs = _files(tmp_path / "t", [2], "theirs")

    def attempt(table, props):
        # Before our first attempt reaches the store, another writer commits batch 1.
        _commit(uri, theirs, 1)
        raise OSError("Generic S3 error: 503 Service Unavailable")

    result = commit.commit(
        uri, {}, attempt, what="batch 1", txns=lambda _t: {"pipe": 1}, already_done=_replayed("pipe", 1)
    )
    assert result.outcome is commit.Outcome.ALREADY_DONE and result.attempts == 1
    referenced = set().union(*(e.added for e in commit.read_entries(uri, {}, 0, DeltaTable(uri).version())))
    assert not {f.path for f in ours} & referenced
    # ... but a 503 may be a lost answer of a request still in flight: the files must stay.
    assert result.in_doubt and not result.may_delete_files
    assert _ids(uri) == [1, 2]


def test_files_may_go_only_when_no_attempt_was_made(tmp_path):
    from deltalake.exceptions import CommitFailedError

    uri = str(tmp_path / "t")
    _commit(uri, _files(tmp_path / "t", [1], "a"), 0)
    # A replay seen before any attempt: nothing of this commit was ever sent.
    replay = commit.commit(uri, {}, lambda t, p: None, what="b0", already_done=_replayed("pipe", 0))
    assert replay.attempts == 0 and replay.may_delete_files

    def conflict(table, props):
        _commit(uri, _files(tmp_path / "t", [2], "theirs"), 1)
        raise CommitFailedError("Failed to commit transaction: Concurrent transaction failed.")

    # Even a conflict keeps the files: on S3 delta-rs reports a log PUT whose response was lost
    # as this very conflict although the entry landed (measured through the fault proxy and moto).
    lost = commit.commit(uri, {}, conflict, what="b1", already_done=_replayed("pipe", 1))
    assert lost.outcome is commit.Outcome.ALREADY_DONE and lost.in_doubt and not lost.may_delete_files


def test_a_landed_attempt_whose_log_entry_was_cleaned_up_keeps_its_files(tmp_path):
    """A writer paused past the log retention: its lost commit landed, later commits followed,
    and log cleanup removed its JSON. The log can no longer show the attempt was ours, so the
    files stay although the work looks done by someone else."""
    from deltalake.exceptions import CommitFailedError

    uri = str(tmp_path / "t")
    _commit(uri, _files(tmp_path / "t", [1], "a"), 0)
    files = _files(tmp_path / "t", [2], "paused")
    calls = []

    def attempt(table, props):
        calls.append(table.version())
        table.create_write_transaction(
            commit._actions(files), mode="append", schema=table.schema(), commit_properties=props
        )
        for n in range(2, 5):  # the pipeline went on elsewhere meanwhile
            _commit(uri, _files(tmp_path / "t", [10 + n], f"later{n}"), n)
        DeltaTable(uri).create_checkpoint()  # at version 4; then cleanup removes what precedes it
        for v in range(3):
            (tmp_path / "t" / "_delta_log" / f"{v:020d}.json").unlink()
        # What delta-rs raises on S3 when the log PUT landed but its response was lost.
        raise CommitFailedError("Failed to commit transaction: Concurrent transaction failed.")

    result = commit.commit(
        uri, {}, attempt, what="batch 1", txns=lambda _t: {"pipe": 1}, already_done=_replayed("pipe", 1)
    )
    assert calls == [0]
    assert result.outcome is commit.Outcome.ALREADY_DONE
    assert result.in_doubt and not result.may_delete_files
    assert 2 in _ids(uri)  # the table still reads: the "paused" file is referenced


def test_a_create_that_lost_the_race_appends_to_the_winners_table(tmp_path):
    uri = str(tmp_path / "t")
    ours = _files(tmp_path / "t", [2], "ours")
    real = commit.create_table_with_add_actions

    raced = []

    def create_after_the_winner(*args, **kwargs):
        # The other writer's table appears after our load, before delta-rs' own existence check.
        if not raced:
            raced.append(True)
            real(
                uri,
                commit.delta_schema(SCHEMA),
                commit._actions(_files(tmp_path / "t", [1], "w")),
                mode="error",
            )
        return real(*args, **kwargs)

    commit.create_table_with_add_actions = create_after_the_winner
    try:
        result = _commit(uri, ours, 0)
    finally:
        commit.create_table_with_add_actions = real
    assert result.committed and result.attempts == 2
    assert _ids(uri) == [1, 2]


def test_a_commit_racing_a_claim_conflicts_and_is_fenced(tmp_path):
    uri = str(tmp_path / "t")
    _commit(uri, _files(tmp_path / "t", [1], "a"), 0)
    old = commit.claim_writer(uri, {}, "pipe")
    attempts = []

    def attempt(table, props):
        attempts.append(table.version())
        if len(attempts) == 1:  # the new writer claims between our load and our write
            commit.claim_writer(uri, {}, "pipe")
        table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=props)

    before = DeltaTable(uri).version()
    with pytest.raises(WriterFencedError, match="epoch 2"):
        commit.commit(uri, {}, attempt, what="zombie", fence=old, txns=lambda _t: {"pipe": 1})
    table = DeltaTable(uri)
    assert table.version() == before + 1  # only the claim landed
    assert table.transaction_version(commit.fence_app_id("pipe")) == 2
    assert table.transaction_version("pipe") == 0


def test_racing_claims_get_distinct_epochs(tmp_path):
    import threading

    uri = str(tmp_path / "t")
    _commit(uri, _files(tmp_path / "t", [1], "a"), 0)
    fences: list[commit.Fence] = []
    start = threading.Barrier(4)

    def claim():
        start.wait()
        fences.append(commit.claim_writer(uri, {}, "pipe", policy=commit.RetryPolicy(max_retries=10)))

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(f.epoch for f in fences) == [1, 2, 3, 4]
    assert DeltaTable(uri).transaction_version(commit.fence_app_id("pipe")) == 4


def test_txns_are_computed_again_for_every_attempt(tmp_path):
    uri = str(tmp_path / "t")
    commit.create_table(uri, SCHEMA, partition_by=(), properties={}, storage_options={})
    seen = []

    def attempt(table, props):
        seen.append({t.app_id: t.version for t in props.app_transactions})
        if len(seen) == 1:
            raise OSError("connection refused")  # did not land
        table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=props)

    versions = iter([5, 6])
    commit.commit(uri, {}, attempt, what="test", txns=lambda _t: {"p-topic-0": next(versions)})
    assert seen == [{"p-topic-0": 5}, {"p-topic-0": 6}]
    assert DeltaTable(uri).transaction_version("p-topic-0") == 6


def test_access_denied_is_terminal_and_not_retried(tmp_path):
    uri = str(tmp_path / "t")
    commit.create_table(uri, SCHEMA, partition_by=(), properties={}, storage_options={})
    calls = []

    def attempt(table, props):
        calls.append(1)
        raise OSError("Generic S3 error: 403 Forbidden: AccessDenied")

    with pytest.raises(StorageAccessError, match="Check the storage settings"):
        commit.commit(uri, {}, attempt, what="test")
    assert calls == [1]


def test_a_value_delta_rs_cannot_parse_is_terminal_not_retried_forever(tmp_path):
    # A held change with 'infinity' in a timestamp column, once its source column became text:
    # delta-rs says so as a "Generic DeltaTable error", the words of its store failures too.
    import datetime as dt

    from deltalake import write_deltalake

    uri = str(tmp_path / "t")
    ts = pa.array([dt.datetime(2020, 1, 1)], pa.timestamp("us", tz="UTC"))
    write_deltalake(uri, pa.table({"id": [1], "ts": ts}))
    calls = []

    def attempt(table, props):
        calls.append(1)
        source = pa.table({"id": [1], "ts": ["infinity"]})
        on = "t.id = s.id"
        merge = table.merge(source, on, source_alias="s", target_alias="t", commit_properties=props)
        return merge.when_matched_update({"ts": "CAST(s.ts AS TIMESTAMP)"}).execute()

    with pytest.raises(Exception, match="Error parsing timestamp from 'infinity'") as caught:
        commit.commit(uri, {}, attempt, what="test")
    assert calls == [1]  # not retried: the same data fails the same way
    assert commit.is_terminal(caught.value)
    # Its neighbours in wording keep their class; a value is the user's text, never a reason.
    arrow = "Generic DeltaTable error: Arrow error: "
    for text, terminal in [
        (arrow + "Parser error: Error parsing timestamp from 'connection reset'", True),
        (arrow + "Parser error: Error parsing timestamp from 'session timeout'", True),
        (arrow + "Cast error: Cannot cast string 'abc' to value of Int64 type", True),
        (arrow + "Io error: connection reset", False),
        (arrow + "External error: Generic S3 error: 503 Service Unavailable: SlowDown", False),
        (arrow + "Parser error: dns error: failed to lookup address", False),
        (arrow + "External error: Generic S3 error: HTTP error: error decoding response body", False),
        ("Generic S3 error: 503 Service Unavailable", False),
    ]:
        assert commit.is_terminal(OSError(text)) is terminal, text


def test_a_newer_writer_fences_the_older_one_which_names_it(tmp_path):
    uri = str(tmp_path / "t")
    _commit(uri, _files(tmp_path / "t", [1], "a"), 0)
    old = commit.claim_writer(uri, {}, "pipe")
    assert old.epoch == 1
    assert _commit(uri, _files(tmp_path / "t", [2], "b"), 1, fence=old).committed
    new = commit.claim_writer(uri, {}, "pipe")
    assert new.epoch == 2
    with pytest.raises(WriterFencedError) as err:
        _commit(uri, _files(tmp_path / "t", [3], "c"), 2, fence=old)
    assert f"{commit.writer_name()}" in str(err.value) and "epoch 2" in str(err.value)
    assert _commit(uri, _files(tmp_path / "t", [3], "d"), 2, fence=new).committed
    assert _ids(uri) == [1, 2, 3]


def test_create_table_adopts_a_table_created_meanwhile(tmp_path):
    uri = str(tmp_path / "t")
    first = commit.create_table(uri, SCHEMA, partition_by=[], properties={}, storage_options={})
    second = commit.create_table(uri, SCHEMA, partition_by=[], properties={}, storage_options={})
    assert first.metadata().id == second.metadata().id
    assert DeltaTable(uri).version() == 0


def test_a_table_created_claimed_holds_the_claim_in_its_first_commit(tmp_path):
    uri = str(tmp_path / "t")
    table, fence = commit.create_claimed_table(
        uri, SCHEMA, partition_by=[], properties={}, storage_options={}, claim="pipe"
    )
    assert fence == commit.Fence(commit.fence_app_id("pipe"), 1)
    assert table.version() == 0 == DeltaTable(uri).version()  # one commit: created and claimed
    assert DeltaTable(uri).transaction_version(fence.app_id) == 1
    commit.check_fence(DeltaTable(uri), uri, fence)
    # Another process claims it as a claim of its own would: epoch 2, and the first is fenced.
    later = commit.claim_writer(uri, {}, "pipe")
    assert later.epoch == 2
    with pytest.raises(WriterFencedError, match="epoch 2"):
        commit.check_fence(DeltaTable(uri), uri, fence)
    # A table that exists is adopted, not claimed: the caller claims it with a commit of its own.
    adopted, none = commit.create_claimed_table(
        uri, SCHEMA, partition_by=[], properties={}, storage_options={}, claim="pipe"
    )
    assert none is None and adopted.version() == 1


def test_a_claiming_creation_whose_response_is_lost_is_read_from_the_log(tmp_path):
    # The creating commit lands, its response is lost: the log shows this call's token, so the
    # table is its own (claimed at epoch 1, once), not adopted and claimed a second time.
    from deltaflow.io.faults import lose_commit_responses

    uri = str(tmp_path / "t")
    with lose_commit_responses("creating", times=1) as lost:
        table, fence = commit.create_claimed_table(
            uri, SCHEMA, partition_by=[], properties={}, storage_options={}, claim="pipe"
        )
    assert lost.lost, "no response was lost"
    assert fence == commit.Fence(commit.fence_app_id("pipe"), 1)
    assert table.version() == 0 == DeltaTable(uri).version()
    assert DeltaTable(uri).transaction_version(fence.app_id) == 1
    commit.check_fence(DeltaTable(uri), uri, fence)


def test_add_columns_is_done_when_the_columns_exist(tmp_path):
    uri = str(tmp_path / "t")
    commit.create_table(uri, SCHEMA, partition_by=[], properties={}, storage_options={})
    commit.add_columns(uri, {}, [pa.field("extra", pa.string())])
    commit.add_columns(uri, {}, [pa.field("extra", pa.string())])  # a replay: nothing to do
    table = DeltaTable(uri)
    assert table.version() == 1 and "extra" in table.schema().to_arrow().names


def test_read_entries_gives_paths_as_on_disk(tmp_path):
    uri = str(tmp_path / "t")
    schema = pa.schema([("id", pa.int64()), ("p", pa.string())])
    writer = PartitionedFileWriter(
        fs=pafs.LocalFileSystem(),
        root=uri,
        schema=schema,
        partition_columns=["p"],
        compression="snappy",
        target_file_size=1 << 30,
        max_records_per_file=0,
        file_prefix="x",
    )
    files = writer.write_batches([pa.RecordBatch.from_pydict({"id": [1], "p": ["a b:c%"]}, schema=schema)])
    commit.commit_files(
        uri,
        files,
        what="t",
        schema=schema,
        partition_by=["p"],
        mode="append",
        metadata={},
        storage_options={},
        policy=commit.RetryPolicy(),
        create_if_missing=True,
        properties={},
    )
    (entry,) = commit.read_entries(uri, {}, 0, 0)
    assert entry.added == {f.path for f in files}
    assert (tmp_path / "t" / files[0].path).exists()


def test_read_entries_gives_the_txn_delta_rs_reads_and_which_entries_redefine_the_table(tmp_path):
    """Two txns of one app id in one entry (another writer may make them; delta-rs takes them):
    the entry's is the first, as delta-rs reads it back. A property set is a redefinition."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    uri = str(tmp_path / "t")
    twice = CommitProperties(app_transactions=[Transaction("x", 1), Transaction("x", 7)])
    write_deltalake(uri, pa.table({"id": [1]}), commit_properties=twice)
    write_deltalake(uri, pa.table({"id": [2]}), mode="append")
    DeltaTable(uri).alter.set_table_properties({"delta.appendOnly": "true"})
    first, second, third = commit.read_entries(uri, {}, 0, 2)
    assert first.txns == {"x": DeltaTable(uri).transaction_version("x")} == {"x": 1}
    assert (first.redefines, second.redefines, third.redefines) == (True, False, True)


def test_indexed_columns_reads_the_table_property(tmp_path):
    uri = str(tmp_path / "t")
    table = commit.create_table(
        uri,
        SCHEMA,
        partition_by=[],
        properties={"delta.dataSkippingNumIndexedCols": "1"},
        storage_options={},
    )
    assert delta_log.indexed_columns(table) == 1
    assert delta_log.indexed_columns(None, {}) == 32


def test_a_log_that_cannot_be_read_back_after_an_attempt_is_reported_as_unknown(tmp_path, monkeypatch):
    """After a failed attempt the log could not be read: the outcome is unknown, not "not held"."""
    from deltaflow.errors import StorageUnavailableError

    uri = str(tmp_path / "t")
    commit.create_table(uri, SCHEMA, partition_by=(), properties={}, storage_options={})
    real_load = commit._load
    loads = []

    def load(table_uri, storage_options):
        loads.append(1)
        if len(loads) > 1:
            raise StorageUnavailableError("reading the Delta log failed", table_uri=table_uri)
        return real_load(table_uri, storage_options)

    def attempt(table, props):
        raise OSError("error sending request: connection reset")

    monkeypatch.setattr(commit, "_load", load)
    with pytest.raises(CommitError) as err:
        commit.commit(uri, {}, attempt, what="batch 0", policy=commit.RetryPolicy(max_retries=0))
    assert "the log could not be read back, so whether it landed is unknown" in str(err.value)
    assert "the log does not hold it" not in str(err.value)


def test_the_version_reported_is_the_commits_own_also_when_delta_rs_rebased_it(tmp_path):
    uri = str(tmp_path / "t")
    _commit(uri, _files(tmp_path / "t", [1], "a"), 0)
    assert _commit(uri, _files(tmp_path / "t", [2], "b"), 1).version == 1  # the entry after the load
    ours = _files(tmp_path / "t", [4], "ours")

    def attempt(table, props):
        # Another writer lands right after our load: delta-rs commits ours past it.
        _commit(uri, _files(tmp_path / "t", [3], "other"), 7, app="other")
        table.create_write_transaction(commit._actions(ours), "append", SCHEMA, commit_properties=props)

    result = commit.commit(uri, {}, attempt, what="batch 2")
    assert result.committed and result.version == 3
    assert _commit_token(uri, 3) == result.token
