"""``deltaflow validate``, ``run`` and ``sql``: declarative pipelines (YAML or SQL files)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from deltaflow.cli.options import (
    GIVE_UP_AFTER,
    METRICS_PORT,
    REMOTE,
    STALL_TIMEOUT,
    STALL_TRIGGERS,
    STATUS_PORT,
    STOP_TIMEOUT,
    serve,
)
from deltaflow.cli.output import note, run_summary

__all__ = ["run", "sql", "validate"]


@click.command()
@click.argument("pipeline_file", type=click.Path(dir_okay=False))
@click.option("--show", is_flag=True, help="Print the resolved configuration (secrets masked).")
def validate(pipeline_file: str, show: bool) -> None:
    """Check PIPELINE_FILE without starting Spark: every problem with its YAML path."""
    from deltaflow.config.pipeline import load_pipelines
    from deltaflow.config.secrets import masked

    file = load_pipelines(pipeline_file)
    if show:
        import yaml

        dumped = masked(file.model_dump(mode="json", by_alias=True, exclude_defaults=True))
        click.echo(yaml.safe_dump(dumped, sort_keys=False).rstrip())
    _describe_pipelines(pipeline_file, file)


def _run_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options ``run`` and ``sql`` share."""
    for decorator in reversed(
        [
            click.option(
                "--pipeline",
                "pipeline_ids",
                multiple=True,
                help="Run only this pipeline (repeatable) [default: every enabled pipeline of the file].",
            ),
            click.option(
                "--available-now",
                "--once",
                "available_now",
                is_flag=True,
                help="Commit all input available now, then exit 0 (Spark's availableNow trigger).",
            ),
            GIVE_UP_AFTER,
            STOP_TIMEOUT,
            METRICS_PORT,
            STATUS_PORT,
            STALL_TRIGGERS,
            STALL_TIMEOUT,
            click.option(
                "--spark-master",
                "--spark_master",
                default=None,
                envvar="DELTAFLOW_SPARK_MASTER",
                show_envvar=True,
                help="Spark master URL [default: the file's spark.master, else local[*]].",
            ),
            REMOTE,
        ]
    ):
        command = decorator(command)
    return command


@click.command()
@click.argument("pipeline_file", type=click.Path(dir_okay=False))
@_run_options
def run(pipeline_file: str, **run_options: Any) -> None:
    """Run the pipelines of PIPELINE_FILE (YAML) in one Spark application until SIGTERM/SIGINT.

    Each pipeline keeps its own checkpoint; a transient failure restarts it with backoff, a
    terminal one stops all of them (exit 2).
    """
    from deltaflow.config.pipeline import load_pipelines

    _run_file(pipeline_file, load_pipelines(pipeline_file), **run_options)


@click.command()
@click.argument("sql_file", type=click.Path(dir_okay=False))
@click.option(
    "--validate", "only_validate", is_flag=True, help="Check the file and print the pipelines; run nothing."
)
@_run_options
def sql(sql_file: str, only_validate: bool, **run_options: Any) -> None:
    """Run SQL_FILE: CREATE TABLE ... WITH (connector = ...) and INSERT INTO ... SELECT statements.

    Each INSERT is a pipeline, run as ``deltaflow run`` runs those of a YAML file.
    """
    from deltaflow.config.sql import load_sql

    file = load_sql(sql_file)
    if only_validate:
        _describe_pipelines(sql_file, file, notes_from="arroyo")
        return
    _run_file(sql_file, file, **run_options)


def _describe_pipelines(name: str, file: Any, *, notes_from: str = "rivven") -> None:
    from deltaflow.pipeline.runner import describe_source

    for spec in file.pipelines:
        routes = ", ".join(
            f"{sink_name} -> {sink.table_uri}"
            + (f" when {sink.when}" if sink.when else "")
            + (f" (mirror of {sink.stream})" if sink.stream else "")
            for sink_name, sink in zip(spec.sink_names(), spec.sinks, strict=True)
        )
        extra = f"; {len(spec.expectations)} expectation(s)" if spec.expectations else ""
        off = "" if spec.enabled else " (disabled)"
        click.echo(f"{spec.pipeline_id}{off}: {describe_source(spec)} => {routes}{extra}{_engine(spec)}")
    for remark in file.notes:
        click.echo(f"  {notes_from} {remark}")
    click.echo(f"{name}: {len(file.pipelines)} pipeline(s), valid")


