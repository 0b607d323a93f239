"""``deltaflow status``: a running daemon's status page, or the health of tables."""

from __future__ import annotations

import json
from typing import Any

import click

from deltaflow.cli.options import JSON, STORAGE
from deltaflow.cli.output import emit, size

__all__ = ["status"]


@click.command()
@click.argument("table_uris", nargs=-1)
@click.option("--url", help="A running daemon's status page (its --status-port), e.g. http://127.0.0.1:8080.")
@click.option("--minutes", type=click.IntRange(min=1), default=15, help="Window for commits and throughput.")
@STORAGE
@JSON
def status(
    table_uris: tuple[str, ...],
    url: str | None,
    minutes: int,
    storage_options: dict[str, str],
    as_json: bool,
) -> None:
    """Pipelines and table health: from a running daemon (--url) or from tables' Delta logs."""
    from deltaflow.service import status as status_module

    if bool(url) == bool(table_uris):
        raise click.UsageError("give either TABLE_URI(s) or --url")
    if url:
        import urllib.request

        target = url.rstrip("/") + "/status.json"
        try:
            with urllib.request.urlopen(target, timeout=10) as response:
                data = json.load(response)
        except OSError as exc:
            raise click.ClickException(f"cannot read {target}: {exc}") from None
        emit(as_json, data, lambda: _print_daemon_status(data))
        return
    tables = [
        status_module.table_status(u, minutes=minutes, storage_options=storage_options) for u in table_uris
    ]

    def text() -> None:
        for info in tables:
            _print_table_status(info)

    emit(as_json, tables, text)


def _print_health(health: dict[str, Any] | None) -> None:
    if not health:
        click.echo("  table: not available yet")
        return
    last = health["last_compaction"]
    click.echo(
        f"  table: version {health['version']}, {health['files']} file(s) ({size(health['bytes'])}, "
        f"{health['rows']} rows), small {health['small_file_ratio']:.0%}, last compaction "
        + (f"version {last['version']} at {last['at']}" if last else "none")
    )


def _print_table_status(info: dict[str, Any]) -> None:
    click.echo(f"{info['table_uri']}")
    _print_health(info["table"])
    if not info["pipelines"]:
        click.echo("  no deltaflow pipeline commits in the last 1000 commits")
    for p in info["pipelines"]:
        last = p["last_commit"]
        click.echo(
            f"  pipeline {p['name']}: last batch {last['batch_id']} ({last['rows']} rows) at {last['at']} "
            f"(version {last['version']}); {p['commits_in_window']} commit(s), {p['rows_in_window']} rows in "
            f"{info['window_minutes']} min ({p['rows_per_second']} rows/s)"
        )


def _print_daemon_status(data: dict[str, Any]) -> None:
    for p in data["pipelines"]:
        batch = p["last_batch"]
        click.echo(f"{p['name']}: {p['state']} since {p['since']} ({p['restarts']} restart(s))")
        engine = f" ({p['engine']} engine)" if p.get("engine") else ""
        click.echo(f"  source {p['source']} -> {p['table_uri']}{engine}")
        click.echo(
            "  last batch "
            + (f"{batch['batch_id']}: {batch['rows']} rows at {batch['at']}" if batch else "-")
            + f"; {p['rows_last_minute']} rows in the last minute; lag {p['lag']}"
        )
        if p["error"]:
            click.echo(f"  error: {p['error']}")
        tables = p.get("tables") or []
        if len(tables) > 1:
            click.echo(f"  {len(tables)} tables:")
            for t in tables:
                lag = "" if t["lag"] is None else f", lag {t['lag']}"
                click.echo(
                    f"    {t['table_uri']}: {t['committed']} committed, last {t['last_commit'] or '-'}{lag}"
                )
            return
        _print_health(p["table"])
