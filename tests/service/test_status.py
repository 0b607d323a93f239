"""Status: the board the daemon fills, the page it serves (rendered in headless Chromium), and
`deltaflow status` from a daemon or from a table's log."""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli
from deltaflow.cli.options import MIN_STALL_TIMEOUT_S
from deltaflow.service.status import StatusBoard
from tests.fixtures.frames import settled

ROOT = Path(__file__).resolve().parents[2]
#: Where the rendered page's screenshot is kept for a human to look at.
SCREENSHOT = ROOT / "tests" / ".artifacts" / "status-page.png"


def _progress(batch: int, at: str, rows: int, lag: int) -> dict:
    """A progress report shaped as Spark's ``StreamingQueryProgress.json``."""
    return {
        "batchId": batch,
        "timestamp": at,
        "numInputRows": rows,
        "inputRowsPerSecond": rows / 2,
        "processedRowsPerSecond": float(rows),
        "durationMs": {"triggerExecution": 900},
        "sources": [{"endOffset": {"t": {"0": 10 * batch}}, "latestOffset": {"t": {"0": 10 * batch + lag}}}],
    }


def test_board_keeps_states_restarts_and_a_window_of_progress():
    board = StatusBoard(window_minutes=1)
    board.register("p", table_uri=None, source="kafka t")
    assert board.snapshot()["pipelines"][0]["engine"] is None
    board.set_engine("p", "spark")
    board.set_state("p", "running")
    now = time.time()

    def iso(t: float) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".000Z"

    board.progress("p", _progress(0, iso(now - 120), 100, 5))  # outside the 1-minute window
    board.progress("p", _progress(1, iso(now - 30), 200, 7))
    board.progress("p", _progress(2, iso(now - 1), 0, 3))  # an idle trigger
    board.progress("p", _progress(2, iso(now - 1), 0, 3))  # the same report polled twice
    board.set_state("p", "restarting", error="TransientError: broker gone")
    board.set_state("p", "restarting", error="TransientError: broker gone")
    board.set_state("p", "running")
    (p,) = board.snapshot()["pipelines"]
    assert (p["state"], p["restarts"], p["error"], p["engine"]) == ("running", 1, None, "spark")
    assert [x["rows"] for x in p["series"]] == [200, 0]
    assert p["last_batch"]["batch_id"] == 1 and p["last_batch"]["rows"] == 200
    assert (p["lag"], p["rows_last_minute"]) == (3, 200)
    board.progress("p", {"timestamp": "not a time"})  # ignored, never raises


