"""Arroyo's time_partition_pattern as partition columns: names, fields and literal text."""

from __future__ import annotations

import pytest

from deltaflow.config.time_partitions import parse_time_pattern


@pytest.mark.parametrize(
    ("pattern", "columns"),
    [
        ("%Y/%m/%d/%H", [("year", "{year}"), ("month", "{month}"), ("day", "{day}"), ("hour", "{hour}")]),
        ("year=%Y/month=%m/day=%d", [("year", "{year}"), ("month", "{month}"), ("day", "{day}")]),
        ("%Y-%m-%d/%H", [("year_month_day", "{year}-{month}-{day}"), ("hour", "{hour}")]),
        ("%F", [("date", "{date}")]),
        ("/h=%H:%M/", [("h", "{hour}:{minute}")]),
        ("d=day_%j%%", [("d", "day_{day_of_year}%")]),
        ("q=it's %Y", [("q", "it's {year}")]),
    ],
    ids=["arroyo-default", "hive", "compound", "F", "slashes", "literal", "quote"],
)
def test_segments_become_columns(pattern, columns):
    def shown(parts):
        return "".join("{" + v + "}" if kind == "field" else v for kind, v in parts)

    assert [(c.name, shown(c.parts)) for c in parse_time_pattern(pattern)] == columns


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
