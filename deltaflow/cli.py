"""The ``deltaflow`` command line. Thin: parsing and output only; the work lives in modules.

pyspark is imported inside the commands that need it, so ``--help`` is instant.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from deltaflow import __version__
from deltaflow.exceptions import DeltaflowError, TerminalError

__all__ = ["main"]

#: Exit codes: 0 ok, 1 a failure that may pass on retry, 2 bad input or configuration.
EXIT_TRANSIENT = 1
EXIT_TERMINAL = 2


@click.group(context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="deltaflow")
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    envvar="DELTAFLOW_VERBOSE",
    show_envvar=True,
    help="Debug logging and full tracebacks.",
)
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """deltaflow: exactly-once streaming into Delta Lake tables with PySpark."""
    ctx.obj = {"verbose": verbose}
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@cli.command()
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-output"),
    envvar="DELTAFLOW_DEMO_WORKDIR",
    show_envvar=True,
    help="Folder for the landing files and the Delta table (recreated).",
)
@click.option(
    "--events",
    type=click.IntRange(min=1),
    default=300_000,
    envvar="DELTAFLOW_DEMO_EVENTS",
    show_envvar=True,
    help="JSON events to generate.",
)
@click.option(
    "--files",
    type=click.IntRange(min=1),
    default=12,
    envvar="DELTAFLOW_DEMO_FILES",
    show_envvar=True,
    help="Landing files to spread the events over.",
)
@click.option(
    "--files-per-batch",
    type=click.IntRange(min=1),
    default=3,
    envvar="DELTAFLOW_DEMO_FILES_PER_BATCH",
    show_envvar=True,
    help="Landing files per micro-batch (Spark's maxFilesPerTrigger).",
)
@click.option(
    "--spark-master",
    default=None,
    envvar="DELTAFLOW_SPARK_MASTER",
    show_envvar=True,
    help="Spark master URL [default: local[*]].",
)
def demo(workdir: Path, events: int, files: int, files_per_batch: int, spark_master: str | None) -> None:
    """Generate JSON events, stream them into a local Delta table, print the result."""
    from deltaflow.demo import run_demo

    result = run_demo(
        workdir,
        events=events,
        files=files,
        files_per_batch=files_per_batch,
        master=spark_master,
        echo=click.echo,
    )
    if result.rows != events or result.distinct_ids != events:
        raise click.ClickException("the table does not hold every event exactly once")


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the CLI and maps exceptions to exit codes and short messages."""
    verbose = "-v" in (argv or sys.argv) or "--verbose" in (argv or sys.argv)
    try:
        cli.main(args=argv, prog_name="deltaflow", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except DeltaflowError as exc:
        if verbose:
            raise
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_TERMINAL if isinstance(exc, TerminalError) else EXIT_TRANSIENT)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
