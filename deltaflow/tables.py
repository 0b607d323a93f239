"""delta-spark's ``delta.tables`` module, served by deltaflow: ``from deltaflow.tables import
DeltaTable`` is the only line a job written for delta-spark changes (see
:mod:`deltaflow.pipeline.delta_table` for what it does and what differs)."""

from deltaflow.pipeline.delta_table import DeltaMergeBuilder, DeltaOptimizeBuilder, DeltaTable

__all__ = ["DeltaMergeBuilder", "DeltaOptimizeBuilder", "DeltaTable"]
