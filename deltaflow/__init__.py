"""deltaflow: exactly-once streaming into Delta Lake tables with PySpark.

Quick start::

    import deltaflow
    spark = deltaflow.spark_session()
    df = spark.readStream.format("rate").load()
    q = deltaflow.write_stream(df, "/tmp/events", pipeline_id="rate-demo")
"""

from __future__ import annotations

__version__ = "0.1.0"

from typing import TYPE_CHECKING, Any

from deltaflow.config import SinkOptions
from deltaflow.exceptions import (
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
    from deltaflow.api import register, write, write_stream
    from deltaflow.session import spark_session

# pyspark is imported on first use of these, so `import deltaflow` (and the CLI) stay fast.
_LAZY = {
    "register": "deltaflow.api",
    "write": "deltaflow.api",
    "write_stream": "deltaflow.api",
    "spark_session": "deltaflow.session",
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
