import pickle

from deltaflow.errors import CommitError, DeltaflowError, SchemaMismatchError, TransientError


def test_errors_keep_their_context_through_pickle():
    err = CommitError("commit failed", table_uri="/t", app_id="p1", txn_version=4, attempts=4)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is CommitError
    assert str(back) == "commit failed"
    assert (back.table_uri, back.app_id, back.txn_version, back.attempts) == ("/t", "p1", 4, 4)
    assert isinstance(back, TransientError)
    assert isinstance(back, DeltaflowError)


def test_schema_mismatch_lists_every_difference():
    err = SchemaMismatchError("/t", ["column 'a' is x", "column 'b' is y"], hint="nothing was written")
    assert str(err).splitlines() == [
        "schema of the data does not match the Delta table '/t':",
        "  - column 'a' is x",
        "  - column 'b' is y",
        "nothing was written",
    ]
    assert pickle.loads(pickle.dumps(err)).differences == ["column 'a' is x", "column 'b' is y"]


def test_brief_drops_a_rust_backtrace():
    from deltaflow.errors import brief

    raw = (
        "Schema error: Invalid data type\n   0: <unknown>\n   1: cfunction_vectorcall\n             at x.c:4"
    )
    assert brief(RuntimeError(raw)) == "Schema error: Invalid data type"