def _wait_for(condition, timeout_s: float, what: str, daemon: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert daemon.poll() is None, f"the daemon exited early waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        time.sleep(0.5)  # condition poll: the daemon works in the background


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def test_status_page_of_a_running_ingest_in_chromium(kafka, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is missing: ./scripts/bootstrap.sh installs it (Debian package chromium)"
    topic = kafka.create_topic(partitions=2)
    kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(300)], partitions=2)
    table = tmp_path / "t"
    log = tmp_path / "daemon.log"
    command = [
        sys.executable,
        "-m",
        "deltaflow.cli",
        "ingest",
        topic,
        str(table),
        "--kafka",
        kafka.bootstrap,
    ]
    command += ["--app_id", "page", "--schema", "id LONG", "--allowed_latency", "1", "--status_port", "0"]
    command += ["--max_messages_per_batch", "100"]
    with log.open("w") as stderr:
        daemon = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        _wait_for(lambda: "status page on http" in log.read_text(), 120, "status page", daemon)
        port = int(re.search(r"status page on http://0\.0\.0\.0:(\d+)/", log.read_text()).group(1))
        base = f"http://127.0.0.1:{port}"

        def landed() -> bool:
            (p,) = _get_json(f"{base}/status.json")["pipelines"]
            return p["state"] == "running" and bool(p["table"]) and p["table"]["rows"] == 300

        _wait_for(landed, 180, "300 rows reported on the status page", daemon)
        kafka.produce(topic, [json.dumps({"id": i}).encode() for i in range(300, 400)], partitions=2)

        def window_rows() -> int:
            return sum(x["rows"] for x in _get_json(f"{base}/status.json")["pipelines"][0]["series"])

        _wait_for(lambda: window_rows() == 400, 120, "400 rows in the page's series", daemon)
        (p,) = _get_json(f"{base}/status.json")["pipelines"]
        assert p["name"] == "page" and p["source"].startswith(f"kafka {topic}")
        assert p["table_uri"] == str(table) and p["restarts"] == 0 and p["error"] is None
        assert len(p["series"]) >= 3 and p["last_batch"]["rows"] > 0
        assert p["engine"] == "arrow"  # plain ingest: the engine the query took

        # The page as a browser renders it: the pipeline's card, its state and both charts.
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"]
        dom = subprocess.run(
            [chromium, *flags, "--dump-dom", f"{base}/"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
        assert 'data-pipeline="page"' in dom and 'data-state="running"' in dom and ">arrow<" in dom
        assert "data-rendered=" in dom
        polylines = re.findall(r'<polyline points="([^"]*)"[^>]*data-series="(\w+)"', dom)
        series = {name: points.split() for points, name in polylines}
        assert set(series) == {"processed_rps", "input_rps", "lag"}
        assert all(len(points) >= 3 for points in series.values())  # one vertex per progress report
        SCREENSHOT.parent.mkdir(exist_ok=True)
        SCREENSHOT.unlink(missing_ok=True)
        subprocess.run(
            [chromium, *flags, "--window-size=1200,700", f"--screenshot={SCREENSHOT}", f"{base}/"],
            capture_output=True,
            timeout=120,
            check=True,
        )
        assert SCREENSHOT.stat().st_size > 10_000  # a rendered page, not a blank one

        out = CliRunner().invoke(cli, ["status", "--url", base])
        assert out.exit_code == 0, out.output
        assert "page: running since" in out.stdout and "last batch" in out.stdout
        assert "(arrow engine)" in out.stdout
        daemon.send_signal(signal.SIGTERM)
        daemon.communicate(timeout=120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, log.read_text()[-3000:]

    # Without a daemon: the table's log tells the pipeline's commits and the table's health.
    out = CliRunner().invoke(cli, ["status", str(table), "--json"])
    assert out.exit_code == 0, out.output
    (info,) = json.loads(out.stdout)
    (pipeline,) = info["pipelines"]
    last_version = DeltaTable(str(table)).version()
    assert pipeline["name"] == "page" and pipeline["rows_in_window"] == 400
    assert pipeline["last_commit"]["version"] == last_version
    assert info["table"]["rows"] == 400 and info["table"]["files"] >= 1
    text = CliRunner().invoke(cli, ["status", str(table)]).stdout
    assert "pipeline page: last batch" in text and "400 rows in 15 min" in text


def test_status_needs_tables_or_a_url():
    out = CliRunner().invoke(cli, ["status"])
    assert out.exit_code == 2 and "give either TABLE_URI(s) or --url" in out.output


@pytest.mark.parametrize("path", ["/nope"])
def test_unknown_paths_are_404(path):
    port = StatusBoard().serve(0)
    with pytest.raises(urllib.error.HTTPError, match="404"):
        urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)


def test_the_board_names_what_a_files_pipeline_reads_and_shows_what_it_committed(spark, tmp_path):
    from deltaflow.service.daemon import run_pipelines
    from deltaflow.service.status import board
    from tests.fixtures.pipelines import pipelines

    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(5)))
    (landing / "b.json").write_text("".join(f'{{"id": {i}}}\n' for i in range(5, 12)))
    settled(landing / "a.json", landing / "b.json")
    specs = pipelines(
        tmp_path,
        """
        pipelines:
          - id: board-files
            source: {type: files, path: "${DIR}/landing", format: json}
            sinks: [{table_uri: "${DIR}/t"}]
        """,
    )
    run_pipelines(spark, specs, available_now=True)
    (p,) = [p for p in board.snapshot()["pipelines"] if p["name"] == "board-files"]
    assert (p["last_batch"]["rows"], p["unit"]) == (2, "file(s)")  # Spark's input rows: the files
    assert (p["committed"], p["committed_unit"]) == ({str(tmp_path / "t"): 12}, "row(s)")


