"""Row-level changes of a table on delta-rs: MERGE, DELETE and UPDATE, each ONE commit under the
commit rule (:func:`deltaflow.delta.commit.commit`: an error after which the commit may have
landed is resolved by reading the log, never by doing the work twice).

Conditions and expressions are SQL strings, evaluated by delta-rs (DataFusion's SQL: the common
Spark SQL of comparisons, ``AND``/``OR``, arithmetic, literals and casts reads the same).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from deltaflow._version import __version__
from deltaflow.config.locations import normalize_uri
from deltaflow.errors import ConfigError
from deltaflow.ops.table import open_table

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["MergeClause", "delete", "merge", "update"]

#: delta-rs errors that say the statement itself is wrong (an unknown column, bad SQL, a type
#: that does not fit): retrying cannot help, although delta-rs calls them "Generic" errors.
_STATEMENT_ERROR = re.compile(
    r"Schema error|No field named|SQL error|ParserError|Error during planning|Type mismatch|"
    r"cannot be cast|Cannot cast|Invalid (argument|expression)|not found in schema",
    re.IGNORECASE,
)

ClauseKind = Literal[
    "matched_update",
    "matched_update_all",
    "matched_delete",
    "not_matched_insert",
    "not_matched_insert_all",
    "not_matched_by_source_update",
    "not_matched_by_source_delete",
]


@dataclass(frozen=True)
class MergeClause:
    """One ``WHEN`` of a MERGE, in the order given (the first whose condition holds applies)."""

    kind: ClauseKind
    condition: str | None = None
    #: ``matched_update`` / ``not_matched_by_source_update``: column -> expression;
    #: ``not_matched_insert``: column -> expression of the new row.
    values: Mapping[str, str] = field(default_factory=dict)


def _run(uri: str, storage_options: Mapping[str, str] | None, what: str, attempt: Any) -> dict[str, Any]:
    from deltalake.exceptions import DeltaError

    from deltaflow.delta import commit

    table_uri = normalize_uri(uri)
    open_table(table_uri, storage_options)  # a clear error for a missing table
    try:
        outcome = commit.commit(
            table_uri,
            storage_options or {},
            attempt,
            what=f"{what} of {table_uri}",
            metadata={"deltaflow.version": __version__},
            terminal=lambda exc: commit.is_terminal(exc) or bool(_STATEMENT_ERROR.search(str(exc))),
        )
    except DeltaError as exc:  # an unknown column, a type mismatch: retrying cannot help
        raise ConfigError(
            f"{what} of {table_uri!r} failed: {exc}; nothing was committed", table_uri=table_uri
        ) from exc
    return dict(outcome.value or outcome.info.get("operationMetrics") or {})


def merge(
    uri: str,
    source: pa.Table,
    *,
    condition: str,
    clauses: Sequence[MergeClause],
    source_alias: str = "source",
    target_alias: str | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """MERGE ``source`` into the table; returns delta-rs' metrics (``num_target_rows_inserted``...).

    Raises:
        ConfigError: no clause, or delta-rs refused the statement (nothing committed).
    """
    if not clauses:
        raise ConfigError("a merge needs at least one whenMatched / whenNotMatched clause")

    def attempt(table: Any, props: Any) -> Any:
        builder = table.merge(
            source,
            predicate=condition,
            source_alias=source_alias,
            target_alias=target_alias,
            commit_properties=props,
        )
        for clause in clauses:
            values = dict(clause.values)
            if clause.kind == "matched_update":
                builder = builder.when_matched_update(updates=values, predicate=clause.condition)
            elif clause.kind == "matched_update_all":
                builder = builder.when_matched_update_all(predicate=clause.condition)
            elif clause.kind == "matched_delete":
                builder = builder.when_matched_delete(predicate=clause.condition)
            elif clause.kind == "not_matched_insert":
                builder = builder.when_not_matched_insert(updates=values, predicate=clause.condition)
            elif clause.kind == "not_matched_insert_all":
                builder = builder.when_not_matched_insert_all(predicate=clause.condition)
            elif clause.kind == "not_matched_by_source_update":
                builder = builder.when_not_matched_by_source_update(
                    updates=values, predicate=clause.condition
                )
            else:
                builder = builder.when_not_matched_by_source_delete(predicate=clause.condition)
        return builder.execute()

    return _run(uri, storage_options, "merge", attempt)


def delete(
    uri: str, condition: str | None = None, *, storage_options: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Delete the rows where ``condition`` holds (every row without one)."""
    return _run(
        uri, storage_options, "delete", lambda table, props: table.delete(condition, commit_properties=props)
    )


def update(
    uri: str,
    values: Mapping[str, str],
    condition: str | None = None,
    *,
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Set ``values`` (column -> SQL expression) in the rows where ``condition`` holds."""
    if not values:
        raise ConfigError("an update needs set={column: expression, ...}")
    return _run(
        uri,
        storage_options,
        "update",
        lambda table, props: table.update(updates=dict(values), predicate=condition, commit_properties=props),
    )
