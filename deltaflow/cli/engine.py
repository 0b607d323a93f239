"""``deltaflow engine start|stop|status``: a resident Spark Connect server for jobs (``--remote``)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from deltaflow.cli.options import key_values
from deltaflow.cli.output import note, size

__all__ = ["engine"]

_DIR = click.option(
    "--dir",
    "folder",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    envvar="DELTAFLOW_ENGINE_DIR",
    show_envvar=True,
    help="The engine's folder: Spark's pid file and log, and engine.json [default: ~/.deltaflow/engine].",
)


@click.group()
def engine() -> None:
    """A resident Spark engine (a Spark Connect server from the installed pyspark): jobs given
    --remote URL (or SPARK_REMOTE) start no JVM of their own."""


@engine.command()
@_DIR
@click.option("--host", default="127.0.0.1", show_default=True, help="The address the server binds.")
@click.option("--port", type=click.IntRange(1, 65535), default=15002, show_default=True)
@click.option(
    "--master", default="local[*]", show_default=True, help="The Spark master of the server's driver."
)
@click.option("--driver-memory", default="2g", show_default=True, help="The server JVM's heap.")
@click.option(
    "--idle-stop",
    type=click.FloatRange(min=0),
    default=0,
    show_default=True,
    help="Stop the server once no client has been connected for this many seconds (0: never).",
)
@click.option("--conf", multiple=True, metavar="KEY=VALUE", help="A Spark setting (repeatable).")
def start(
    folder: Path | None,
    host: str,
    port: int,
    master: str,
    driver_memory: str,
    idle_stop: float,
    conf: tuple[str, ...],
) -> None:
    """Start the engine; once it accepts sessions, print its sc:// URL as the last line."""
    from deltaflow.service import engine as engines

    settings = engines.EngineSettings(
        folder or engines.default_dir(),
        host=host,
        port=port,
        master=master,
        driver_memory=driver_memory,
        idle_stop_s=idle_stop,
        conf=key_values(conf, "--conf"),
    )
    started = engines.start(settings, echo=note)
    click.echo(started.url)


@engine.command()
@_DIR
def stop(folder: Path | None) -> None:
    """Stop the engine (its running queries stop with it)."""
    from deltaflow.service import engine as engines

    stopped = engines.stop(folder or engines.default_dir())
    note(f"stopped the engine at {stopped.url}" if stopped else "no engine was running")


@engine.command()
@_DIR
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(folder: Path | None, as_json: bool) -> None:
    """Whether the engine runs: its URL, pid, uptime, memory and connected clients (exit 1 when
    none runs)."""
    from deltaflow.service import engine as engines

    found = engines.state(folder or engines.default_dir())
    info = engines.describe(found) if found is not None else {"running": False}
    if as_json:
        click.echo(json.dumps(info))
    elif info["running"]:
        click.echo(
            f"running at {info['url']} (pid {info['pid']}, master {info['master']}, up "
            f"{info['uptime_s']:.0f} s, {size(info['rss_bytes'])} resident, {info['clients']} client(s))"
        )
    else:
        click.echo("not running")
    if not info["running"]:
        raise SystemExit(1)


@engine.command(hidden=True)
@_DIR
@click.option("--idle-stop", type=click.FloatRange(min=0, min_open=True), required=True)
def watch(folder: Path | None, idle_stop: float) -> None:
    """(Started by ``start --idle-stop``.) Stop the engine once idle."""
    from deltaflow.service import engine as engines

    engines.watch_idle(folder or engines.default_dir(), idle_stop)
