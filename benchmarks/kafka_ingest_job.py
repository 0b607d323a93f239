"""Kafka -> Delta as a job: ``deltaflow ingest --ends-at-latest-offsets`` vs a plain Python process.

Produces MESSAGES JSON messages (those of ``kafka_ingest.py``: ~280 bytes, 12 fields) into one
4-partition topic of a local tansu broker, then drains the topic into a new Delta table, each as
a whole process started by this script, timed from ``Popen`` until the process exits (a user
pays Python's and Spark's start-up, so they are in):

* reference: ``python kafka_ingest_job.py --reference ...``: confluent-kafka consume -> pyarrow
  JSON decoding (explicit schema) -> ``write_deltalake`` per ~1M rows (``kafka_ingest.py``'s
  reference).
* deltaflow: ``deltaflow ingest TOPIC TABLE --ends-at-latest-offsets --schema ...`` (the CLI as a
  user runs it; Spark ``local[*]``, the engine ``auto`` picks).

Rounds alternate reference, deltaflow on new tables. Each round checks that both tables hold
every message exactly once and prints the CPU-seconds of each process tree (the JVM and Spark's
Python workers included; ``cpu.py``) and, for deltaflow, when each of its log lines appeared
(seconds since start): where the job's time goes.

    .venv/bin/python benchmarks/kafka_ingest_job.py [--messages 2000000] [--rounds 2] \
        [-- extra deltaflow ingest flags]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cpu import TreeCpu
from kafka_ingest import PARTITIONS, SCHEMA_DDL, check_exactly_once, last_offsets, messages, run_reference
from machine import describe

HERE = Path(__file__).resolve().parent
DELTAFLOW = Path(sys.executable).parent / "deltaflow"


def timed_process(argv: list[str], *, show_lines: bool) -> tuple[float, float, list[tuple[float, str]]]:
    """Run ``argv``; wall seconds, CPU-seconds of its tree, and its stderr lines with their times."""
    lines: list[tuple[float, str]] = []
    started = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu = TreeCpu(process.pid).start()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.append((time.perf_counter() - started, line.rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # The tree's CPU is sampled until the process has exited but before it is reaped.
    while True:
        try:
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
            break
        except ChildProcessError:
            break
    elapsed = time.perf_counter() - started
    seconds = cpu.stop()
    if show_lines:
        split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.by_kind().items(), key=lambda kv: -kv[1]))
        print(f"      CPU-s by process: {split}", flush=True)
    process.wait()
    reader.join(timeout=10)
    if process.returncode != 0:
        tail = "\n".join(line for _, line in lines[-30:])
        raise RuntimeError(f"{argv[0]} exited {process.returncode}:\n{tail}")
    if show_lines:
        for at, line in lines:
            if " deltaflow" in line or "INFO" in line:
                print(f"      +{at:5.1f} s  {line[:150]}", flush=True)
    return elapsed, seconds, lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reference", nargs=4, metavar=("BOOTSTRAP", "TOPIC", "TOTAL", "TABLE"),
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("extra", nargs="*", help="more `deltaflow ingest` flags (after --)")
    args = parser.parse_args()
    if args.reference:
        bootstrap, topic, total, table = args.reference
        run_reference(bootstrap, topic, int(total), table)
        return

    from deltaflow.testing import start_broker

    total = args.messages - args.messages % PARTITIONS
    work = Path(tempfile.mkdtemp(prefix="deltaflow-jobbench-"))
    broker = start_broker()
    try:
        topic = broker.create_topic(partitions=PARTITIONS)
        payload = messages(total)
        print(f"producing {total:,} messages of ~{sum(map(len, payload)) // total} bytes ...", flush=True)
        broker.produce(topic, payload, partitions=PARTITIONS, keys=False, batched=True)
        del payload
        last = last_offsets(broker.bootstrap, topic)
        assert sum(last.values()) == total - PARTITIONS, last
        results = []
        for r in range(1, args.rounds + 1):
            ref_table, df_table = str(work / f"reference-{r}"), str(work / f"deltaflow-{r}")
            print(f"round {r}: load average {os.getloadavg()[0]:.2f}", flush=True)
            ref_s, ref_cpu, _ = timed_process(
                [sys.executable, str(Path(__file__)), "--reference", broker.bootstrap, topic, str(total),
                 ref_table],
                show_lines=False,
            )  # fmt: skip
            print(f"round {r} reference (plain Python): {ref_s:6.2f} s, {ref_cpu:6.2f} CPU-s", flush=True)
            df_s, df_cpu, _ = timed_process(
                [str(DELTAFLOW), "ingest", topic, df_table, "--kafka", broker.bootstrap,
                 "--ends-at-latest-offsets", "--schema", SCHEMA_DDL, "--pipeline-id", "jobbench",
                 "--checkpoint-location", str(work / f"checkpoint-{r}"), *args.extra],
                show_lines=True,
            )  # fmt: skip
            print(f"round {r} deltaflow ingest job  : {df_s:6.2f} s, {df_cpu:6.2f} CPU-s", flush=True)
            check_exactly_once(ref_table, total)
            check_exactly_once(df_table, total)
            results.append((ref_s, ref_cpu, df_s, df_cpu))
            shutil.rmtree(ref_table, ignore_errors=True)
            shutil.rmtree(df_table, ignore_errors=True)
        print()
        import pyspark

        print(describe(f"Spark {pyspark.__version__}"))
        print(f"{total:,} messages, {PARTITIONS} partitions; exactly once: checked")
        for r, (ref_s, ref_cpu, df_s, df_cpu) in enumerate(results, 1):
            print(
                f"round {r}: reference {ref_s:.1f} s ({total / ref_s:,.0f} msgs/s, {ref_cpu:.1f} CPU-s), "
                f"deltaflow {df_s:.1f} s ({total / df_s:,.0f} msgs/s, {df_cpu:.1f} CPU-s), "
                f"ratio {ref_s / df_s:.2f}  (target >= 0.5)"
            )
    finally:
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
