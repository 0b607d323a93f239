pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.readers",
    "tests.fixtures.kafka",
    "tests.fixtures.registry",
    "tests.fixtures.postgres",
    "tests.fixtures.s3",
    "tests.fixtures.azure",
]

#: The test files that take longest (seconds of their tests in a clean-clone run of the suite
#: with ``--durations=0``, 2026-11-28: 308 s for the first ... 31 s for the last), longest first.
#: ``scripts/test.sh`` hands the two xdist workers whole files in collection order
#: (``--dist loadfile --no-loadscope-reorder``); these go first, so the files left for the end
#: are short and the two workers finish together. Without it xdist sends the files with the
#: most tests first, which puts the crash tests (a few long tests each) last: one worker then
#: ran a long file alone for a minute and a half. A stale list costs balance, never a result.
LONGEST_FIRST = (
    "integration/test_faults.py",
    "service/test_engine.py",
    "integration/test_exactly_once.py",
    "service/test_stops.py",
    "sources/test_kafka_exactly_once.py",
    "integration/test_storage.py",
    "pipeline/test_ingest_dead_letters.py",
    "pipeline/test_cdc_pipeline.py",
    "sources/test_kafka_ingest.py",
    "pipeline/test_ingest.py",
    "integration/test_cluster.py",
    "service/test_status.py",
    "sources/test_files.py",
    "pipeline/test_ingest_kdi.py",
    "cli/test_main.py",
    "sinks/test_merge.py",
    "integration/test_soak.py",
    "pipeline/test_delta_format.py",
    "pipeline/test_runner.py",
    "integration/test_topic_ingest_faults.py",
    "pipeline/test_declarative_pipeline.py",
    "pipeline/test_class_cache.py",
    "service/test_daemon.py",
    "pipeline/test_debezium_mirror_attacks.py",
    "pipeline/test_topic_ingest.py",
    "sinks/test_datasource.py",
    "pipeline/test_session.py",
    "pipeline/test_engine_parity.py",
    "cli/test_commands.py",
    "test_readme.py",
    "pipeline/test_delta_format_connect.py",
)


def pytest_collection_modifyitems(items: list) -> None:  # type: ignore[type-arg]
    """Run the files of :data:`LONGEST_FIRST` first, in that order; the rest keep theirs."""
    rank = {f"tests/{name}": i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
