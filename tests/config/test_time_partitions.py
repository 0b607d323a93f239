"""Arroyo's time_partition_pattern as partition columns: names and Spark formats."""

from __future__ import annotations

import pytest

from deltaflow.config.time_partitions import parse_time_pattern


@pytest.mark.parametrize(
    ("pattern", "columns"),
    [
        ("%Y/%m/%d/%H", [("year", "yyyy"), ("month", "MM"), ("day", "dd"), ("hour", "HH")]),
        ("year=%Y/month=%m/day=%d", [("year", "yyyy"), ("month", "MM"), ("day", "dd")]),
        ("%Y-%m-%d/%H", [("year_month_day", "yyyy'-'MM'-'dd"), ("hour", "HH")]),
        ("%F", [("date", "yyyy-MM-dd")]),
        ("/h=%H:%M/", [("h", "HH':'mm")]),
        ("d=day_%j%%", [("d", "'day_'DDD'%'")]),
        ("q=it's %Y", [("q", "'it''s 'yyyy")]),
    ],
    ids=["arroyo-default", "hive", "compound", "F", "slashes", "literal", "quote"],
)
def test_segments_become_columns(pattern, columns):
    assert [(c.name, c.spark_format) for c in parse_time_pattern(pattern)] == columns


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("%Y//%m", "empty segment"),
        ("%Y/%s", "%s is not supported"),
        ("1x=%Y", "'1x' is not a column name"),
        ("%d/day=%H", "two segments make the column 'day'"),
    ],
)
def test_bad_patterns(pattern, message):
    with pytest.raises(ValueError, match=message):
        parse_time_pattern(pattern)
