"""``deltaflow.sources.file_listing``: which files each batch of a files source takes (the
reader's calls, as Spark makes them on the driver side; no Spark needed)."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes, ReadMaxFiles

from deltaflow.sources.file_listing import FileListingOptions, FileListingStreamReader


def _reader(tmp_path: Path, **options: str) -> FileListingStreamReader:
    values = {"path": str(tmp_path / "landing"), "checkpoint": str(tmp_path / "ckpt"), **options}
    return FileListingStreamReader(FileListingOptions.from_spark_options(values))


def _write(path: Path, text: str, age_s: float) -> None:
    path.write_text(text)
    at = time.time() - age_s
    os.utime(path, (at, at))


def _names(offset: dict) -> list[str]:
    return [Path(f[0]).name for f in offset["files"]]


def test_a_file_is_taken_once_it_is_old_enough_and_never_again(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    _write(landing / "old.json", "{}\n", age_s=60)
    _write(landing / "young.json", '{"id": ', age_s=1)
    _write(landing / ".hidden.json.tmp", "{}\n", age_s=60)
    _write(landing / "_SUCCESS", "", age_s=60)
    reader = _reader(tmp_path, min_file_age_s="10")
    start = reader.initialOffset()
    first = reader.latestOffset(start, ReadAllAvailable())
    assert _names(first) == ["old.json"]

    # The young file's writer is done and it has aged: the next batch takes it, whole.
    _write(landing / "young.json", '{"id": 1}\n', age_s=11)
    second = reader.latestOffset(first, ReadAllAvailable())
    assert _names(second) == ["young.json"]
    assert second["batch"] == first["batch"] + 1

    # A restart from the first batch (the second planned, never logged by Spark): the records
    # up to it say what was taken; the second batch's files are planned again.
    again = _reader(tmp_path, min_file_age_s="10")
    assert _names(again.latestOffset(first, ReadAllAvailable())) == ["young.json"]
    resumed = _reader(tmp_path, min_file_age_s="10")
    assert resumed.latestOffset(second, ReadAllAvailable()) == second  # nothing new


def test_a_file_changed_after_it_was_taken_is_logged(tmp_path, caplog):
    landing = tmp_path / "landing"
    landing.mkdir()
    _write(landing / "a.json", "{}\n", age_s=60)
    reader = _reader(tmp_path, min_file_age_s="0")
    first = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    _write(landing / "a.json", "{}\n{}\n", age_s=0)
    with caplog.at_level(logging.WARNING, logger="deltaflow.sources.file_listing"):
        assert reader.latestOffset(first, ReadAllAvailable()) == first
    assert "a.json changed after a batch read it (3 bytes" in caplog.text


def test_limits_per_trigger_take_the_oldest_files_first(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    for i, name in enumerate(["c.json", "a.json", "b.json"]):
        _write(landing / name, "x" * 10, age_s=100 - i)
    reader = _reader(tmp_path)
    start = reader.initialOffset()
    assert _names(reader.latestOffset(start, ReadMaxFiles(2))) == ["c.json", "a.json"]
    reader = _reader(tmp_path)  # from the start again: the records past it are ignored
    assert _names(reader.latestOffset(start, ReadMaxBytes(25))) == ["c.json", "a.json"]


def test_available_now_waits_for_a_file_present_at_its_start(tmp_path):
    landing = tmp_path / "landing"
    landing.mkdir()
    _write(landing / "a.json", '{"id": 1}\n', age_s=0)
    reader = _reader(tmp_path, min_file_age_s="1")
    reader.prepareForTriggerAvailableNow()
    began = time.monotonic()
    offset = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    assert _names(offset) == ["a.json"]
    assert time.monotonic() - began >= 0.5  # it waited for the file to age


def test_partition_folders_are_listed_other_subfolders_are_not(tmp_path):
    """As Spark's file source: ``key=value`` folders at any depth (a ``_key=value`` one too), no
    other subfolder unless ``recursiveFileLookup``; hidden names and ``hadoop fs -put``'s copies
    in progress skipped."""
    landing = tmp_path / "landing"
    for folder in ("y=2026/m=01", "_k=v", ".k=v", "plain", "y=2026/_tmp", "y=", "=x"):
        (landing / folder).mkdir(parents=True, exist_ok=True)
        _write(landing / folder / "a.json", "{}\n", age_s=60)
    _write(landing / "y=2026" / "b.json", "{}\n", age_s=60)
    _write(landing / "y=2026" / "c.json._COPYING_", "{}\n", age_s=60)
    _write(landing / "top.json", "{}\n", age_s=60)

    def listed(**options: str) -> list[str]:
        offset = _reader(tmp_path, **options).latestOffset({"batch": 0, "files": []}, ReadAllAvailable())
        return sorted(str(Path(f[0]).relative_to(landing)) for f in offset["files"])

    assert listed() == ["_k=v/a.json", "top.json", "y=2026/b.json", "y=2026/m=01/a.json"]
    assert listed(recursive="true") == [
        "=x/a.json",
        "_k=v/a.json",
        "plain/a.json",
        "top.json",
        "y=/a.json",
        "y=2026/b.json",
        "y=2026/m=01/a.json",
    ]
