"""Table templates: ``{topic}`` and the pattern's groups, checked before anything is written."""

from __future__ import annotations

import pytest

from deltaflow.config.ingest import IngestConfig
from deltaflow.config.table_template import TableTemplate, static_prefix
from deltaflow.errors import ConfigError


def test_a_template_renders_the_topic_and_the_groups():
    t = TableTemplate.of("/lake/{1}/{2}_{topic}", pattern=r"db\.(\w+)\.(.*)", several=True)
    assert t.render("db.inventory.orders") == "/lake/inventory/orders_db.inventory.orders"
    assert t.render("other.topic") is None  # the pattern does not take it
    assert (
        TableTemplate.of("s3://b/{topic}", pattern=None, several=True).render("a-b.c_d") == "s3://b/a-b.c_d"
    )
    # A group that matched nothing names no table.
    assert TableTemplate.of("/l/{1}", pattern=r"x(.*)", several=True).render("x") is None


@pytest.mark.parametrize(
    ("text", "pattern", "several", "match"),
    [
        ("/lake/t", r"a\..*", True, r"one table for several topics: put \{topic\}"),
        ("/lake/{name}", None, True, r"unknown placeholder \{name\}"),
        ("/lake/{2}", r"a\.(.*)", True, r"uses \{2\}, but --topic_pattern 'a\\\\.\(\.\*\)' has 1 group"),
        ("/lake/{1}", None, True, r"the topics are listed, not matched: use \{topic\}"),
        ("/lake/{topic", None, True, "unknown placeholder brace"),
    ],
    ids=["no-placeholder", "unknown", "group-beyond-pattern", "group-without-pattern", "unclosed"],
)
def test_bad_templates_are_refused(text, pattern, several, match):
    with pytest.raises(ConfigError, match=match):
        TableTemplate.of(text, pattern=pattern, several=several)


def test_the_checkpoint_lives_beside_the_tables():
    assert static_prefix("/lake/bronze/{topic}") == "/lake/bronze"
    assert static_prefix("/lake/bronze/t_{topic}/x") == "/lake/bronze"


def test_ingest_config_checks_topics_and_templates(tmp_path):
    base = {"pipeline_id": "p", "brokers": "127.0.0.1:1"}
    many = IngestConfig.build(topic="a,b", table_uri=str(tmp_path / "{topic}"), **base)
    assert many.several_topics and many.topics == ("a", "b")
    pattern = IngestConfig.build(topic_pattern=r"a\.(.*)", table_uri=str(tmp_path / "{1}"), **base)
    assert pattern.several_topics
    one = IngestConfig.build(topic="orders", table_uri=str(tmp_path / "{topic}"), **base).for_one_topic()
    assert one.table_uri == str(tmp_path / "orders") and not one.several_topics
    for values, match in [
        ({"topic": "a,b", "table_uri": str(tmp_path / "t")}, "one table for several topics"),
        ({"table_uri": str(tmp_path / "{topic}")}, "give a TOPIC"),
        ({"topic": "a", "topic_pattern": "a", "table_uri": "/t"}, "not both"),
        ({"topic_pattern": "(", "table_uri": "/t/{topic}"}, "not a regular expression"),
        ({"topic": "a,b", "table_uri": "/t/{topic}", "seek_offsets": {"0": 1}}, "--seek_offsets"),
        ({"topic": "a,b", "table_uri": "/t/{topic}", "dlq_table_location": "/d/{1}"}, "listed, not matched"),
    ]:
        with pytest.raises(ConfigError, match=match):
            IngestConfig.build(**values, **base)
