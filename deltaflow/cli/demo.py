"""``deltaflow demo``: the README's main job on embedded defaults."""

from __future__ import annotations

from pathlib import Path

import click

from deltaflow.cli.options import REMOTE

__all__ = ["demo"]


@click.command()
@click.option(
    "--source",
    type=click.Choice(["kafka", "files"]),
    default="kafka",
    envvar="DELTAFLOW_DEMO_SOURCE",
    show_envvar=True,
    help="kafka: an embedded broker and `deltaflow ingest`; files: a landing folder of JSON files.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-output"),
    envvar="DELTAFLOW_DEMO_WORKDIR",
    show_envvar=True,
    help="Folder for the landing files and the Delta tables (recreated).",
)
@click.option(
    "--events",
    type=click.IntRange(min=1),
    default=None,
    envvar="DELTAFLOW_DEMO_EVENTS",
    show_envvar=True,
    help="JSON events to generate [default: 100,000 for kafka, 300,000 for files].",
)
@click.option(
    "--partitions",
    type=click.IntRange(min=1),
    default=4,
    envvar="DELTAFLOW_DEMO_PARTITIONS",
    show_envvar=True,
    help="kafka: partitions of the demo topic.",
)
@click.option(
    "--files",
    type=click.IntRange(min=1),
    default=12,
    envvar="DELTAFLOW_DEMO_FILES",
    show_envvar=True,
    help="files: landing files to spread the events over.",
)
@click.option(
    "--files-per-batch",
    type=click.IntRange(min=1),
    default=3,
    envvar="DELTAFLOW_DEMO_FILES_PER_BATCH",
    show_envvar=True,
    help="files: landing files per micro-batch (Spark's maxFilesPerTrigger).",
)
@click.option(
    "--spark-master",
    default=None,
    envvar="DELTAFLOW_SPARK_MASTER",
    show_envvar=True,
    help="Spark master URL [default: local[*]].",
)
@REMOTE
def demo(
    source: str,
    workdir: Path,
    events: int | None,
    partitions: int,
    files: int,
    files_per_batch: int,
    spark_master: str | None,
) -> None:
    """The main job on embedded defaults: clickstream events into a local Delta table."""
    from deltaflow.pipeline.demo import run_demo, run_kafka_demo

    if source == "kafka":
        outcome = run_kafka_demo(
            workdir, events=events or 100_000, partitions=partitions, master=spark_master, echo=click.echo
        )
        if not outcome.exactly_once:
            raise click.ClickException("the tables do not hold every message exactly once")
        return
    events = events or 300_000
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
