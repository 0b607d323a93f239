"""Everything the commands print: JSON for scripts (``--json``), text for people, progress, and
notes on standard error (records with ``--log-format json``)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from deltaflow.service.daemon import RunSummary

__all__ = ["ProgressLine", "emit", "note", "print_rows", "progress_shown", "run_summary", "size", "verbose"]

logger = logging.getLogger(__name__)


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


def run_summary(name: str, summary: RunSummary) -> str:
    """A pipeline's closing line: what its sinks committed, per table, then what it read.

    ``pages: 27 row(s) committed to /lake/pages (30 row(s) read in 1 batch(es))``; a files
    source reads files: ``(2 file(s) read in 2 batch(es))``.
    """
    unit = summary.committed_unit
    tables = [f"{rows:,} {unit} committed to {table}" for table, rows in summary.committed.items()]
    committed = ", ".join(tables) or f"0 {unit} committed"
    restarts = f", {summary.restarts} restart(s)" if summary.restarts else ""
    read = f"{summary.messages:,} {summary.unit} read in {summary.batches} batch(es)"
    return f"{name}: {committed} ({read}{restarts})"


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


def note(text: str, *, level: int = logging.INFO) -> None:
    """A line for the person running the command, on standard error (beside the results on
    standard output): a record at ``level`` with ``--log-format json``."""
    if _root_option("log_format") == "json":
        logger.log(level, "%s", text)
    else:
        click.echo(text, err=True)


def progress_shown() -> bool:
    """Whether a :class:`ProgressLine` may be drawn: on a terminal, and not between JSON lines."""
    return sys.stderr.isatty() and _root_option("log_format") != "json"


def verbose() -> bool:
    """Whether ``deltaflow -v`` (``--verbose``) was given to the command running now."""
    return bool(_root_option("verbose"))


def _root_option(name: str) -> object:
    """An option of the ``deltaflow`` group for the command running now (None outside one)."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else (ctx.find_root().obj or {}).get(name)
