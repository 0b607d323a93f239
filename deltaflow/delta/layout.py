"""The ``_deltaflow/`` folder inside a table: what deltaflow keeps next to the Delta log.

Readers ignore it (Delta readers skip paths that start with ``_``)::

    <table>/_deltaflow/
        checkpoints/<pipeline_id>/   Spark's checkpoint of a local table's stream (default)
        staging/<pipeline_id>/e<epoch>/<writer>/b<N>/
                                     files Spark wrote for ``write_path=spark`` before their
                                     commit moved them into the table; ``e<epoch>`` is the
                                     writer's claim (``commit.claim_writer``): vacuum never
                                     deletes a live claim's files, and removes old ones of
                                     others (a writer without a claim stages one level up)
        locks/<name>/                a lease: a small Delta table of its own (see ``leases``)
        registered/<id>.json         paths ``add-files`` / ``convert`` / a watch registered in
        registered/<id>.committed    place (written before their commit; the marker after it),
                                     see ``registered``
"""

from __future__ import annotations

import re

from deltaflow.config.locations import join

__all__ = [
    "REGISTERED_DIR",
    "STAGING_DIR",
    "STATE_DIR",
    "checkpoint_dir",
    "lock_dir",
    "staging_dir",
    "staging_epoch",
]

#: The folder itself.
STATE_DIR = "_deltaflow"
#: Staging area of ``write_path=spark``, relative to the table root.
STAGING_DIR = f"{STATE_DIR}/staging"
#: Records of files registered in place, relative to the table root.
REGISTERED_DIR = f"{STATE_DIR}/registered"
_CHECKPOINTS = f"{STATE_DIR}/checkpoints"
_LOCKS = f"{STATE_DIR}/locks"


def checkpoint_dir(table_root: str, pipeline_id: str) -> str:
    """The default Spark checkpoint of ``pipeline_id`` writing to the table at ``table_root``."""
    return join(table_root, _CHECKPOINTS, pipeline_id)


#: The staging folder level that names a writer's epoch. A writer folder is
#: ``<host>-<pid>-<random>``, which always holds a ``-``: never taken for an epoch.
_EPOCH_FOLDER = re.compile(r"^e([0-9]+)$")


def staging_dir(table_root: str, pipeline_id: str, writer: str, epoch: int | None = None) -> str:
    """Where one writer process of ``pipeline_id`` stages Spark-written files (under the
    folder of its writer ``epoch`` when it holds a claim)."""
    if epoch is None:
        return join(table_root, STAGING_DIR, pipeline_id, writer)
    return join(table_root, STAGING_DIR, pipeline_id, f"e{epoch}", writer)


def staging_epoch(parts: tuple[str, ...]) -> tuple[str, int] | None:
    """``(pipeline_id, epoch)`` of a path below the staging folder, given as its parts
    relative to it (``None`` for a writer that staged without a claim)."""
    if len(parts) < 3:
        return None
    m = _EPOCH_FOLDER.match(parts[1])
    return (parts[0], int(m.group(1))) if m else None


def lock_dir(table_root: str, name: str) -> str:
    """The lease table called ``name``."""
    return join(table_root, _LOCKS, name)
