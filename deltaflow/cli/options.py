"""Options several commands share, and how option values are read (``key=value`` lists)."""

from __future__ import annotations

import click

__all__ = [
    "GIVE_UP_AFTER",
    "JSON",
    "LINES",
    "METRICS_PORT",
    "REMOTE",
    "STALL_TIMEOUT",
    "STALL_TRIGGERS",
    "STATUS_PORT",
    "STOP_TIMEOUT",
    "STORAGE",
    "key_values",
    "serve",
]


class _Lines(click.types.StringParamType):
    """A repeatable option whose environment variable holds one value per line (transforms and
    settings contain spaces, so click's default whitespace split would cut them apart)."""

    name = "text"
    envvar_list_splitter = "\n"

    def split_envvar_value(self, rv: str) -> list[str]:
        return [line.strip() for line in (rv or "").splitlines() if line.strip()]


LINES = _Lines()


def _export_remote(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """The Spark Connect server, for every session this process makes (pyspark's variable)."""
    import os

    if value:
        os.environ["SPARK_REMOTE"] = value


REMOTE = click.option(
    "--remote",
    default=None,
    envvar="SPARK_REMOTE",
    show_envvar=True,
    expose_value=False,
    callback=_export_remote,
    help="Run the Spark work on this Spark Connect server (sc://host:port; deltaflow engine start "
    "prints one) instead of a JVM of this process. Its Python workers need this deltaflow "
    "version; tables and checkpoints must be paths the server reaches.",
)


METRICS_PORT = click.option(
    "--metrics-port",
    "--metrics_port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    envvar="METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on this port (/metrics): rows, bytes, files, commits, retries, "
    "latency, dead letters, unknown fields, lag per partition, rates.",
)
STATUS_PORT = click.option(
    "--status-port",
    "--status_port",
    type=click.IntRange(min=0, max=65535),
    default=None,
    envvar="STATUS_PORT",
    show_envvar=True,
    help="Serve a read-only status page on this port (/ and /status.json): state, last batch, "
    "throughput and lag over the last 15 minutes, table health.",
)

STALL_TRIGGERS = click.option(
    "--stall-triggers",
    "--stall_triggers",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    envvar="DELTAFLOW_STALL_TRIGGERS",
    show_envvar=True,
    help="The status port's /healthz answers 503 for a pipeline that failed for good, or whose "
    "last N triggers read nothing while messages waited (see also --stall-timeout): a liveness "
    "probe's signal.",
)


def _seconds(_ctx: click.Context, param: click.Parameter, value: str) -> float:
    from deltaflow.config.units import parse_seconds

    try:
        return parse_seconds(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} {exc}", param=param) from None


#: The shortest --stall-timeout: Spark reports an idle query's progress every 10 s, so a bound
#: near that would flap on a pipeline that is merely idle.
MIN_STALL_TIMEOUT_S = 15.0


def _stall_timeout(ctx: click.Context, param: click.Parameter, value: str) -> float:
    seconds = _seconds(ctx, param, value)
    if 0 < seconds < MIN_STALL_TIMEOUT_S:
        raise click.BadParameter(
            f"{value!r} is shorter than {MIN_STALL_TIMEOUT_S:g} s: Spark reports an idle pipeline's "
            "progress every 10 s, so /healthz would flap on idle pipelines (0: no bound)",
            param=param,
        )
    return seconds


STALL_TIMEOUT = click.option(
    "--stall-timeout",
    "--stall_timeout",
    "stall_timeout_s",
    default="10 min",
    show_default=True,
    envvar="DELTAFLOW_STALL_TIMEOUT",
    show_envvar=True,
    callback=_stall_timeout,
    help="The status port's /healthz also answers 503 for a pipeline that completed no trigger "
    "for this long while it runs or restarts (a broker that accepts connections but never "
    "answers, a query that hangs, restarts without end). Longer than the slowest batch; at "
    "least 15 s; 0: no bound.",
)


GIVE_UP_AFTER = click.option(
    "--give-up-after",
    "--give_up_after",
    "give_up_after_s",
    default="5 min",
    show_default=True,
    envvar="DELTAFLOW_GIVE_UP_AFTER",
    show_envvar=True,
    callback=_seconds,
    help="For a job (a run that ends on its own): stop with exit code 1 after this long without "
    "progress through restarts (a broker that never comes up, a store that stays down), and say "
    "why. A service restarts for as long as it runs.",
)


STOP_TIMEOUT = click.option(
    "--stop-timeout",
    "--stop_timeout",
    "stop_timeout_s",
    default="60 s",
    show_default=True,
    envvar="DELTAFLOW_STOP_TIMEOUT",
    show_envvar=True,
    callback=_seconds,
    help="After SIGTERM or SIGINT, the longest the clean stop (the running batch committed whole "
    "or not at all) may take (0: no bound); then, or at a second signal (2 s or more after the "
    "first), the process stops at once with exit code 3, losing nothing (the batch runs again at "
    "the next start).",
)

JSON = click.option(
    "--json", "as_json", is_flag=True, envvar="DELTAFLOW_JSON", help="Print the result as JSON (for scripts)."
)
STORAGE = click.option(
    "--storage-option",
    "storage_options",
    multiple=True,
    type=LINES,
    envvar="DELTAFLOW_STORAGE_OPTIONS",
    show_envvar=True,
    callback=lambda _ctx, _param, values: key_values(values, "--storage-option"),
    help="key=value for the object store (repeatable), e.g. AWS_ENDPOINT_URL=http://127.0.0.1:9000.",
)


def key_values(values: tuple[str, ...], flag: str) -> dict[str, str]:
    """``key=value`` items as a mapping; a malformed item is a usage error naming ``flag``."""
    out = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} must look like key=value", param_hint=flag)
        out[key.strip()] = value.strip()
    return out


def serve(
    metrics_port: int | None,
    status_port: int | None,
    stall_triggers: int | None = None,
    stall_timeout_s: float | None = None,
) -> None:
    """Start the metrics endpoint and the status page (with ``/healthz`` and ``/readyz``) on
    the ports asked for (0: any free one)."""
    if metrics_port is not None:
        from deltaflow.metrics import metrics

        try:
            metrics.serve(metrics_port)  # logs the URL it serves
        except OSError as exc:
            raise click.BadParameter(f"cannot serve metrics on port {metrics_port}: {exc}") from None
    if status_port is not None:
        from deltaflow.service.status import board

        if stall_triggers is not None:
            board.stall_triggers = stall_triggers
        if stall_timeout_s is not None:
            board.stall_timeout_s = stall_timeout_s
        try:
            board.serve(status_port, addr="0.0.0.0")  # logs the URL it serves
        except OSError as exc:
            raise click.BadParameter(f"cannot serve the status page on port {status_port}: {exc}") from None
