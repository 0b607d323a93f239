"""``properties``: show, set and unset table properties (one commit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from deltaflow.config.locations import normalize_uri
from deltaflow.errors import ConfigError, DeltaflowError
from deltaflow.ops.table import open_table

if TYPE_CHECKING:
    from deltalake import CommitProperties, DeltaTable

    from deltaflow.delta.commit import Fence, RetryPolicy

__all__ = ["properties", "set_properties"]


def properties(
    uri: str,
    *,
    set_: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Set table properties (``delta.*`` keys are checked by delta-rs); return them all.

    Raises:
        ConfigError: an unknown ``delta.*`` key or bad value, or an ``unset`` (delta-rs 1.x
            has no operation that removes a property).
    """
    if unset:
        raise ConfigError(
            f"cannot unset {', '.join(unset)}: delta-rs (the library deltaflow commits with) has no "
            "operation that removes a table property. Set it to its default value instead, e.g. "
            "`deltaflow properties TABLE set delta.logRetentionDuration='interval 30 days'`",
        )
    table = open_table(uri, storage_options)
    if set_:
        try:
            # delta-rs checks delta.* keys only when told to, and then refuses every user key.
            delta_keys = {k: v for k, v in set_.items() if k.startswith("delta.")}
            user_keys = {k: v for k, v in set_.items() if not k.startswith("delta.")}
            for keys, strict in ((delta_keys, True), (user_keys, False)):
                if keys:
                    set_properties(uri, storage_options or {}, keys, strict=strict)
        except DeltaflowError:
            raise
        except Exception as exc:  # noqa: BLE001 - delta-rs reports bad keys/values as generic errors
            raise ConfigError(f"cannot set {dict(set_)} on {normalize_uri(uri)!r}: {exc}") from None
        table = open_table(uri, storage_options)
    return dict(table.metadata().configuration)


def set_properties(
    uri: str,
    storage_options: Mapping[str, str],
    keys: Mapping[str, str],
    *,
    strict: bool = False,
    fence: Fence | None = None,
    policy: RetryPolicy | None = None,
    what: str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Set ``keys`` on the table at ``uri`` in one commit under the commit rule (an unknown
    outcome is decided by reading the table's properties); ``strict``: delta-rs checks the keys
    (``delta.*`` ones only); ``fence``: a writer another process took over stops here."""
    from deltaflow.delta import commit

    def attempt(table: DeltaTable | None, props: CommitProperties) -> None:
        assert table is not None
        table.alter.set_table_properties(dict(keys), raise_if_not_exists=strict, commit_properties=props)

    def already_set(table: DeltaTable | None) -> bool:
        config = table.metadata().configuration if table is not None else {}
        return all(config.get(k) == v for k, v in keys.items())

    commit.commit(
        normalize_uri(uri),
        storage_options,
        attempt,
        what=what or f"setting properties of {normalize_uri(uri)}",
        metadata=metadata or {"deltaflow.operation": "set properties"},
        already_done=already_set,
        fence=fence,
        policy=policy or commit.RetryPolicy(),
    )
