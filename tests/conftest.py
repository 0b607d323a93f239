pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.readers",
    "tests.fixtures.kafka",
    "tests.fixtures.registry",
    "tests.fixtures.postgres",
    "tests.fixtures.s3",
    "tests.fixtures.azure",
]
