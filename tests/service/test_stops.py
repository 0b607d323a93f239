"""Stopping a service as systemd, a container init and Ctrl-C do: a signal to every process of
it (the driver, its JVM, Spark's Python workers), mid-batch. CLI processes against the broker."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from deltalake import DeltaTable

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 100_000
#: Lines a clean stop never prints: errors, Python tracebacks, Java traces.
NOT_CLEAN = ("ERROR", "Traceback", "\tat ", "Exception in thread")


def _messages(first: int, count: int) -> list[bytes]:
    return [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(first, first + count)]


class _Service:
    """A CLI process in a session of its own (its process group), its output collected."""

    def __init__(self, args: list[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "deltaflow.cli", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.seen: set[int] = set()  # every process of the service a signal was sent to
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, count: int = 1, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while sum(text in line for line in self.lines) < count:
            assert self.process.poll() is None, "".join(self.lines)[-5000:]
            assert time.monotonic() < deadline, f"no {text!r} within {timeout} s"
            time.sleep(0.1)  # condition poll on the process's output

    def children_named(self, name: str) -> list[psutil.Process]:
        """The service's processes called ``name``; short-lived ones (a Python worker that ends
        between the listing and the look) are passed over."""
        found = []
        for process in psutil.Process(self.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if process.name() == name:
                    found.append(process)
        return found

    def signal_all(self, number: int) -> None:
        """``number`` to every process of the service, as systemd's default KillMode
        (control-group) sends it: the CLI, its JVM and every Python process Spark started,
        whatever their process group (pyspark's worker daemon makes a group of its own)."""
        root = psutil.Process(self.process.pid)
        tree = [root, *root.children(recursive=True)]
        self.seen |= {p.pid for p in tree}
        os.killpg(self.process.pid, number)
        for process in tree:  # once each: those of other process groups
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                if os.getpgid(process.pid) != self.process.pid:
                    process.send_signal(number)

    def finish(self, timeout: float = 180) -> tuple[int, str]:
        code = self.process.wait(timeout)
        deadline = time.monotonic() + 30
        while self._left() and time.monotonic() < deadline:
            time.sleep(0.2)  # the JVM and Spark's workers end once their input closes
        assert not self._left(), f"processes of the service left running: {self._left()}"
        time.sleep(0.5)  # the pump reads the last lines
        return code, "".join(self.lines)

    def _left(self) -> list[str]:
        alive = []
        for pid in self.seen - {self.process.pid}:
            with contextlib.suppress(psutil.NoSuchProcess):
                process = psutil.Process(pid)
                if process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(" ".join(process.cmdline()[:3]))
        return alive


def _ids(table: Path) -> list[int]:
    return sorted(DeltaTable(str(table)).to_pyarrow_table(columns=["id"])["id"].to_pylist())


def _ingest(kafka, topic: str, table: Path, *extra: str) -> list[str]:
    return ["ingest", topic, str(table), "--kafka", kafka.bootstrap, "--app_id", "svc", *extra]


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_process_group_stops_ingest_cleanly_and_loses_nothing(kafka, tmp_path, number):
    topic = kafka.create_topic(partitions=4)
    kafka.produce(topic, _messages(0, MESSAGES), partitions=4, batched=True)
    table = tmp_path / "t"
    service = _Service(
        _ingest(kafka, topic, table, "--allowed_latency", "1", "--max_messages_per_batch", "10000")
    )
    service.wait_for("committed batch 1 of")  # mid-run: more batches wait
    service.signal_all(number)
    code, output = service.finish()
    assert code == 0, output[-5000:]
    assert f"stopped by {signal.Signals(number).name}" in output
    assert not [line for line in output.splitlines() if any(word in line for word in NOT_CLEAN)], output[
        -5000:
    ]
    landed = _ids(table)
    assert landed == sorted(set(landed)) and 0 < len(landed) < MESSAGES
    if number == signal.SIGTERM:  # the next start takes the rest, nothing twice
        rest = subprocess.run(
            [
                sys.executable,
                "-m",
                "deltaflow.cli",
                *_ingest(kafka, topic, table, "--ends_at_latest_offsets"),
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert rest.returncode == 0, rest.stderr[-3000:]
        assert _ids(table) == list(range(MESSAGES))


def test_run_stops_every_pipeline_cleanly_on_a_signal_to_its_group(kafka, tmp_path):
    topics = [kafka.create_topic(partitions=2) for _ in range(2)]
    for topic in topics:
        kafka.produce(topic, _messages(0, MESSAGES // 2), partitions=2, batched=True)
    pipelines = {
        "pipelines": [
            {
                "id": f"p{i}",
                "engine": "arrow",
                "source": {
                    "type": "kafka",
                    "bootstrap_servers": kafka.bootstrap,
                    "topic": topic,
                    "schema": "id LONG, name STRING",
                    "max_messages_per_batch": 5000,
                },
                "sinks": [{"table_uri": str(tmp_path / f"t{i}")}],
            }
            for i, topic in enumerate(topics)
        ]
    }
    spec = tmp_path / "pipelines.yml"
    spec.write_text(json.dumps(pipelines))  # JSON is YAML
    service = _Service(["run", str(spec)])
    service.wait_for("committed batch 1 of", count=2)
    # Every pipeline on the Arrow engine: the JVM only plans, with its quick compiler.
    (java,) = service.children_named("java")
    assert "-XX:TieredStopAtLevel=1" in java.cmdline()
    service.signal_all(signal.SIGTERM)
    code, output = service.finish()
    assert code == 0, output[-5000:]
    assert not [line for line in output.splitlines() if any(word in line for word in NOT_CLEAN)], output[
        -5000:
    ]
    for i in range(2):
        landed = _ids(tmp_path / f"t{i}")
        assert landed == sorted(set(landed)) and landed
