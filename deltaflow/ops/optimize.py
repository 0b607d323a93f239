"""``optimize``: compact small files (bin-packing) or Z-order them, per partition predicate."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.config.units import parse_size
from deltaflow.errors import ConfigError
from deltaflow.ops.table import open_table

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable

__all__ = ["OptimizeResult", "optimize", "parse_partition_predicate"]

logger = logging.getLogger(__name__)


_TERM = re.compile(
    r"^\s*(`[^`]+`|[A-Za-z_][A-Za-z0-9_]*)\s*(==|=|!=|<>|<=|>=|<|>|not\s+in\b|in\b)\s*(.+?)\s*$",
    re.IGNORECASE | re.DOTALL,
)


def parse_partition_predicate(text: str, partition_columns: Sequence[str]) -> list[tuple[str, str, Any]]:
    """delta-rs partition filters from ``"date = '2026-11-22' AND country IN ('DE', 'FR')"``.

    Only partition columns, joined with AND; operators ``= != < <= > >= IN NOT IN``.
    """
    if not partition_columns:
        raise ConfigError("--where selects partitions, and this table has no partition columns")
    filters: list[tuple[str, str, Any]] = []
    for term in _split_and(text):
        m = _TERM.match(term)
        if m is None:
            raise ConfigError(
                f"cannot read {term.strip()!r} in the partition predicate {text!r}; use "
                "column = 'value' or column IN ('a', 'b'), joined with AND",
                predicate=text,
            )
        column = m.group(1).strip("`")
        if column not in partition_columns:
            raise ConfigError(
                f"{column!r} in --where is not a partition column; partition columns: "
                f"{', '.join(partition_columns)}",
                predicate=text,
            )
        op = " ".join(m.group(2).lower().split())
        op = {"==": "=", "<>": "!="}.get(op, op)
        raw = m.group(3).strip()
        if op in ("in", "not in"):
            if not (raw.startswith("(") and raw.endswith(")")):
                raise ConfigError(f"{op.upper()} needs a list in parentheses: {term.strip()!r}")
            filters.append((column, op, [_literal(v) for v in _split_commas(raw[1:-1])]))
        else:
            filters.append((column, op, _literal(raw)))
    return filters


def _split_and(text: str) -> list[str]:
    parts, current, quoted = [], [], False
    tokens = re.split(r"(\s+and\s+|')", text, flags=re.IGNORECASE)
    for token in tokens:
        if token == "'":
            quoted = not quoted
            current.append(token)
        elif not quoted and re.fullmatch(r"\s+and\s+", token, flags=re.IGNORECASE):
            parts.append("".join(current))
            current = []
        else:
            current.append(token)
    parts.append("".join(current))
    if quoted:
        raise ConfigError(f"unbalanced quote in the partition predicate {text!r}")
    return [p for p in parts if p.strip()]


def _split_commas(text: str) -> list[str]:
    out, current, quoted = [], "", False
    for ch in text:
        if ch == "'":
            quoted = not quoted
        if ch == "," and not quoted:
            out.append(current)
            current = ""
        else:
            current += ch
    out.append(current)
    return [v for v in out if v.strip()]


_QUOTED = re.compile(r"^'((?:[^']|'')*)'$")


_BARE = re.compile(r"^[A-Za-z0-9_.:+\-]+$")


def _literal(raw: str) -> str:
    raw = raw.strip()
    if (m := _QUOTED.match(raw)) is not None:
        return m.group(1).replace("''", "'")
    if _BARE.match(raw):
        return raw
    raise ConfigError(
        f"cannot read the value {raw!r} in --where; quote text values ('2026-11-22') and join terms with AND",
        value=raw,
    )


@dataclass(frozen=True)
class OptimizeResult:
    """What ``optimize`` did (delta-rs metrics, condensed)."""

    table_uri: str
    mode: str  # "compact" or "zorder"
    files_removed: int
    files_added: int
    bytes_removed: int
    bytes_added: int
    partitions_optimized: int
    version: int
    metrics: dict[str, Any] = field(default_factory=dict)


def optimize(
    uri: str,
    *,
    where: str | None = None,
    zorder: Sequence[str] = (),
    target_size: int | str | None = None,
    storage_options: Mapping[str, str] | None = None,
    lock_timeout_s: float = 300.0,
) -> OptimizeResult:
    """Bin-pack small files (or Z-order by ``zorder``) into files of about ``target_size``.

    Optimization commits with ``dataChange=false``: streams reading the table skip it, and it
    does not conflict with concurrent appends (DELTA_NOTES). It runs under the table's
    compaction lease (``deltaflow.delta.leases``), waiting up to ``lock_timeout_s`` for a running
    compaction, so that two never rewrite the same files.

    Raises:
        LeaseHeldError: another compaction kept the lease for ``lock_timeout_s``.
    """
    from deltaflow.delta.leases import compaction_lease

    open_table(uri, storage_options)  # a clear error for a missing table before any lease
    with compaction_lease(normalize_uri(uri), storage_options or {}, wait_s=lock_timeout_s):
        return _optimize(
            uri, where=where, zorder=zorder, target_size=target_size, storage_options=storage_options
        )


def _optimize(
    uri: str,
    *,
    where: str | None,
    zorder: Sequence[str],
    target_size: int | str | None,
    storage_options: Mapping[str, str] | None,
) -> OptimizeResult:
    table = open_table(uri, storage_options)
    meta = table.metadata()
    filters = parse_partition_predicate(where, meta.partition_columns) if where else None
    size = parse_size(target_size) if target_size is not None else None
    if zorder:
        names = [f.name for f in table.schema().fields]
        for column in zorder:
            if column not in names:
                raise ConfigError(
                    f"--zorder column {column!r} is not in the table; columns: {', '.join(names)}"
                )
            if column in meta.partition_columns:
                raise ConfigError(f"--zorder column {column!r} is a partition column; Z-order data columns")
    from deltaflow.delta import commit

    def attempt(table: DeltaTable | None, props: CommitProperties) -> dict[str, Any]:
        assert table is not None  # opened above
        if zorder:
            return dict(
                table.optimize.z_order(
                    list(zorder), partition_filters=filters, target_size=size, commit_properties=props
                )
            )
        return dict(
            table.optimize.compact(partition_filters=filters, target_size=size, commit_properties=props)
        )

    outcome = commit.commit(
        normalize_uri(uri),
        storage_options or {},
        attempt,
        what=f"optimize of {normalize_uri(uri)}",
        metadata={"deltaflow.operation": "zorder" if zorder else "compact"},
    )
    metrics = dict(outcome.value or outcome.info.get("operationMetrics") or {})
    table = open_table(uri, storage_options)
    added = json.loads(metrics.get("filesAdded") or "{}")
    removed = json.loads(metrics.get("filesRemoved") or "{}")
    result = OptimizeResult(
        table_uri=normalize_uri(uri),
        mode="zorder" if zorder else "compact",
        files_removed=int(metrics.get("numFilesRemoved", 0)),
        files_added=int(metrics.get("numFilesAdded", 0)),
        bytes_removed=int(removed.get("totalSize", 0)),
        bytes_added=int(added.get("totalSize", 0)),
        partitions_optimized=int(metrics.get("partitionsOptimized", 0)),
        version=table.version(),
        metrics=dict(metrics),
    )
    logger.info(
        "optimized %s: %d file(s) (%d bytes) -> %d file(s) (%d bytes), table version %d",
        result.table_uri,
        result.files_removed,
        result.bytes_removed,
        result.files_added,
        result.bytes_added,
        result.version,
    )
    return result