def _probe(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_health_and_readiness_probes_follow_the_pipelines():
    board = StatusBoard()
    board.stall_triggers = 3
    port = board.serve(0)
    board.register("a", source="kafka a")
    board.register("b", source="kafka b")
    assert _probe(port, "/readyz")[0] == 503  # starting
    assert _probe(port, "/healthz") == (200, {"status": "ok", "pipelines": [
        {"name": "a", "state": "starting"}, {"name": "b", "state": "starting"}]})  # fmt: skip
    board.set_state("a", "running")
    board.set_state("b", "running")
    assert _probe(port, "/readyz")[0] == 200
    iso = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    board.progress("a", _progress(1, iso, 50, 0))
    # b: triggers that read nothing while messages wait (a source that stopped delivering).
    for batch in range(1, 4):
        board.progress("b", _progress(batch, iso.replace(".000Z", f".{batch:03d}Z"), 0, 40))
        code, body = _probe(port, "/healthz")
        assert code == (503 if batch == 3 else 200), body
    reason = "3 trigger(s) in a row read nothing while 40 message(s) waited"
    assert body["pipelines"] == [{"name": "b", "state": "running", "reason": reason}]
    board.progress("b", _progress(4, iso.replace(".000Z", ".004Z"), 7, 40))  # it moves again
    assert _probe(port, "/healthz")[0] == 200
    board.set_state("a", "restarting")  # inside its restart policy: healthy, not ready
    assert _probe(port, "/healthz")[0] == 200 and _probe(port, "/readyz")[0] == 503
    board.set_state("a", "failed", error="TerminalError: the schema changed")
    code, body = _probe(port, "/healthz")
    assert (
        code == 503 and body["pipelines"][0]["reason"] == "failed for good: TerminalError: the schema changed"
    )
    board.set_state("b", "stopping")
    assert _probe(port, "/readyz") == (503, {"status": "not ready", "pipelines": [
        {"name": "a", "state": "failed"}, {"name": "b", "state": "stopping"}]})  # fmt: skip


def test_a_pipeline_that_completes_no_trigger_for_long_is_unhealthy(monkeypatch):
    board = StatusBoard()
    board.stall_timeout_s = 120
    board.register("hung", source="kafka h")
    board.set_state("hung", "running")
    assert board.health()[0]
    later = time.time() + 2 * 60 + 5  # two minutes without a trigger (a query that hangs)
    monkeypatch.setattr(time, "time", lambda: later)
    ok, body = board.health()
    assert not ok and body["pipelines"][0]["reason"].startswith("no trigger completed for 125 s")


#: The hang test's --stall-timeout (the shortest allowed) and Spark's interval between the
#: progress reports of an idle query.
STALL_TIMEOUT_S, IDLE_REPORT_S = MIN_STALL_TIMEOUT_S, 10.0


def test_healthz_turns_503_when_the_broker_accepts_connections_but_never_answers(tmp_path):
    from deltaflow.testing import start_broker_behind_proxy
    from tests.fixtures.ingest_messages import EVENTS_SCHEMA, events
    from tests.fixtures.service import Service

    broker, proxy = start_broker_behind_proxy()
    service = None
    try:
        topic = broker.create_topic(partitions=2)
        broker.produce(topic, events(0, 100), partitions=2)
        args = ["ingest", topic, str(tmp_path / "t"), "--kafka", proxy.address, "--app_id", "hang"]
        args += ["--schema", EVENTS_SCHEMA, "--allowed_latency", "1", "--status_port", "0"]
        service = Service([*args, "--stall-timeout", f"{STALL_TIMEOUT_S:g} s"])
        service.wait_for("committed batch 0 of")
        (line,) = [line for line in service.lines if "status page on http://" in line]
        port = int(re.search(r":(\d+)/", line)[1])
        # Healthy once batch 0's trigger completed (its report can follow its commit line by
        # seconds on a loaded machine: a first probe answered 503 in a CI run).
        deadline = time.monotonic() + 60
        while _probe(port, "/healthz")[0] != 200 or _probe(port, "/readyz")[0] != 200:
            assert time.monotonic() < deadline, (_probe(port, "/healthz"), _probe(port, "/readyz"))
            time.sleep(0.5)  # condition poll on the probes
        # Idle (every message read) past the stall timeout with the broker answering: healthy.
        # Spark repeats the batch id in idle reports; each is still a completed trigger.
        # Without idle reports counted, it would fail STALL_TIMEOUT_S after batch 0's report.
        idle_until = time.monotonic() + STALL_TIMEOUT_S + IDLE_REPORT_S
        while time.monotonic() < idle_until:
            assert _probe(port, "/healthz")[0] == 200, _probe(port, "/healthz")
            time.sleep(2)  # condition poll on the probe
        proxy.hang()  # every call of the source now waits for an answer that never comes
        deadline = time.monotonic() + 120
        while (answer := _probe(port, "/healthz"))[0] == 200:
            assert time.monotonic() < deadline and service.process.poll() is None, service.tail()
            time.sleep(1)  # condition poll on the probe
        code, body = answer
        (failing,) = body["pipelines"]
        assert code == 503 and failing["name"] == "hang", body
        assert re.fullmatch(r"no trigger completed for \d+ s \(\d+ restart\(s\)\)", failing["reason"]), body
        proxy.restore()  # the broker answers again: the next trigger heals the probe
        deadline = time.monotonic() + 180
        while _probe(port, "/healthz")[0] != 200:
            assert time.monotonic() < deadline and service.process.poll() is None, service.tail()
            time.sleep(1)
        service.signal_all(signal.SIGTERM)
        code, output = service.finish()
        assert code == 0, output[-3000:]
    finally:
        if service is not None and service.process.poll() is None:
            service.process.kill()
        proxy.close()
        broker.stop()


@pytest.mark.parametrize("value", ["5 s", "14s"])
def test_a_stall_timeout_an_idle_pipeline_would_exceed_is_refused(tmp_path, value):
    spec = tmp_path / "p.yml"
    spec.write_text("pipelines: []\n")
    result = CliRunner().invoke(cli, ["run", str(spec), "--status_port", "0", "--stall-timeout", value])
    assert result.exit_code == 2
    assert "shorter than 15 s: Spark reports an idle pipeline's progress every 10 s" in result.output


def test_a_stall_timeout_of_0_never_fails_the_probe(monkeypatch):
    board = StatusBoard()
    board.stall_timeout_s = 0
    board.register("idle", source="kafka i")
    board.set_state("idle", "running")
    later = time.time() + 24 * 3600
    monkeypatch.setattr(time, "time", lambda: later)
    assert board.health()[0]