def _caught_up(selected: Any) -> dict[str, list[str]]:
    """The tables of each pipeline that has nothing to do: Kafka ingest on the Arrow engine
    whose tables already hold every message up to the topics' latest offsets
    (:func:`deltaflow.pipeline.ingest.caught_up`). A pipeline that may have something to do,
    or runs on Spark's engine, is left out."""
    from deltaflow.pipeline.ingest import caught_up

    out = {}
    for spec in selected:
        if spec.engine == "spark" or spec.arrow_blockers():
            continue
        tables = caught_up(spec.ingest_config(available_now=True))
        if tables is not None:
            out[spec.pipeline_id] = tables
    return out


def _engine(spec: Any) -> str:
    """What ``engine`` makes of the pipeline (the tables' progress can still keep ``auto`` on
    Spark: decided at start)."""
    if spec.engine == "spark":
        return ""
    blockers = spec.arrow_blockers()
    if spec.engine == "auto" and blockers:
        return f"; engine auto: spark ({'; '.join(blockers)})"
    return f"; engine {spec.engine}: arrow"


def _run_file(
    name: str,
    file: Any,
    *,
    pipeline_ids: tuple[str, ...],
    available_now: bool,
    give_up_after_s: float,
    stop_timeout_s: float,
    metrics_port: int | None,
    status_port: int | None,
    stall_triggers: int,
    stall_timeout_s: float,
    spark_master: str | None,
) -> None:
    import signal

    from deltaflow.service.daemon import run_pipelines

    selected = file.selected(pipeline_ids)
    if not selected:
        raise click.UsageError(f"{name}: no enabled pipeline to run")
    idle = _caught_up(selected) if available_now else {}
    # A pipeline with nothing to read is not started: no claim, no commit (a scheduled job of
    # idle topics); the others run.
    for pipeline, tables in idle.items():
        click.echo(f"{pipeline}: 0 row(s) committed (nothing to read: {len(tables)} table(s) up to date)")
    selected = [s for s in selected if s.pipeline_id not in idle]
    if not selected:
        note(
            f"nothing to run: every table of {len(idle)} pipeline(s) holds every message of its "
            "topics up to their latest offsets; nothing was started or committed"
        )
        return
    if idle:
        note(f"not started, nothing to read: {', '.join(idle)}")
    serve(metrics_port, status_port, stall_triggers, stall_timeout_s)
    import deltaflow
    from deltaflow.pipeline.session import JvmProfile, stop_session

    # When every pipeline runs on the Arrow engine (its rows never enter the JVM), the JVM only
    # plans and schedules: its quick compiler is enough, and a job takes the serial collector
    # too (as ingest does). Any pipeline that may need Spark SQL keeps the full JVM.
    arrow = all(s.engine != "spark" and not s.arrow_blockers() for s in selected)
    jvm: JvmProfile = ("lean" if available_now else "quick") if arrow else "full"
    job = "run:" + ",".join(sorted(s.pipeline_id for s in selected))
    spark = deltaflow.spark_session(spark_master or file.spark.master, jvm=jvm, job=job, **file.spark.conf)
    try:
        summaries = run_pipelines(
            spark,
            selected,
            available_now=available_now,
            give_up_after_s=give_up_after_s,
            stop_timeout_s=stop_timeout_s,
        )
    finally:
        stop_session(spark)
    for pipeline, summary in summaries.items():
        click.echo(run_summary(pipeline, summary))
    stopped = {s.signal for s in summaries.values() if s.signal}
    if stopped:
        note(f"stopped by {', '.join(signal.Signals(s).name for s in sorted(stopped))}")
