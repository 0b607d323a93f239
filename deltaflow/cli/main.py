"""The ``deltaflow`` command group and its one error boundary.

Each command lives in the module of its group (``demo``, ``ingest``, ``pipelines``, ``tables``,
``status``); shared options in ``options``, everything printed in ``output``. Commands import
pyspark inside their bodies, so ``--help`` and ``validate`` start no JVM.
"""

from __future__ import annotations

import logging
import sys

import click

from deltaflow._version import __version__
from deltaflow.cli.demo import demo
from deltaflow.cli.ingest import ingest
from deltaflow.cli.pipelines import run, sql, validate
from deltaflow.cli.status import status
from deltaflow.cli.tables import (
    add_files,
    changes,
    checkpoint,
    convert,
    describe,
    history,
    optimize,
    properties,
    read,
    restore,
    vacuum,
)
from deltaflow.errors import DeltaflowError, TerminalError
from deltaflow.io import logs

__all__ = ["ENV_PREFIX", "EXIT_TERMINAL", "EXIT_TRANSIENT", "cli", "main"]

#: Exit codes: 0 ok, 1 a failure that may pass on retry, 2 bad input or configuration.
EXIT_TRANSIENT = 1
EXIT_TERMINAL = 2


#: Every option without an environment variable of its own (kafka-delta-ingest's names for
#: ``ingest``, ``DELTAFLOW_SPARK_MASTER``, ...) reads ``DELTAFLOW_<COMMAND>_<OPTION>``, e.g.
#: ``DELTAFLOW_VACUUM_RETENTION_HOURS``; ``--help`` shows each one.
ENV_PREFIX = "DELTAFLOW"


@click.group(
    context_settings={
        "help_option_names": ["-h", "--help"],
        "show_default": True,
        "auto_envvar_prefix": ENV_PREFIX,
    }
)
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
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, format=logs.FORMAT)
    logs.export_level(level)  # Spark's Python workers log at it too
    for noisy in ("py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("py4j.clientserver").addFilter(logs.StopInterruptFilter())


for _command in (
    demo,
    ingest,
    validate,
    run,
    sql,
    optimize,
    vacuum,
    checkpoint,
    history,
    describe,
    restore,
    properties,
    read,
    changes,
    add_files,
    convert,
    status,
):
    cli.add_command(_command)
    for _param in _command.params:
        if isinstance(_param, click.Option):
            _param.show_envvar = True  # every flag's variable is listed in --help


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
    except Exception as exc:
        from deltaflow.delta.log import is_delta_rs_error

        if verbose or not is_delta_rs_error(exc):
            raise
        click.echo(f"error: delta-rs: {exc}", err=True)  # e.g. a commit that lost a race
        sys.exit(EXIT_TRANSIENT)
