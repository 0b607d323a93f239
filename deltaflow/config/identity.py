"""The one identity of a pipeline: ``pipeline_id``.

It is the Delta ``txn`` app id of every commit (so a replay is recognised), the name of the
default Spark checkpoint folder, the writer-epoch fence of the table and the ``pipeline`` label
of every metric. Changing it is a deliberate reset: the new id starts from the source's
starting position and does not see the old id's progress.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

__all__ = ["PIPELINE_ID_RULE", "PipelineId", "check_pipeline_id"]

#: It ends up in file names, checkpoint paths, txn app ids and metric labels.
_PIPELINE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: What a valid id looks like, for error messages.
PIPELINE_ID_RULE = "1-128 letters, digits, '_', '.' or '-', starting with a letter or digit"


def check_pipeline_id(value: str) -> str:
    """Return ``value`` when it is a valid pipeline id, else raise :class:`ValueError`."""
    if not _PIPELINE_ID.match(value):
        raise ValueError(f"must be {PIPELINE_ID_RULE}")
    return value


#: A pipeline id field of a config model.
PipelineId = Annotated[str, AfterValidator(check_pipeline_id)]
