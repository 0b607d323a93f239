"""The example systemd unit (examples/systemd) run as systemd runs it: its ExecStart with its
EnvironmentFile, stopped with SIGTERM to every process of the unit (KillMode=control-group),
SIGKILL after TimeoutStopSec. Only the addresses of the real broker and lake are swapped in."""

from __future__ import annotations

import configparser
import json
import os
import shlex
import signal
import time
from pathlib import Path

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from tests.fixtures.service import NOT_CLEAN, ROOT, Service

EXAMPLE = ROOT / "examples" / "systemd"
ROWS = 300  # per topic


def _unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    unit.read(EXAMPLE / "deltaflow.service")
    return unit


def _environment_file() -> dict[str, str]:
    """``KEY=VALUE`` lines as systemd reads an EnvironmentFile (comments and blanks skipped,
    one pair of surrounding quotes removed)."""
    env = {}
    for line in (EXAMPLE / "deltaflow.env").read_text().splitlines():
        if not line.strip() or line.lstrip().startswith(("#", ";")):
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def _seconds(value: str) -> float:
    return float(value.removesuffix("s"))


def test_the_example_unit_runs_and_stops_cleanly_as_systemd_stops_it(kafka, tmp_path):
    service_section = _unit()["Service"]
    assert service_section.get("KillMode", "control-group") == "control-group"
    assert service_section["Restart"] == "on-failure"
    env_file = _environment_file()
    stop_timeout = _seconds(service_section["TimeoutStopSec"])
    assert _seconds(env_file["DELTAFLOW_STOP_TIMEOUT"]) < stop_timeout  # deltaflow ends a slow stop itself

    # The unit's command: the installed `deltaflow` is this checkout's; its files are the examples.
    executable, *args = shlex.split(service_section["ExecStart"])
    assert executable.endswith("/bin/deltaflow")
    args = [str(EXAMPLE / "pipelines.yaml") if a == "/etc/deltaflow/pipelines.yaml" else a for a in args]
    prefix = f"shop{os.getpid()}x{int(time.time())}"
    env = {**os.environ, **env_file}
    lake = str(tmp_path / "lake")
    env.update(KAFKA_BROKERS=kafka.bootstrap, TOPIC_PREFIX=prefix, LAKE=lake, STATUS_PORT="0")
    topics = [kafka.create_topic(partitions=2, name=f"{prefix}.{name}") for name in ("orders", "payments")]
    for topic in topics:
        kafka.produce(topic, [f'{{"id": {i}, "name": "n{i}"}}'.encode() for i in range(ROWS)], partitions=2)

    service = Service(args, env=env)
    try:
        tables = [tmp_path / "lake" / name for name in ("orders", "payments")]
        deadline = time.monotonic() + 240
        while not all(_count(table) == ROWS for table in tables):
            assert service.process.poll() is None and time.monotonic() < deadline, service.tail()
            time.sleep(0.5)  # condition poll on the tables
        started = time.monotonic()
        service.signal_all(signal.SIGTERM)  # systemctl stop
        code, output = service.finish(timeout=stop_timeout)  # else systemd would SIGKILL
    finally:
        if service.process.poll() is None:
            service.process.kill()
    assert time.monotonic() - started < stop_timeout
    assert code == 0, output[-5000:]  # Restart=on-failure: a clean stop is not restarted
    unclean = [line for line in output.splitlines() if any(word in line for word in NOT_CLEAN)]
    assert not unclean, output[-5000:]
    assert "stopped by SIGTERM" in output
    if env_file.get("DELTAFLOW_LOG_FORMAT") == "json":  # the unit's log pipeline gets records only
        # (The output joins standard output, where `run` prints its result: the summary line.)
        lines = [x for x in output.splitlines() if x.strip() and not x.startswith("shop-bronze: ")]
        not_json = [line for line in lines if not line.startswith("{")]
        assert not not_json, not_json[:10]
        records = [json.loads(line) for line in lines]
        assert all(isinstance(r, dict) and {"ts", "level", "logger", "msg"} <= r.keys() for r in records)
    for table in tables:
        ids = DeltaTable(str(table)).to_pyarrow_table(columns=["id"])["id"].to_pylist()
        assert sorted(ids) == list(range(ROWS))


def _count(table: Path) -> int:
    try:
        return DeltaTable(str(table)).to_pyarrow_table(columns=["id"]).num_rows
    except TableNotFoundError:  # not made yet
        return 0
