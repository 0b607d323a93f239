"""Pipeline status: what the daemon knows (state, progress, throughput and lag over the last
minutes) and what a table's Delta log tells (commits per pipeline, file health).

* :data:`board` is the process's :class:`StatusBoard`. The daemon loop records states and
  Spark's progress reports on it; :meth:`StatusBoard.serve` serves a read-only page (``/``)
  and its data (``/status.json``) for ``--status_port``.
* :func:`table_status` needs no daemon: it reads any deltaflow table's log
  (``deltaflow status TABLE``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

__all__ = ["StatusBoard", "board", "table_health", "table_status"]

logger = logging.getLogger(__name__)

#: Minutes of throughput and lag the board keeps per pipeline.
WINDOW_MINUTES = 15
#: Table health is recomputed at most this often (it reads the table's file list).
HEALTH_TTL_S = 30.0
#: Commits of the log scanned for the last compaction and per-pipeline commits.
HISTORY_SCAN = 1000
#: ``/healthz``: triggers in a row that read nothing while messages waited, after which a
#: pipeline is stalled (``--stall-triggers``).
DEFAULT_STALL_TRIGGERS = 10
#: ``/healthz``: seconds without any completed trigger while a pipeline runs or restarts (a
#: broker that accepts connections but never answers, a query that hangs, restarts that never
#: complete one) after which it is stalled (``--stall-timeout``). Ten minutes: longer than a
#: large batch of a backlog takes, short enough for a probe to restart a wedged driver.
DEFAULT_STALL_TIMEOUT_S = 600.0


@dataclass
class _Pipeline:
    name: str
    table_uri: str | None
    source: str | None
    state: str = "starting"
    since: float = field(default_factory=time.time)
    started_at: float = field(default_factory=time.time)
    restarts: int = 0
    error: str | None = None
    last_batch: dict[str, Any] | None = None
    points: deque[dict[str, Any]] = field(default_factory=deque)
    health: dict[str, Any] | None = None
    health_at: float = 0.0
    #: ``arrow`` or ``spark``: the engine the pipeline's query runs on (None: not known yet).
    engine: str | None = None
    #: What Spark's input rows of the query are (``file(s)`` of a files source; the ``rows``
    #: of the progress points count them), and what its sinks commit.
    unit: str = "row(s)"
    committed_unit: str = "row(s)"
    #: The table of a topic, for pipelines writing a table per topic (lag per table).
    table_of: Callable[[str], str | None] | None = None
    #: ``topic:partition`` -> messages behind, from the last progress report.
    lags: dict[str, int] = field(default_factory=dict)
    #: When the last progress report arrived, and how many in a row read nothing while
    #: messages waited.
    reported_at: float | None = None
    idle_behind: int = 0


class StatusBoard:
    """States and recent progress of the pipelines of this process (thread-safe)."""

    def __init__(self, window_minutes: int = WINDOW_MINUTES) -> None:
        self._lock = threading.Lock()
        self._pipelines: dict[str, _Pipeline] = {}
        self._window_s = window_minutes * 60
        #: See :data:`DEFAULT_STALL_TRIGGERS` and :data:`DEFAULT_STALL_TIMEOUT_S`.
        self.stall_triggers = DEFAULT_STALL_TRIGGERS
        self.stall_timeout_s = DEFAULT_STALL_TIMEOUT_S

    def register(
        self,
        name: str,
        *,
        table_uri: str | None = None,
        source: str | None = None,
        unit: str = "row(s)",
        committed_unit: str = "row(s)",
        table_of: Callable[[str], str | None] | None = None,
    ) -> None:
        """A pipeline; ``unit``: what its query's input rows are, ``committed_unit``: what its
        sinks commit (the page shows both; committed counts come from the metrics facade);
        ``table_of``: the table of a topic, for a pipeline writing a table per topic (its
        ``table_uri`` is then the template)."""
        with self._lock:
            if name not in self._pipelines:
                self._pipelines[name] = _Pipeline(
                    name, table_uri, source, unit=unit, committed_unit=committed_unit, table_of=table_of
                )

    def set_engine(self, name: str, engine: str) -> None:
        """The engine the pipeline's query took (``arrow`` or ``spark``)."""
        with self._lock:
            self._pipelines.setdefault(name, _Pipeline(name, None, None)).engine = engine

    def set_state(self, name: str, state: str, error: str | None = None) -> None:
        """``starting``, ``running``, ``restarting``, ``stopping``, ``stopped`` or ``failed``."""
        with self._lock:
            p = self._pipelines.setdefault(name, _Pipeline(name, None, None))
            if state == "restarting" and p.state != "restarting":
                p.restarts += 1
            if p.state != state:
                p.state, p.since = state, time.time()
            if error is not None or state in ("running", "stopped"):
                p.error = error

    def progress(self, name: str, progress: Mapping[str, Any]) -> None:
        """Record one of Spark's ``StreamingQueryProgress`` reports (never raises)."""
        from deltaflow.metrics import progress_messages, progress_rates, source_lags

        try:
            stamp = _epoch(str(progress["timestamp"]))
            sources = progress.get("sources") or []
            lags = {k: v for s in sources for k, v in source_lags(s).items()}
            lag = sum(lags.values())
            input_rps, processed_rps = progress_rates(progress)
            point = {
                "t": stamp,
                "rows": progress_messages(progress),
                "input_rps": input_rps,
                "processed_rps": processed_rps,
                "lag": lag,
            }
            durations = progress.get("durationMs") or {}
        except (KeyError, TypeError, ValueError) as exc:
            logger.debug("progress of %r not recorded: %s", name, exc)
            return
        with self._lock:
            p = self._pipelines.setdefault(name, _Pipeline(name, None, None))
            if p.points and p.points[-1]["t"] == stamp:
                return
            p.reported_at = time.time()
            p.idle_behind = p.idle_behind + 1 if not point["rows"] and lag > 0 else 0
            p.lags = lags
            p.points.append(point)
            while p.points and p.points[0]["t"] < stamp - self._window_s:
                p.points.popleft()
            if point["rows"]:
                p.last_batch = {
                    "batch_id": progress.get("batchId"),
                    "rows": point["rows"],
                    "at": _iso(stamp),
                    "duration_ms": durations.get("triggerExecution"),
                }

    def snapshot(self) -> dict[str, Any]:
        """Everything the page shows, JSON-ready."""
        from deltaflow.metrics import metrics

        with self._lock:
            pipelines = list(self._pipelines.values())
        now = time.time()
        out = []
        for p in pipelines:
            if p.table_uri and p.table_of is None and now - p.health_at > HEALTH_TTL_S:
                p.health, p.health_at = _safe_health(p.table_uri), now
                if p.health is not None:
                    p.health["checked_at"] = _iso(now)
            points = list(p.points)
            recent = [x for x in points if x["t"] >= now - 60]
            out.append(
                {
                    "name": p.name,
                    "state": p.state,
                    "since": _iso(p.since),
                    "started_at": _iso(p.started_at),
                    "restarts": p.restarts,
                    "error": p.error,
                    "table_uri": p.table_uri,
                    "source": p.source,
                    "engine": p.engine,
                    "last_batch": p.last_batch,
                    "unit": p.unit,
                    # What the sinks committed in this process, per table (their own reports).
                    "committed": metrics.rows_committed(p.name),
                    "committed_unit": p.committed_unit,
                    "rows_last_minute": sum(x["rows"] for x in recent),
                    "lag": points[-1]["lag"] if points else None,
                    "series": [{**x, "t": _iso(x["t"])} for x in points],
                    "table": p.health,
                    "tables": _tables(p, metrics.rows_committed(p.name), metrics.last_commits(p.name)),
                }
            )
        return {"generated_at": _iso(now), "window_minutes": self._window_s // 60, "pipelines": out}

    def health(self) -> tuple[bool, dict[str, Any]]:
        """``/healthz``: whether every pipeline runs or is inside its restart policy, and the
        body naming those that are not. A pipeline fails the check when it failed for good,
        or is stalled: :attr:`stall_triggers` triggers in a row read nothing while messages
        waited, or no trigger completed for :attr:`stall_timeout_s` while it runs or restarts
        (a query that hangs, or that restarts without ever completing one)."""
        now = time.time()
        with self._lock:
            pipelines = list(self._pipelines.values())
        failing = []
        for p in pipelines:
            reason = self._unhealthy(p, now)
            if reason is not None:
                failing.append({"name": p.name, "state": p.state, "reason": reason})
        body = {"status": "failing" if failing else "ok", "pipelines": failing or _states(pipelines)}
        return not failing, body

    def _unhealthy(self, p: _Pipeline, now: float) -> str | None:
        if p.state == "failed":
            return f"failed for good: {p.error}"
        if p.state not in ("running", "restarting"):
            return None
        if p.idle_behind >= self.stall_triggers:
            waiting = sum(p.lags.values())
            return f"{p.idle_behind} trigger(s) in a row read nothing while {waiting} message(s) waited"
        quiet = now - (p.reported_at if p.reported_at is not None else p.started_at)
        if self.stall_timeout_s and quiet > self.stall_timeout_s:
            return f"no trigger completed for {quiet:.0f} s ({p.restarts} restart(s))"
        return None

    def ready(self) -> tuple[bool, dict[str, Any]]:
        """``/readyz``: whether every pipeline has started (state ``running``); not while one
        starts, restarts, stops or has stopped."""
        with self._lock:
            pipelines = list(self._pipelines.values())
        ready = bool(pipelines) and all(p.state == "running" for p in pipelines)
        return ready, {"status": "ready" if ready else "not ready", "pipelines": _states(pipelines)}

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve ``/`` (the page), ``/status.json``, ``/healthz`` and ``/readyz`` in a daemon
        thread; the bound port."""
        board = self
        page = resources.files("deltaflow.service").joinpath("status.html").read_bytes()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                code = 200
                if path == "/status.json":
                    body, kind = json.dumps(board.snapshot(), default=str).encode(), "application/json"
                elif path in ("/healthz", "/readyz"):
                    ok, answer = board.health() if path == "/healthz" else board.ready()
                    code, body, kind = 200 if ok else 503, json.dumps(answer).encode(), "application/json"
                elif path in ("/", "/index.html"):
                    body, kind = page, "text/html; charset=utf-8"
                else:
                    self.send_error(404)
                    return
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                logger.debug("status page: " + format, *args)

        server = ThreadingHTTPServer((addr, port), Handler)
        threading.Thread(target=server.serve_forever, name="deltaflow-status", daemon=True).start()
        bound = int(server.server_address[1])
        logger.info("status page on http://%s:%d/", addr, bound)
        return bound


def _states(pipelines: list[_Pipeline]) -> list[dict[str, Any]]:
    return [{"name": p.name, "state": p.state} for p in pipelines]


def _tables(p: _Pipeline, committed: Mapping[str, int], last: Mapping[str, float]) -> list[dict[str, Any]]:
    """Each table the pipeline commits to: rows committed by this process, its last commit, and
    the messages its topics are behind (a table per topic; otherwise the pipeline's lag)."""
    lag: dict[str, int] = {}
    if p.table_of is not None:
        for key, behind in p.lags.items():
            table = p.table_of(key.rsplit(":", 1)[0])
            if table is not None:
                lag[table] = lag.get(table, 0) + behind
    names = sorted({*committed, *lag})
    return [
        {
            "table_uri": t,
            "committed": committed.get(t, 0),
            "last_commit": _iso(last[t]) if t in last else None,
            "lag": lag.get(t) if p.table_of is not None else None,
        }
        for t in names
    ]


def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def _iso(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="seconds")


def _safe_health(table_uri: str) -> dict[str, Any] | None:
    try:
        return table_health(table_uri)
    except Exception as exc:  # noqa: BLE001 - a table not created yet, a storage hiccup
        logger.debug("health of %s not available: %s", table_uri, exc)
        return None


def table_health(table_uri: str, storage_options: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Files, bytes, small-file ratio, version and the last compaction of a table."""
    from deltaflow import ops

    info = ops.describe(table_uri, storage_options=storage_options)
    entries = ops.history(table_uri, limit=HISTORY_SCAN, storage_options=storage_options)
    compaction = next((e for e in entries if e.get("operation") == "OPTIMIZE"), None)
    files = info["files"]
    return {
        "version": info["version"],
        "files": files["count"],
        "bytes": files["bytes"],
        "rows": files["rows"],
        "small_files": files["small_files"],
        "small_file_ratio": files["small_file_ratio"],
        "last_compaction": (
            {"version": compaction.get("version"), "at": compaction.get("timestamp")} if compaction else None
        ),
    }


def table_status(
    table_uri: str, *, minutes: int = WINDOW_MINUTES, storage_options: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Per-pipeline commits of a table (from its log) and its health; no daemon needed."""
    from deltaflow import ops

    entries = ops.history(table_uri, limit=HISTORY_SCAN, storage_options=storage_options)
    since = time.time() - minutes * 60
    pipelines: dict[str, dict[str, Any]] = {}
    for e in entries:  # newest first
        name = e.get("deltaflow.pipeline_id")
        if not name:
            continue
        p = pipelines.get(name)
        if p is None:
            p = pipelines[name] = {
                "name": name,
                "last_commit": {
                    "version": e.get("version"),
                    "at": e.get("timestamp"),
                    "batch_id": e.get("deltaflow.epoch"),
                    "rows": e.get("deltaflow.rows"),
                },
                "commits_in_window": 0,
                "rows_in_window": 0,
            }
        if e.get("timestamp") and _epoch(str(e["timestamp"])) >= since:
            p["commits_in_window"] += 1
            p["rows_in_window"] += int(e.get("deltaflow.rows") or 0)
    for p in pipelines.values():
        p["rows_per_second"] = round(p["rows_in_window"] / (minutes * 60), 2)
    return {
        "table_uri": table_uri,
        "window_minutes": minutes,
        "pipelines": sorted(pipelines.values(), key=lambda p: p["name"]),
        "table": table_health(table_uri, storage_options),
    }


#: The process's status board.
board = StatusBoard()
