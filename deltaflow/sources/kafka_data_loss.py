"""Kafka offsets the broker no longer holds: Spark's ``failOnDataLoss`` for deltaflow's source.

Before a batch is planned, each partition's next offset to read (Spark's checkpoint, or the
table's progress after a lost checkpoint) is compared with the broker's watermarks:

* **beyond the latest offset**: the partition's offsets went back. The topic was deleted and
  re-created under its name (its offsets start again at 0); reading on from the stored offset
  would skip every message the new topic gets below it.
* **below the earliest offset**: the messages aged out (retention, ``delete_records``) before
  the pipeline read them.

With ``fail_on_data_loss`` (the default) the query stops with :class:`KafkaDataLossError`,
naming the topic, partition, stored offset and watermarks; nothing is written. Without it the
partition restarts at the broker's earliest offset, and the decision travels with the batch's
end offsets (``delta.progress.DATA_LOSS_KEY``) through Spark's offset log: ``partitions()``,
the sinks (the commit's ``deltaflow.kafka_data_loss`` metadata, the partition's progress
moved back after a re-created topic) and the metrics (``deltaflow_source_data_loss_total``,
from the progress report) all read the same record, and a replayed batch repeats it exactly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from deltaflow.delta.progress import AGED_OUT, WENT_BACK, DataLoss
from deltaflow.errors import KafkaDataLossError

__all__ = ["check_partition", "log_restarts"]

logger = logging.getLogger(__name__)

#: How to turn the check off, in every form the option takes.
_SWITCH = (
    "fail_on_data_loss false (deltaflow ingest --fail_on_data_loss false or FAIL_ON_DATA_LOSS=false, "
    "the YAML source key fail_on_data_loss, the Spark option failOnDataLoss)"
)


def check_partition(
    topic: str, partition: int | str, stored: int, earliest: int, latest: int, *, fail: bool
) -> DataLoss | None:
    """The decision for a partition whose next offset to read is ``stored``, given the broker's
    watermarks: ``None`` when the broker holds it, else the record of the restart at
    ``earliest``.

    Raises:
        KafkaDataLossError: with ``fail``, when the broker does not hold ``stored``.
    """
    if earliest <= stored <= latest:
        return None
    reason = WENT_BACK if stored > latest else AGED_OUT
    record: DataLoss = {
        "reason": reason,
        "stored": stored,
        "restart": earliest,
        "earliest": earliest,
        "latest": latest,
    }
    if fail:
        raise KafkaDataLossError(
            f"{_what(topic, partition, record)}. Nothing was written. To read on from the broker's "
            f"earliest offset {earliest} instead (logged, and recorded in the commit), set {_SWITCH}",
            topic=topic,
            partition=int(partition),
            stored_offset=stored,
            earliest_offset=earliest,
            latest_offset=latest,
            reason=reason,
        )
    return record


def log_restarts(lost: Mapping[str, Mapping[str, DataLoss]], *, planned: bool = True) -> None:
    """One WARN line per partition restarted at the earliest offset (``fail_on_data_loss``
    false): by a planned batch (recorded in its commit), or by a task that found its range gone
    while reading (retention ran after planning: only this line and the task's log tell)."""
    for topic, parts in lost.items():
        for partition, record in parts.items():
            logger.warning(
                "%s; fail_on_data_loss is false: the partition %s at the broker's earliest offset %d%s",
                _what(topic, partition, record),
                "restarts" if planned else "is read on",
                record["restart"],
                " (recorded in the batch's commit as deltaflow.kafka_data_loss)"
                if planned
                else " by the task reading it (the range aged out after the batch was planned)",
            )


def _what(topic: str, partition: int | str, record: DataLoss) -> str:
    stored, earliest, latest = record["stored"], record["earliest"], record["latest"]
    where = (
        f"Kafka topic {topic!r} partition {partition}: the pipeline's next offset is {stored}, but the "
        f"broker's offsets run from {earliest} (earliest) to {latest} (latest)"
    )
    if record["reason"] == WENT_BACK:
        return (
            f"{where}: its offsets went back, most likely because the topic was deleted "
            f"and re-created under its name; reading on from {stored} would skip every message the "
            f"new topic gets below offset {stored}"
        )
    return (
        f"{where}: offsets {stored} to {earliest - 1} ({earliest - stored} message(s)) "
        "are gone from the broker, most likely removed by retention (retention.ms, retention.bytes) "
        "or delete_records before the pipeline read them"
    )
