"""The ``deltaflow`` command group and its one error boundary.

Each command lives in the module of its group (``demo``, ``ingest``, ``pipelines``, ``tables``,
``status``); shared options in ``options``, everything printed in ``output``. Commands import
pyspark inside their bodies, so ``--help`` and ``validate`` start no JVM.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import NoReturn

import click

from deltaflow._version import __version__
from deltaflow.cli.demo import demo
from deltaflow.cli.engine import engine
from deltaflow.cli.ingest import ingest
from deltaflow.cli.options import REMOTE
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

logger = logging.getLogger(__name__)

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
@click.option(
    "--log-format",
    type=click.Choice(logs.FORMATS, case_sensitive=False),
    default="text",
    envvar=logs.FORMAT_ENV,
    show_envvar=True,
    help="json: standard error carries one JSON object per line (ts, level, logger, msg, exc; "
    "pipeline, batch, table where they apply): deltaflow's records, Spark's JVM (its "
    "structured logging) and its Python workers; any other line is wrapped into one.",
)
@REMOTE
@click.pass_context
def cli(ctx: click.Context, verbose: bool, log_format: logs.LogFormat) -> None:
    """deltaflow: exactly-once streaming into Delta Lake tables with PySpark."""
    process = bool(ctx.obj and ctx.obj.get(_PROCESS))
    ctx.obj = {"verbose": verbose, "log_format": log_format}
    level = logging.DEBUG if verbose else logging.INFO
    if log_format == "json":
        if process:  # the process's own stderr (not a test's): the JVM and its workers share it
            logs.relay_stderr()
        logs.configure_json(level)
    else:
        logging.basicConfig(level=level, format=logs.FORMAT)
    logs.export_level(level)  # Spark's Python workers log at it too
    logs.export_format(log_format)  # and so, with Spark's JVM
    for noisy in ("py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("py4j.clientserver").addFilter(logs.StopInterruptFilter())
    logging.getLogger().addFilter(logs.Py4JRetryFilter())


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
    engine,
):
    cli.add_command(_command)
    for _param in _command.params:
        if isinstance(_param, click.Option):
            _param.show_envvar = True  # every flag's variable is listed in --help


#: ``main`` runs the CLI as the process (its standard error is the process's, to relay).
_PROCESS = "process"


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the CLI and maps exceptions to exit codes and short messages (records
    with ``--log-format json``, as the group exported it or its variable says)."""
    verbose = "-v" in (argv or sys.argv) or "--verbose" in (argv or sys.argv)
    try:
        cli.main(args=argv, prog_name="deltaflow", standalone_mode=False, obj={_PROCESS: True})
    except click.exceptions.Abort:
        _fail("aborted", 130)
    except click.ClickException as exc:
        # A usage error may come before the group's callback exported the format it parsed.
        parsed = getattr(exc, "ctx", None)
        if parsed is not None and parsed.find_root().params.get("log_format") in logs.FORMATS:
            logs.export_format(parsed.find_root().params["log_format"])
        if logs.exported_format() != "json":
            exc.show()
            sys.exit(exc.exit_code)
        _fail(f"error: {exc.format_message()}", exc.exit_code)
    except DeltaflowError as exc:
        code = EXIT_TERMINAL if isinstance(exc, TerminalError) else EXIT_TRANSIENT
        if verbose and logs.exported_format() != "json":
            # -v: the traceback too, but the exit code stays deltaflow's (Python's 1 would tell
            # a service manager that a terminal failure is worth a restart).
            import traceback

            traceback.print_exc()
        _fail(f"error: {exc}", code, exc, traceback=verbose)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        from deltaflow.delta.log import is_delta_rs_error

        if verbose or not is_delta_rs_error(exc):
            if logs.exported_format() != "json":
                raise
            _fail(f"error: {type(exc).__name__}: {exc}", 1, exc, traceback=True)  # Python's exit code
        _fail(f"error: delta-rs: {exc}", EXIT_TRANSIENT)  # e.g. a commit that lost a race


def _fail(
    message: str, code: int, error: BaseException | None = None, *, traceback: bool = False
) -> NoReturn:
    """Say ``message`` on standard error and exit with ``code``; with ``--log-format json`` as a
    record carrying ``error``'s context and, with ``traceback``, its traceback."""
    if logs.exported_format() != "json":
        click.echo(message, err=True)
        sys.exit(code)
    if not logging.getLogger().handlers:  # failed before the group configured logging
        logs.configure_json(logging.INFO)
    # A deltaflow error's context (pipeline_id, batch_id, table_uri) as the record's fields.
    context = getattr(error, "context", None)
    context = context if isinstance(context, Mapping) else {}
    extra = {
        "pipeline": context.get("pipeline_id"),
        "batch": context.get("batch_id"),
        "table": context.get("table_uri"),
    }
    logger.error("%s", message, exc_info=error if traceback else None, extra=extra)
    sys.exit(code)
