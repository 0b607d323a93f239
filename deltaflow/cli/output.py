"""Everything the commands print: JSON for scripts (``--json``), text for people, progress."""

from __future__ import annotations

import json
from collections.abc import Callable

import click

__all__ = ["ProgressLine", "emit", "print_rows", "size", "verbose"]


class ProgressLine:
    """A one-line progress bar on a terminal (``--ends-at-latest-offsets`` backfills, footers
    read by ``add-files``)."""

    WIDTH = 30

    def __init__(self, unit: str = "messages", rate_unit: str = "msgs") -> None:
        self._shown = False
        self.unit = unit
        self.rate_unit = rate_unit

    @classmethod
    def render(
        cls, done: int, left: int, rate: float, unit: str = "messages", rate_unit: str = "msgs"
    ) -> str:
        total = done + left
        fraction = done / total if total else 1.0
        filled = int(cls.WIDTH * fraction)
        eta = f", ~{left / rate:.0f} s left" if left and rate else ""
        return (
            f"[{'#' * filled}{'.' * (cls.WIDTH - filled)}] {fraction:4.0%} "
            f"{done:,}/{total:,} {unit}, {rate:,.0f} {rate_unit}/s{eta}"
        )

    def show(self, done: int, left: int, rate: float) -> None:
        line = self.render(done, left, rate, self.unit, self.rate_unit)
        click.echo("\r" + line.ljust(100), nl=False, err=True)
        self._shown = True

    def close(self) -> None:
        if self._shown:
            click.echo("", err=True)


def emit(as_json: bool, value: object, text: Callable[[], None]) -> None:
    """Print ``value`` as JSON with ``--json``, else call ``text`` (the command's own lines)."""
    if as_json:
        from deltaflow.ops.table import to_jsonable

        click.echo(json.dumps(to_jsonable(value), indent=2, default=str))
    else:
        text()


def size(n: int | None) -> str:
    """Bytes for people: ``12.3 MiB``."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"  # pragma: no cover


def print_rows(table: object) -> None:
    """An Arrow table as aligned text rows."""
    import pyarrow as pa

    assert isinstance(table, pa.Table)
    if table.num_rows == 0:
        click.echo(f"(no rows; columns: {', '.join(table.column_names)})")
        return
    frame = table.to_pandas()
    click.echo(frame.to_string(index=False, max_colwidth=60))
    click.echo(f"({table.num_rows} row(s))")


def verbose() -> bool:
    """Whether ``deltaflow -v`` (``--verbose``) was given to the command running now."""
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and (ctx.find_root().obj or {}).get("verbose"))
