"""Kafka -> Delta as a job: ``deltaflow ingest --ends-at-latest-offsets`` vs a plain Python process.

Produces MESSAGES JSON messages (those of ``kafka_ingest.py``: ~280 bytes, 12 fields) into one
4-partition topic of a local tansu broker, then drains the topic into a new Delta table, each as
a whole process started by this script, timed from ``Popen`` until the process exits (a user
pays Python's and Spark's start-up, so they are in):

* reference: ``python kafka_ingest_job.py --reference ...``: confluent-kafka consume -> pyarrow
  JSON decoding (explicit schema) -> ``write_deltalake`` per ~1M rows (``kafka_ingest.py``'s
  reference).
* deltaflow: ``deltaflow ingest TOPIC TABLE --ends-at-latest-offsets --schema ...`` (the CLI as a
  user runs it; Spark ``local[*]``, the engine ``auto`` picks): "fresh", a new JVM per job.
* engine (``--engine``): the same ``deltaflow ingest`` command with ``--remote sc://...``: the
  job runs on a resident Spark Connect server (``deltaflow engine start``, on a free port, its
  folder in the run's temp dir) started before the rounds and warmed by one untimed job of the
  same kind (its table checked too); the client process starts no JVM.

Rounds run each side once on new tables (reference, fresh deltaflow; with ``--engine``:
reference, engine, fresh, the order rotating from round to round so that every side sees the
same load; ``--no-fresh`` leaves the fresh-JVM side out). Each round checks that every table
holds every message exactly once and prints the CPU-seconds of each process tree (the JVM and
Spark's Python workers included; ``cpu.py``; for the engine side the server's tree is sampled
apart while the client runs) and, for deltaflow, when each of its log lines appeared (seconds
since the client's start; for the engine side also the server's log lines about the query's
Python processes and its batches): where the job's time goes. With ``--engine`` the server's
process tree is then left idle for ``--idle-seconds`` (30): its CPU (% of one core) and its
RSS/PSS (every process of the tree) are printed, as after the start and after the warm-up.

    .venv/bin/python benchmarks/kafka_ingest_job.py [--messages 2000000] [--rounds 2] \
        [--engine [--no-fresh] [--idle-seconds 30] [--engine-conf KEY=VALUE ...]] \
        [-- extra deltaflow ingest flags]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
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


def timed_process(
    argv: list[str], *, show_lines: bool, server: TreeCpu | None = None, server_log: Path | None = None
) -> tuple[float, float, float, list[tuple[float, str]]]:
    """Run ``argv``; wall seconds, CPU-seconds of its tree, those of ``server`` meanwhile, and its
    stderr lines with their times.

    ``server``: a resident engine's tree, sampled while ``argv`` runs (0.0 without one);
    ``server_log``: its log, whose new lines are timed as they appear.
    """
    lines: list[tuple[float, str]] = []
    follower = LogFollower(server_log) if server_log is not None else None
    started = time.perf_counter()
    if follower is not None:
        follower.start(started)
    if server is not None:
        server.start()
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
    server_lines = follower.stop() if follower is not None else []
    if show_lines:
        split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.by_kind().items(), key=lambda kv: -kv[1]))
        print(f"      client CPU-s by process: {split}", flush=True)
    server_s = 0.0
    if server is not None:
        server_s = server.stop()
        split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(server.by_kind().items(), key=lambda kv: -kv[1]))
        print(f"      engine CPU-s meanwhile: {server_s:.1f} ({split})", flush=True)
    process.wait()
    reader.join(timeout=10)
    if process.returncode != 0:
        tail = "\n".join(line for _, line in lines[-30:])
        raise RuntimeError(f"{argv[0]} exited {process.returncode}:\n{tail}")
    if show_lines:
        timeline = [(at, "client", line) for at, line in lines if " deltaflow" in line or "INFO" in line]
        timeline += [(at, "engine", line) for at, line in server_lines if _notable(line)]
        for at, side, line in sorted(timeline, key=lambda t: t[0]):
            print(f"      +{at:5.1f} s {side}  {line[:150]}", flush=True)
    return elapsed, seconds, server_s, lines


#: Server log lines that mark a query's steps (its Python processes, batches, end).
_SERVER_MARKS = (
    "Starting streaming query",
    "Query ",
    "streaming query",
    "Streaming query",
    "PythonStreaming",
    "foreachBatch",
    "ForeachBatch",
    "Python worker",
    "PythonWorkerFactory",
    "StreamingPythonRunner",
    "DataSource",
    "Starting job",
    "finished in",
    "Committed offsets",
    "Stopped",
    "Closing session",
    "New session",
    "Session with userId",
)


def _notable(line: str) -> bool:
    if "accessed at timestamp" in line or "registered data source" in line:
        return False
    return any(mark in line for mark in _SERVER_MARKS) or "WARN" in line or "ERROR" in line


class LogFollower:
    """The lines appended to a log file, each with the time it was seen (polled every 20 ms)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._lines: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, started: float) -> None:
        handle = open(self._path, errors="replace")  # noqa: SIM115 - closed by the thread
        handle.seek(0, os.SEEK_END)

        def follow() -> None:
            pending = ""
            with handle:
                while True:
                    stopping = self._stop.is_set()
                    chunk = handle.read()
                    now = time.perf_counter() - started
                    if chunk:
                        pending += chunk
                        *complete, pending = pending.split("\n")
                        self._lines += [(now, line) for line in complete]
                    if stopping:
                        return
                    self._stop.wait(0.02)

        self._thread = threading.Thread(target=follow, daemon=True)
        self._thread.start()

    def stop(self) -> list[tuple[float, str]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self._lines


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tree_memory(pid: int) -> tuple[int, int, int]:
    """RSS and PSS (bytes) of ``pid`` and its descendants, and how many processes that is."""
    import psutil

    root = psutil.Process(pid)
    rss = pss = count = 0
    for p in [root, *root.children(recursive=True)]:
        try:
            info = p.memory_full_info()
        except psutil.Error:
            continue
        rss, pss, count = rss + info.rss, pss + info.pss, count + 1
    return rss, pss, count


def describe_memory(label: str, pid: int) -> str:
    rss, pss, count = tree_memory(pid)
    return f"{label}: RSS {rss / 2**20:,.0f} MiB, PSS {pss / 2**20:,.0f} MiB ({count} processes)"


class Engine:
    """A resident engine for the run (``deltaflow engine start``), stopped by :meth:`stop`."""

    def __init__(self, folder: Path, conf: list[str] | None = None) -> None:
        self.folder = folder
        self.port = free_port()
        argv = [str(DELTAFLOW), "engine", "start", "--dir", str(folder), "--port", str(self.port),
                "--master", "local[*]", *(f"--conf={c}" for c in conf or [])]  # fmt: skip
        began = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        self.start_s = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(
                f"deltaflow engine start exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        self.url = done.stdout.strip().splitlines()[-1]
        self.status = self.read_status()
        self.pid = int(self.status["pid"])
        self.log = Path(self.status["log"])

    def read_status(self) -> dict:
        argv = [str(DELTAFLOW), "engine", "status", "--dir", str(self.folder), "--json"]
        return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)

    def idle(self, seconds: float) -> str:
        """The tree's CPU (% of one core) over ``seconds`` with no client, and its memory after."""
        cpu = TreeCpu(self.pid, interval=1.0).start()
        time.sleep(seconds)
        used = cpu.stop()
        split = ", ".join(f"{k} {v:.2f}" for k, v in sorted(cpu.by_kind().items(), key=lambda kv: -kv[1]))
        clients = self.read_status()["clients"]
        return (
            f"idle {seconds:.0f} s ({clients} clients): CPU {used:.2f} CPU-s = "
            f"{100 * used / seconds:.1f}% of one core ({split}); {describe_memory('then', self.pid)}"
        )

    def stop(self) -> None:
        subprocess.run([str(DELTAFLOW), "engine", "stop", "--dir", str(self.folder)], capture_output=True,
                       check=False)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--messages", type=int, default=2_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--engine", action="store_true", help="also run the job on a resident engine")
    parser.add_argument("--no-fresh", action="store_true", help="with --engine: leave the fresh-JVM side out")
    parser.add_argument("--idle-seconds", type=float, default=30.0, help="the engine's idle measurement")
    parser.add_argument("--engine-conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for `deltaflow engine start --conf` (repeatable)")  # fmt: skip
    parser.add_argument("--reference", nargs=4, metavar=("BOOTSTRAP", "TOPIC", "TOTAL", "TABLE"),
                        help=argparse.SUPPRESS)  # fmt: skip
    parser.add_argument("extra", nargs="*", help="more `deltaflow ingest` flags (after --)")
    args = parser.parse_args()
    if args.reference:
        bootstrap, topic, total, table = args.reference
        run_reference(bootstrap, topic, int(total), table)
        return
    sides = [
        "reference",
        *(["engine"] if args.engine else []),
        *([] if args.no_fresh and args.engine else ["fresh"]),
    ]

    from deltaflow.testing import start_broker

    total = args.messages - args.messages % PARTITIONS
    work = Path(tempfile.mkdtemp(prefix="deltaflow-jobbench-"))
    broker = start_broker()
    engine: Engine | None = None
    engine_lines: list[str] = []
    try:
        topic = broker.create_topic(partitions=PARTITIONS)
        payload = messages(total)
        print(f"producing {total:,} messages of ~{sum(map(len, payload)) // total} bytes ...", flush=True)
        broker.produce(topic, payload, partitions=PARTITIONS, keys=False, batched=True)
        del payload
        last = last_offsets(broker.bootstrap, topic)
        assert sum(last.values()) == total - PARTITIONS, last

        def ingest_argv(table: str, checkpoint: str, remote: str | None) -> list[str]:
            return [str(DELTAFLOW), "ingest", topic, table, "--kafka", broker.bootstrap,
                    "--ends-at-latest-offsets", "--schema", SCHEMA_DDL, "--pipeline-id", "jobbench",
                    "--checkpoint-location", checkpoint, *(["--remote", remote] if remote else []),
                    *args.extra]  # fmt: skip

        if args.engine:
            print(f"load average before the engine's start: {os.getloadavg()[0]:.2f}", flush=True)
            engine = Engine(work / "engine", args.engine_conf)
            engine_lines.append(
                f"engine {engine.url} (pid {engine.pid}) started in {engine.start_s:.1f} s "
                "(`deltaflow engine start`)"
            )
            engine_lines.append(describe_memory("after its start", engine.pid))
            print(engine_lines[-2], "\n" + engine_lines[-1], flush=True)
            warm_table = str(work / "engine-warm-up")
            warm_s, warm_cpu, warm_server, _ = timed_process(
                ingest_argv(warm_table, str(work / "checkpoint-warm-up"), engine.url),
                show_lines=True, server=TreeCpu(engine.pid), server_log=engine.log,
            )  # fmt: skip
            check_exactly_once(warm_table, total)
            shutil.rmtree(warm_table, ignore_errors=True)
            engine_lines.append(
                f"warm-up job (untimed): {warm_s:.1f} s, {warm_cpu:.1f} + {warm_server:.1f} CPU-s"
                " (client + engine)"
            )
            engine_lines.append(describe_memory("after the warm-up", engine.pid))
            print(engine_lines[-2], "\n" + engine_lines[-1], flush=True)

        results: list[dict[str, tuple[float, float, float, float]]] = []
        for r in range(1, args.rounds + 1):
            shift = (r - 1) % len(sides)
            order = sides[shift:] + sides[:shift]
            print(f"round {r}: order {', '.join(order)}", flush=True)
            row: dict[str, tuple[float, float, float, float]] = {}
            for side in order:
                table = str(work / f"{side}-{r}")
                load = os.getloadavg()[0]
                print(f"round {r} {side}: load average {load:.2f}", flush=True)
                if side == "reference":
                    argv = [sys.executable, str(Path(__file__)), "--reference", broker.bootstrap, topic,
                            str(total), table]  # fmt: skip
                    seconds, cpu_s, server_s, _ = timed_process(argv, show_lines=False)
                else:
                    remote = engine.url if side == "engine" and engine is not None else None
                    argv = ingest_argv(table, str(work / f"checkpoint-{side}-{r}"), remote)
                    seconds, cpu_s, server_s, _ = timed_process(
                        argv, show_lines=True,
                        server=TreeCpu(engine.pid) if remote and engine else None,
                        server_log=engine.log if remote and engine else None,
                    )  # fmt: skip
                print(f"round {r} {side:9}: {seconds:6.2f} s, {cpu_s:6.2f} CPU-s (client tree)", flush=True)
                if side == "engine" and engine is not None:
                    engine_lines.append(describe_memory(f"after round {r}", engine.pid))
                    print(f"      engine {engine_lines[-1]}", flush=True)
                check_exactly_once(table, total)
                shutil.rmtree(table, ignore_errors=True)
                row[side] = (seconds, cpu_s, server_s, load)
            results.append(row)
        if engine is not None:
            print(f"the engine idles for {args.idle_seconds:.0f} s ...", flush=True)
            engine_lines.append(engine.idle(args.idle_seconds))
            print(engine_lines[-1], flush=True)
        print()
        import pyspark

        print(describe(f"Spark {pyspark.__version__}"))
        print(f"{total:,} messages, {PARTITIONS} partitions; every table exactly once: checked")
        for line in engine_lines:
            print(line)
        print("(each side: wall s of the client process, msgs/s, CPU-s of its tree [+ the engine's], load")
        print(" average before it; ratio = reference s / side s)")
        for r, row in enumerate(results, 1):
            ref_s, ref_cpu, _, ref_load = row["reference"]
            ref_text = f"{ref_s:.2f} s ({total / ref_s:,.0f}, {ref_cpu:.1f} CPU-s, {ref_load:.2f})"
            parts = [f"round {r}: reference {ref_text}"]
            for side in sides[1:]:
                s_, c_, server_s, load = row[side]
                cpu_text = f"{c_:.1f} + {server_s:.1f} CPU-s" if side == "engine" else f"{c_:.1f} CPU-s"
                parts.append(
                    f"{side} {s_:.2f} s ({total / s_:,.0f}, {cpu_text}, {load:.2f}) ratio {ref_s / s_:.2f}"
                )
            print(", ".join(parts))
    finally:
        if engine is not None:
            engine.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
