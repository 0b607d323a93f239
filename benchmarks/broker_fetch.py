"""The test broker's share of a many-topics batch: a bare consumer, no Spark, no deltaflow.

While ``many_topics.py steady``'s producer runs (``--rate`` msgs/s over ``--topics`` topics x 2
partitions, message n to topic n % topics, bursts every 10 ms, so record batches of about one
message per partition), this script reads, every ``--every`` seconds, what the partitions
got since its last read, split in two halves of 200 partitions as the ingest's two tasks
split them, one half after the other, with one ``confluent_kafka.Consumer`` each (the
settings of deltaflow's reader) and no decoding. It prints the time each half took and the
partitions' mean depth: tansu's cost of a fetch grows with the record batches a partition
holds, so a steady ingest's tasks slow down as the run goes on, whatever reads them.

    .venv/bin/python benchmarks/broker_fetch.py [--rate 10000] [--seconds 70] [--topics 200]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Collection, Mapping

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]
from kafka_latency import SteadyProducer
from machine import describe

from deltaflow.sources.kafka import _FAST_CONSUMER
from deltaflow.testing import start_broker

Key = tuple[str, int]


def _high_watermarks(admin: object, targets: list[Key]) -> dict[Key, int]:
    request = {TopicPartition(t, p): OffsetSpec.latest() for t, p in targets}  # type: ignore[no-untyped-call]
    futures = admin.list_offsets(request)  # type: ignore[attr-defined]
    return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}


def _read(bootstrap: str, window: Mapping[Key, tuple[int, int]], half: Collection[Key]) -> tuple[int, float]:
    """Messages read and seconds taken to read ``window``'s ranges of the partitions in ``half``."""
    consumer = Consumer(
        {**_FAST_CONSUMER, "bootstrap.servers": bootstrap, "group.id": "fetch", "auto.offset.reset": "error"}
    )
    ranges = {k: (a, b) for k, (a, b) in window.items() if k in half and b > a}
    consumer.assign([TopicPartition(t, p, a) for (t, p), (a, _) in ranges.items()])
    left = {k: b for k, (_, b) in ranges.items()}
    count = 0
    started = time.monotonic()
    while left:
        for message in consumer.consume(num_messages=10_000, timeout=1.0):
            key = (message.topic(), message.partition())
            if message.error() is None and key in left:
                count += 1
                if message.offset() + 1 >= left[key]:
                    del left[key]
    taken = time.monotonic() - started
    consumer.close()
    return count, taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=int, default=10_000, help="messages per second")
    parser.add_argument("--seconds", type=float, default=70.0, help="seconds of producing")
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--every", type=float, default=6.0, help="seconds between two reads")
    args = parser.parse_args()

    broker = start_broker()
    try:
        topics = [broker.create_topic(2) for _ in range(args.topics)]
        targets = [(t, p) for p in range(2) for t in topics]
        halves = [set(targets[: len(targets) // 2]), set(targets[len(targets) // 2 :])]
        admin = broker.admin()
        producer = SteadyProducer(broker.bootstrap, targets, args.rate, args.seconds)
        print(
            f"== {args.rate:,} msgs/s over {args.topics} topics x 2 partitions for {args.seconds:.0f} s; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        producer.start()
        last = _high_watermarks(admin, targets)
        began = time.monotonic()
        while producer.is_alive():
            time.sleep(args.every)
            now = _high_watermarks(admin, targets)
            window = {k: (last[k], now[k]) for k in targets}
            reads = [_read(broker.bootstrap, window, half) for half in halves]
            depth = sum(now.values()) / len(now)
            print(
                f"  +{time.monotonic() - began:5.1f} s, {depth:5.0f} messages per partition: "
                + ", ".join(f"{n:,} in {s:.2f} s ({1e6 * s / max(n, 1):.0f} us each)" for n, s in reads),
                flush=True,
            )
            last = now
        if producer.error is not None:
            raise producer.error
    finally:
        broker.stop()
    print(describe(), flush=True)


if __name__ == "__main__":
    main()
