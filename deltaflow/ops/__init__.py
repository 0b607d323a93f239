"""Table maintenance on delta-rs, one module per operation; every function takes a table URI
(and storage options), works without Spark, and returns typed results the CLI prints.

Guards refuse what would lose data: a vacuum below the table's retention, a restore to a
version whose files are gone. ``compaction`` runs ``optimize`` and ``vacuum`` beside a stream.
"""

from deltaflow.ops.add_files import AddedFile, AddFilesResult, add_files, convert
from deltaflow.ops.checkpoint import checkpoint
from deltaflow.ops.inspect import SMALL_FILE_SIZE, changes, describe, history, read
from deltaflow.ops.optimize import OptimizeResult, optimize, parse_partition_predicate
from deltaflow.ops.properties import properties
from deltaflow.ops.restore import RestoreResult, restore
from deltaflow.ops.table import open_table, to_jsonable
from deltaflow.ops.vacuum import DEFAULT_RETENTION, VacuumResult, retention, vacuum

__all__ = [
    "AddFilesResult",
    "AddedFile",
    "DEFAULT_RETENTION",
    "OptimizeResult",
    "RestoreResult",
    "SMALL_FILE_SIZE",
    "VacuumResult",
    "add_files",
    "changes",
    "checkpoint",
    "convert",
    "describe",
    "history",
    "open_table",
    "optimize",
    "parse_partition_predicate",
    "properties",
    "read",
    "restore",
    "retention",
    "to_jsonable",
    "vacuum",
]
