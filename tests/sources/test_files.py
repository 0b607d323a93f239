"""``deltaflow.sources.files`` through pipelines into Delta: json, csv, parquet, avro."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from deltaflow.service.daemon import run_pipelines
from deltaflow.sources.files import SOURCE_SCHEMA_FILE
from tests.fixtures.frames import settled
from tests.fixtures.pipelines import pipelines as _pipelines
from tests.fixtures.pipelines import rows as _rows


def test_json_files_schema_inferred_once_and_rescued_data(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text(
        '{"id": 1, "name": "a", "score": 1.5}\n{"id": 2, "name": "b", "score": 2.5}\n\n'
    )
    settled(landing / "a.json")
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: files
            source: {type: files, path: "${DIR}/landing", format: json, max_files_per_trigger: 1,
                     source_file_column: source_file}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    stored = tmp_path / "t" / "_deltaflow" / "checkpoints" / "files" / SOURCE_SCHEMA_FILE
    assert [f["name"] for f in json.loads(stored.read_text())["fields"]] == ["id", "name", "score"]

    # Later files: a new field, a wrong type, broken JSON. The schema stays; nothing is lost.
    (landing / "b.json").write_text(
        '{"id": 3, "name": "c", "score": 3.5, "extra": {"x": 1}}\n'
        '{"id": 4, "name": "d", "score": "high"}\n'
        '{"id": 5, "name": \n'
        '{"id": 6, "name": "f", "score": 6.5}\n'
    )
    settled(landing / "b.json")
    run_pipelines(spark, specs, available_now=True)
    table = DeltaTable(str(tmp_path / "t"))
    assert [f.name for f in table.schema().fields] == ["id", "name", "score", "_rescued_data", "source_file"]
    rows = sorted(
        table.to_pyarrow_table().to_pylist(),
        key=lambda r: (r["id"] is None, r["id"] or 0, r["_rescued_data"]),
    )
    got = [(r["id"], r["name"], r["score"], r["_rescued_data"]) for r in rows]
    assert got == [
        (1, "a", 1.5, None),
        (2, "b", 2.5, None),
        (3, "c", 3.5, '{"extra":"{\\"x\\":1}"}'),
        (4, "d", None, '{"id": 4, "name": "d", "score": "high"}'),
        (6, "f", 6.5, None),
        (None, None, None, '{"id": 5, "name": '),
    ]
    assert {Path(r["source_file"]).name for r in rows} == {"a.json", "b.json"}
    # max_files_per_trigger 1: one commit per file.
    assert table.transaction_version("files") == 1


def test_csv_files_with_a_given_schema(spark, tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "1.csv").write_text("id,city,temp\n1,Oslo,3.5\n2,Rome,x\n3,Lima,19\n")
    settled(landing / "1.csv")
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: csv
            source:
              type: files
              path: "${DIR}/landing"
              format: csv
              schema: "id INT, city STRING, temp DOUBLE"
            transforms: {city_uc: "sql: upper(city)"}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    assert _rows(tmp_path / "t", "id", "city_uc", "temp", "_rescued_data") == [
        (1, "OSLO", 3.5, None),
        (2, "ROME", None, "2,Rome,x"),
        (3, "LIMA", 19.0, None),
    ]


def test_parquet_files_schema_inferred(spark, tmp_path):
    import pyarrow.parquet as pq

    landing = tmp_path / "landing"
    landing.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "tags": [["a"], []]}), landing / "1.parquet")
    pq.write_table(pa.table({"id": [3], "tags": [["b", "c"]]}), landing / "2.parquet")
    settled(landing / "1.parquet", landing / "2.parquet")
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: pq
            source: {type: files, path: "${DIR}/landing", format: parquet, max_files_per_trigger: 1}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    assert _rows(tmp_path / "t", "id") == [(1,), (2,), (3,)]
    table = DeltaTable(str(tmp_path / "t"))
    assert table.to_pyarrow_table().sort_by("id").column("tags").to_pylist() == [["a"], [], ["b", "c"]]
    assert table.transaction_version("pq") == 1  # one batch per file


def test_avro_files_decoded_without_a_jar_schema_from_the_first_file(spark, tmp_path):
    import datetime as dt

    import fastavro

    landing = tmp_path / "landing"
    landing.mkdir()
    v1 = {
        "type": "record",
        "name": "Reading",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "city", "type": ["null", "string"]},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
        ],
    }
    at = dt.datetime(2026, 11, 22, 8, 0, tzinfo=dt.UTC)
    with open(landing / "1.avro", "wb") as out:
        fastavro.writer(out, v1, [{"id": i, "city": f"c{i}", "at": at, "tags": ["x"] * i} for i in range(3)])
    settled(landing / "1.avro")
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: avro
            source: {type: files, path: "${DIR}/landing", format: avro, source_file_column: file}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    # A newer writer schema with one more field: the column set stays, the field is rescued.
    v2 = {**v1, "fields": [*v1["fields"], {"name": "unit", "type": "string"}]}
    with open(landing / "2.avro", "wb") as out:
        fastavro.writer(out, v2, [{"id": 9, "city": None, "at": at, "tags": [], "unit": "C"}])
    settled(landing / "2.avro")
    run_pipelines(spark, specs, available_now=True)
    rows = sorted(DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist(), key=lambda r: r["id"])
    assert [(r["id"], r["city"], r["at"], r["tags"], r["_rescued_data"]) for r in rows] == [
        (0, "c0", at, [], None),
        (1, "c1", at, ["x"], None),
        (2, "c2", at, ["x", "x"], None),
        (9, None, at, [], '{"unit": "C"}'),
    ]
    assert [Path(r["file"]).name for r in rows] == ["1.avro", "1.avro", "1.avro", "2.avro"]


def test_a_file_still_being_written_is_read_whole_once_its_writer_is_done(spark, tmp_path):
    """Issue 29, case 4: 50 lines and half of the 51st, the rest 5 s later. The file is taken only
    once it is min_file_age old (10 s by default): every row once, no NULL row of a cut line."""
    from deltaflow.pipeline.runner import start_pipeline

    landing = tmp_path / "landing"
    landing.mkdir()
    lines = [json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in range(100)]
    (spec,) = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: slow-writer
            source: {type: files, path: "${DIR}/landing", format: json, schema: "id BIGINT, name STRING"}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    out = (landing / "f.json").open("w")
    out.write("".join(lines[:50]) + lines[50][:8])
    out.flush()
    query = start_pipeline(spark, spec)
    try:
        # The writer's pause (5 s), cut short if a batch commits the half file meanwhile.
        pause_until = time.monotonic() + 5
        while time.monotonic() < pause_until and not _committed_rows(tmp_path / "t"):
            time.sleep(0.2)
        out.write(lines[50][8:] + "".join(lines[51:]))
        out.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(_committed_rows(tmp_path / "t")) < 100:
            time.sleep(0.5)
    finally:
        out.close()
        query.stop()
    got = sorted(_committed_rows(tmp_path / "t"), key=lambda r: (r["id"] is None, r["id"] or 0))
    assert [(r["id"], r["_rescued_data"]) for r in got] == [(i, None) for i in range(100)]


def _landed(path: Path, text: str) -> None:
    """A file written a minute ago (older than the files source's min_file_age)."""
    path.write_text(text)
    settled(path)


def _committed_rows(table: Path) -> list[dict]:
    return DeltaTable(str(table)).to_pyarrow_table().to_pylist()


def test_lines_that_are_no_json_object_go_to_the_dead_letter_table(spark, tmp_path):
    """Issue 29, case 4: with a dead-letter table, a cut or non-object line is a dead letter (as a
    bad Kafka message is), not an id-NULL row of the main table; a wrong type is still rescued."""
    landing = tmp_path / "landing"
    landing.mkdir()
    _landed(
        landing / "a.json",
        '{"id": 1, "score": 1.5}\n{"id": 2, "score": "high"}\n{"id": \n[1, 2]\n{"id": 3, "score": 3.5}\n',
    )
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: bad-lines
            source: {type: files, path: "${DIR}/landing", format: json, schema: "id INT, score DOUBLE"}
            dead_letter: {table_uri: "${DIR}/dlq"}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    main = DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()
    assert [r["_rescued_data"] for r in main if r["id"] is None] == []
    assert _rows(tmp_path / "t", "id", "score", "_rescued_data") == [
        (1, 1.5, None),
        (2, None, '{"id": 2, "score": "high"}'),
        (3, 3.5, None),
    ]
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    letters.sort(key=lambda r: r["record"])
    assert [(r["pipeline_id"], r["batch_id"], r["reason"]) for r in letters] == [
        ("bad-lines", 0, "malformed JSON: the line is not one JSON object")
    ] * 2
    records = [json.loads(r["record"]) for r in letters]
    assert [r["line"] for r in records] == ["[1, 2]", '{"id": ']
    assert {Path(r["file"]).name for r in records} == {"a.json"}


def test_input_file_name_in_a_transform_with_expectations_and_two_sinks(spark, tmp_path):
    """Issue 29, case 8: the README's shape (expectations, two sinks) cached the source's rows, and
    input_file_name() gave '' in every row; it is evaluated in the file scan now."""
    landing = tmp_path / "landing"
    landing.mkdir()
    for name, ids in (("eu.json", range(0, 4)), ("us.json", range(4, 8))):
        region = name.split(".")[0]
        rows = [{"id": i, "region": region, "amount": i - 1} for i in ids]
        _landed(landing / name, "".join(json.dumps(r) + "\n" for r in rows))
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: file-names
            source: {type: files, path: "${DIR}/landing", format: json,
                     schema: "id INT, region STRING, amount INT"}
            transforms: {"meta.file": "sql: input_file_name()"}
            expectations: [{name: positive, expr: "amount > 0", action: drop}]
            dead_letter: {table_uri: "${DIR}/dlq"}
            sinks:
              - {name: eu, table_uri: "${DIR}/eu", when: "region = 'eu'"}
              - {name: rest, table_uri: "${DIR}/rest", when: "region <> 'eu'"}
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    got = [
        (r["id"], Path(r["meta"]["file"]).name)
        for t in ("eu", "rest")
        for r in DeltaTable(str(tmp_path / t)).to_pyarrow_table().to_pylist()
    ]
    assert sorted(got) == [(i, "eu.json") for i in (2, 3)] + [(i, "us.json") for i in range(4, 8)]
    letters = DeltaTable(str(tmp_path / "dlq")).to_pyarrow_table().to_pylist()
    assert sorted(Path(json.loads(r["record"])["meta"]["file"]).name for r in letters) == ["eu.json"] * 2


def test_files_in_partition_folders_land_with_their_partition_columns(spark, tmp_path):
    """Spark's file source read the files of ``key=value`` folders and filled the column the
    schema names from the path; the files source's own listing took only the top level (those
    files never landed). A file directly in the folder is read too (Spark's read drops it when it
    finds partitions), other subfolders are not listed (as Spark's source)."""
    landing = tmp_path / "landing"
    for country, ids in (("fr", (1, 2)), ("de", (3,))):
        (landing / f"country={country}").mkdir(parents=True)
        _landed(landing / f"country={country}" / "a.json", "".join(json.dumps({"id": i}) + "\n" for i in ids))
    (landing / "country=it" / "_tmp").mkdir(parents=True)
    _landed(landing / "country=it" / "_tmp" / "b.json", '{"id": 9}\n')
    (landing / "archive").mkdir()
    _landed(landing / "archive" / "c.json", '{"id": 8}\n')
    _landed(landing / "top.json", '{"id": 4, "country": "pt"}\n')
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: partitioned
            source: {type: files, path: "${DIR}/landing", format: json, schema: "id BIGINT, country STRING",
                     source_file_column: file}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    (landing / "country=es").mkdir()
    _landed(landing / "country=es" / "d.json", '{"id": 5, "country": "xx"}\n')  # the path wins
    run_pipelines(spark, specs, available_now=True)
    assert _rows(tmp_path / "t", "id", "country", "_rescued_data") == [
        (1, "fr", None),
        (2, "fr", None),
        (3, "de", None),
        (4, "pt", None),
        (5, "es", None),
    ]
    files = {Path(f).parent.name for (f,) in _rows(tmp_path / "t", "file")}
    assert files == {"country=fr", "country=de", "country=es", "landing"}


def test_parquet_and_csv_partition_columns_inferred_from_the_folders(spark, tmp_path):
    import pyarrow.parquet as pq

    for fmt in ("parquet", "csv"):
        landing = tmp_path / fmt
        for year, month, ids in (("2025", "12", [1]), ("2026", "01", [2, 3])):
            folder = landing / f"year={year}" / f"month={month}"
            folder.mkdir(parents=True)
            if fmt == "parquet":
                pq.write_table(pa.table({"id": ids}), folder / "a.parquet")
            else:
                (folder / "a.csv").write_text("id\n" + "".join(f"{i}\n" for i in ids))
            settled(next(folder.iterdir()))
    specs = _pipelines(
        tmp_path,
        """
        pipelines:
          - id: pq
            source: {type: files, path: "${DIR}/parquet", format: parquet}
            sinks: [{table_uri: "${DIR}/pq"}]
          - id: csv
            source: {type: files, path: "${DIR}/csv", format: csv, schema: "id INT, year INT, month STRING"}
            sinks: [{table_uri: "${DIR}/csv_t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    assert _rows(tmp_path / "pq", "id", "year", "month") == [(1, 2025, 12), (2, 2026, 1), (3, 2026, 1)]
    # The schema's types: "01" stays a string.
    csv_rows = _rows(tmp_path / "csv_t", "id", "year", "month")
    assert csv_rows == [(1, 2025, "12"), (2, 2026, "01"), (3, 2026, "01")]


def test_a_file_deleted_between_listing_and_reading_has_one_outcome_named_both_times(
    spark, tmp_path, monkeypatch, caplog
):
    import logging

    import pytest

    from deltaflow.errors import SourceFilesGoneError
    from deltaflow.sources import files

    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text('{"id": 1}\n{"id": 2}\n')
    (landing / "b.json").write_text('{"id": 3}\n')
    settled(landing / "a.json", landing / "b.json")
    text = """
        pipelines:
          - id: gone
            source: {type: files, path: "${DIR}/landing", format: json, schema: "id LONG"OPTIONS}
            sinks: [{table_uri: "${DIR}/t"}]
        """
    specs = _pipelines(tmp_path, text.replace("OPTIONS", ""))
    # The batch has listed both files; b.json goes before the batch reads it.
    real = files.BatchFiles.__call__

    def deleting(self, listing):
        (landing / "b.json").unlink(missing_ok=True)
        return real(self, listing)

    monkeypatch.setattr(files.BatchFiles, "__call__", deleting)
    with pytest.raises(SourceFilesGoneError, match=r"1 of the 2 file\(s\) .*/b\.json; nothing of the batch"):
        run_pipelines(spark, specs, available_now=True)
    monkeypatch.setattr(files.BatchFiles, "__call__", real)
    # The restart replays the batch with the same files: the same error, never an empty commit.
    with pytest.raises(SourceFilesGoneError, match="ignoreMissingFiles"):
        run_pipelines(spark, specs, available_now=True)
    assert (
        not (tmp_path / "t" / "_delta_log").exists()
        or DeltaTable(str(tmp_path / "t")).to_pyarrow_table().num_rows == 0
    )
    # Told to skip them: the rest lands, the skipped file named.
    specs = _pipelines(tmp_path, text.replace("OPTIONS", ", options: {ignoreMissingFiles: 'true'}"))
    with caplog.at_level(logging.WARNING, logger="deltaflow.sources.files"):
        run_pipelines(spark, specs, available_now=True)
    assert sorted(r["id"] for r in DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()) == [1, 2]
    assert any("b.json" in r.getMessage() and "skipped" in r.getMessage() for r in caplog.records)


def test_files_named_with_url_characters_are_found_where_the_listing_found_them(s3, monkeypatch):
    # A listed key is never parsed as a URL: '#' or '?' would cut it short, and a file that is
    # there would be reported gone (or, with ignoreMissingFiles, skipped).
    import pyarrow.fs as pafs

    from deltaflow.io.storage import filesystem
    from deltaflow.sources.files import _gone

    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    root = s3.uri("landing")
    fs, where = filesystem(root, {})
    for name in ("a#1.json", "b?x=1.json", "c.json"):
        with fs.open_output_stream(f"{where}/{name}") as out:
            out.write(b'{"id": 1}\n')
    listed = [f"{root}/{name}" for name in ("a#1.json", "b?x=1.json", "c.json", "gone.json")]
    assert _gone(listed) == [f"{root}/gone.json"]
    assert _gone([str(Path(__file__))]) == []  # a local path
    assert fs.get_file_info(f"{where}/a#1.json").type == pafs.FileType.File
