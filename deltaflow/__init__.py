"""deltaflow: exactly-once streaming into Delta Lake tables with PySpark.

Quick start::

    import deltaflow
    spark = deltaflow.spark_session()
    df = spark.readStream.format("rate").load()
    q = deltaflow.write_stream(df, "/tmp/events", pipeline_id="rate-demo")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from deltaflow._version import __version__
from deltaflow.errors import (
    CheckpointMismatchError,
    CommitError,
    ConfigError,
    DeltaflowError,
    QueryFailedError,
    SchemaMismatchError,
    TableNotFoundError,
    TerminalError,
    TransientError,
    UnknownOptionError,
    WriteValidationError,
)

if TYPE_CHECKING:
    from deltaflow.config.sink import SinkOptions
    from deltaflow.pipeline.api import register, write, write_stream
    from deltaflow.pipeline.session import spark_session

# pyspark (and pydantic's larger models) are imported on first use of these, so `import
# deltaflow` stays fast: the CLI, and every Python process Spark starts that unpickles a
# deltaflow object (source planners, task workers) import it.
_LAZY = {
    "SinkOptions": "deltaflow.config.sink",
    "register": "deltaflow.pipeline.api",
    "write": "deltaflow.pipeline.api",
    "write_stream": "deltaflow.pipeline.api",
    "spark_session": "deltaflow.pipeline.session",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'deltaflow' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "CheckpointMismatchError",
    "CommitError",
    "ConfigError",
    "DeltaflowError",
    "QueryFailedError",
    "SchemaMismatchError",
    "SinkOptions",
    "TableNotFoundError",
    "TerminalError",
    "TransientError",
    "UnknownOptionError",
    "WriteValidationError",
    "__version__",
    "register",
    "spark_session",
    "write",
    "write_stream",
]
