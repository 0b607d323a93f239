"""Many topics in one query: ``deltaflow ingest --topic_pattern REGEX TEMPLATE`` as a user runs it.

Every run is the CLI as a subprocess of this script (the whole process tree: the CLI's Python
driver, Spark's JVM and the Python processes Spark starts), against a fresh local tansu broker
(``deltaflow.testing.start_broker``), tables on local disk in a temporary folder. Topics are
``<prefix>.t000`` ... with 2 partitions, read by ``--topic_pattern '<prefix>\\.(.*)'`` into
``<lake>/{1}``. Messages are those of ``kafka_ingest.py`` (~280 bytes, 12 JSON fields). Each
partition's last message is produced in a record batch of its own (tansu reports a
partition's high watermark as the base offset of its last record batch + 1).

Phases (``all`` runs them in this order):

* ``footprint``: for each of ``--counts`` (1, 10, 50, 200) topics x 2 partitions x 1,000
  messages per partition, ``deltaflow ingest --topic_pattern ... --allowed_latency 5`` (columns
  inferred from the messages, as without ``--schema``; ``--given-schema`` passes ``--schema``).
  Once every table has its first commit (the first version naming a micro-batch,
  ``deltaflow.epoch``; polled every 0.25 s, its time is the commit file's mtime): the live
  processes of the tree (zombies listed, not counted) and their PSS
  (``/proc/<pid>/smaps_rollup``), and the seconds from ``Popen`` until the last table's first
  commit. Then ``--idle`` seconds (30) with no new messages: the CPU of the tree (user +
  system, ``cpu.py``) as % of one core. The tree is also sampled every second for its largest
  process count and PSS. Last: the marginal cost of one more topic (least-squares slope over
  the counts, and the difference between the smallest and the largest count).
* ``drain``: ``--messages`` (1M) spread over ``--drain-topics`` (200) topics x 2 partitions
  (``--topic_pattern``) vs the same messages in one 4-partition topic (``deltaflow ingest
  TOPIC TABLE``), both ``--ends_at_latest_offsets`` with columns inferred (``--given-schema``:
  given); wall time from ``Popen`` until the process exits, and the tree's CPU. Each run has
  a fresh broker and checks every message landed exactly once (ids). ``--rounds`` alternates.
* ``steady``: ``--rate`` (10,000) msgs/s for ``--seconds`` (60) spread round-robin over
  ``--steady-topics`` (200) topics x 2 partitions (a burst every 10 ms, ``linger.ms`` 5), each
  message carrying ``produced_us`` (wall clock right before ``produce()``), while ``deltaflow
  ingest --topic_pattern ... --allowed_latency 5 --schema ...`` runs (started, and its first
  trigger run, before producing). Afterwards one single-record marker per partition; once
  every table holds every offset the CLI is stopped and the tables' Delta logs are read:
  latency of a row = its commit file's mtime - ``produced_us`` (rows of the first
  ``--warmup`` 10 s left out). The commit phase of each batch, for all its tables: from the
  end of its last task (newest mtime of the batch's data files, ``part-b<N>-...``) to its
  last commit file, and the span between the first and the last ``committed batch N ... to
  <table>`` line of the driver log. The run writes Spark's event log (``SPARK_CONF_DIR`` with
  a ``spark-defaults.conf``): each batch's ``durationMs`` and a timeline (trigger, offsets
  logged, job submitted by the foreachBatch function, tasks, commits, Spark's commit log).
  ``--profile FILE``: ``py-spy record`` of the whole tree while producing (collapsed stacks;
  ``pip install py-spy``).

Each wait is bounded (``--timeout``, 600 s); on a timeout the tree's Python stacks are dumped
(py-spy, when installed) and the run fails. Brokers, processes and temporary folders are
stopped and removed in every case.

    .venv/bin/python benchmarks/many_topics.py [all|footprint|drain|steady ...] \
        [--counts 1,10,50,200] [--idle 30] [--messages 1000000] [--rounds 1] [--given-schema] \
        [--rate 10000] [--seconds 60] [--steady-topics 200] [--profile FILE]

Targets (the issue): <= 12 processes and <= 1.5 GiB PSS whatever the topic count; every
table's first commit <= 60 s from start; 1M over 200 topics <= 1.25x one 4-partition topic;
steady p99 <= 10 s and commit phase <= 2 s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import psutil
import pyarrow.parquet as pq
from cpu import TreeCpu
from kafka_ingest import SCHEMA_DDL, messages
from kafka_latency import SteadyProducer
from machine import describe

DELTAFLOW = Path(sys.executable).parent / "deltaflow"
PARTITIONS = 2  # per topic of the pattern
SINGLE_PARTITIONS = 4  # the one topic the drain compares with
PIPELINE = "many"
LATENCY_SCHEMA = f"{SCHEMA_DDL}, produced_us LONG"
BURST_EVERY_S = 0.01
GIB = 1024**3
MIB = 1024**2
#: The CLI's log format (``deltaflow.io.logs.FORMAT``): asctime with milliseconds.
LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) (\S+): (.*)$")
COMMITTED = re.compile(
    r"committed batch (\d+) of '[^']*' to (\S+): version (\d+), (\d+) file\(s\), (\d+) row"
)

#: More flags of the footprint and drain runs (``--given-schema``: ``--schema`` instead of inference).
EXTRA_FLAGS: list[str] = []

TARGET_PROCESSES = 12
TARGET_PSS = 1.5 * GIB
TARGET_FIRST_COMMIT_S = 60.0
TARGET_DRAIN_RATIO = 1.25
TARGET_P99_S = 10.0
TARGET_COMMIT_PHASE_S = 2.0


# -- the process tree -------------------------------------------------------------------------


def pss_bytes(pid: int) -> int:
    """The PSS of one process (``Pss:`` of ``/proc/<pid>/smaps_rollup``); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def kind(p: psutil.Process) -> str:
    """A short name for a process of the tree: ``jvm``, ``cli driver``, the Python module Spark
    started (``daemon worker``: pyspark's daemon for ``pyspark.worker``; ``... (forked)``: a
    process the daemon forked), ``zombie ...``."""
    try:
        if p.status() == psutil.STATUS_ZOMBIE:
            return f"zombie {p.name()}"
        if p.name() == "java":
            return "jvm"
        cmd = p.cmdline()
        forked = p.parent() is not None and p.parent().name() != "java"
    except psutil.Error:
        return "gone"
    if len(cmd) > 1 and cmd[1].endswith("/deltaflow"):
        return "cli driver"
    if "-m" in cmd[:-1]:
        i = cmd.index("-m")
        words = [w.rsplit(".", 1)[-1] for w in cmd[i + 1 : i + 3]]
        return " ".join(words) + (" (forked)" if forked else "")
    return os.path.basename(cmd[0]) if cmd else p.name()


def live(rows: list[tuple[int, str, int]]) -> int:
    return sum(1 for r in rows if not r[1].startswith(("zombie", "gone")))


class Tree:
    """A CLI process (its own session) and the processes below it."""

    def __init__(self, argv: Sequence[str], log: Path, event_log: Path | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ)
        if event_log is not None:  # Spark's event log (the queries' progress) via spark-defaults.conf
            conf = event_log.parent / "spark-conf"
            conf.mkdir()
            event_log.mkdir()
            (conf / "spark-defaults.conf").write_text(
                f"spark.eventLog.enabled true\nspark.eventLog.compress false\n"
                f"spark.eventLog.dir file://{event_log}\n"
            )
            env["SPARK_CONF_DIR"] = str(conf)
        self.wall_start = time.time()
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        self.root = psutil.Process(self.process.pid)
        self.seen: set[int] = {self.process.pid}
        self.max_processes = 0
        self.max_pss = 0
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample_loop, daemon=True)
        self._sampler.start()

    def members(self) -> list[psutil.Process]:
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []
        self.seen.update(p.pid for p in tree)
        return tree

    def snapshot(self) -> tuple[int, int, list[tuple[int, str, int]]]:
        """Live processes (zombies not counted), their summed PSS, and (pid, kind, PSS) of each."""
        rows = [(p.pid, kind(p), pss_bytes(p.pid)) for p in self.members()]
        return live(rows), sum(r[2] for r in rows), rows

    def _sample_loop(self) -> None:
        while not self._stop.wait(1.0):
            count, pss, _ = self.snapshot()
            self.max_processes = max(self.max_processes, count)
            self.max_pss = max(self.max_pss, pss)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def exited(self, timeout: float) -> bool:
        """Wait until the CLI has exited, without reaping it (its tree's CPU can still be read)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                    return True
            except ChildProcessError:
                return True
            time.sleep(0.05)
        return False

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM to the CLI (a graceful stop), then SIGKILL to whatever of its tree is left."""
        self.members()
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            print(f"    the CLI did not stop within {timeout:.0f} s of SIGTERM: killing its tree", flush=True)
        self._stop.set()
        for pid in sorted(self.seen):  # only processes this run started
            try:
                p = psutil.Process(pid)
                if p.create_time() <= self.wall_start - 1:  # a pid reused by someone else
                    continue
                p.kill()
            except psutil.Error:
                pass
        self.wait(10)
        self._log.close()
        return code

    def lines(self) -> list[tuple[float, str, str, str]]:
        """The CLI's log records: (wall clock, level, logger, message)."""
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            m = LOG_LINE.match(line)
            if m:
                at = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out.append((at, m.group(2), m.group(3), m.group(4)))
        return out

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def py_spy(self) -> None:
        """Stacks of the tree's Python processes (py-spy, when installed), into the log."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(spy).exists():
            print("    (py-spy is not installed: no stacks)", flush=True)
            return
        for p in self.members():
            if kind(p) in ("jvm", "gone"):
                continue
            out = subprocess.run(
                [spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=60
            )
            print(f"    py-spy dump of {p.pid} ({kind(p)}):\n{out.stdout}{out.stderr}", flush=True)


def print_tree(rows: list[tuple[int, str, int]]) -> None:
    for pid, what, pss in sorted(rows, key=lambda r: -r[2]):
        print(f"      {pid:>7}  {pss / MIB:8.1f} MiB  {what}", flush=True)


#: Per-table log lines, summed up (first and last time, count) instead of printed one by one.
PER_TABLE = {
    "created Delta table": "created Delta table",
    "writes .* as epoch": "claimed (writes ... as epoch)",
    "committed batch": "committed batch ... to <table>",
}


def print_log(tree: Tree, pattern: str = r"INFO deltaflow|WARNING|ERROR", limit: int = 40) -> None:
    """The CLI's own log lines, seconds since ``Popen``; per-table lines summed up."""
    shown = 0
    grouped: dict[str, list[float]] = {}
    for at, level, name, message in tree.lines():
        if not re.search(pattern, f"{level} {name}"):
            continue
        group = next((label for rx, label in PER_TABLE.items() if re.search(rx, message)), None)
        if group is not None:
            grouped.setdefault(group, []).append(at - tree.wall_start)
        elif shown < limit:
            print(f"      +{at - tree.wall_start:6.1f} s {level} {name}: {message[:150]}", flush=True)
            shown += 1
    for label, times in grouped.items():
        print(f"      {len(times)} x '{label}' from +{min(times):.1f} to +{max(times):.1f} s", flush=True)


# -- topics and messages ----------------------------------------------------------------------


def topic_names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}.t{i:03d}" for i in range(count)]


def create_topics(broker, topics: Sequence[str], partitions: int) -> None:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = broker.admin()
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1) for t in topics]
    )
    for f in futures.values():
        f.result(timeout=60)
    deadline = time.monotonic() + 60
    while not set(topics) <= set(admin.list_topics(timeout=10).topics):
        assert time.monotonic() < deadline, "topics not listed 60 s after their creation"
        time.sleep(0.2)


def produce(bootstrap: str, targets: Sequence[tuple[str, int]], payload: Sequence[bytes]) -> None:
    """Message i to ``targets[i % len(targets)]`` (topic, partition), batched, except each
    target's last message, which goes in a record batch of its own."""
    from confluent_kafka import Producer

    bulk = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000})
    single = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    n = len(targets)
    tails = set(range(max(0, len(payload) - n), len(payload)))

    def send(producer, i: int) -> None:
        topic, partition = targets[i % n]
        while True:
            try:
                producer.produce(topic, payload[i], partition=partition)
                return
            except BufferError:
                producer.poll(0.05)

    for i in range(len(payload)):
        if i not in tails:
            send(bulk, i)
            if i % 1000 == 0:
                bulk.poll(0)
    assert bulk.flush(300) == 0
    for i in sorted(tails):
        send(single, i)
    assert single.flush(120) == 0


def high_watermarks(bootstrap: str, targets: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        return {
            (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1] for t, p in targets
        }
    finally:
        consumer.close()


def pattern_argv(prefix: str, lake: Path, bootstrap: str, checkpoint: Path, *extra: str) -> list[str]:
    return [
        str(DELTAFLOW), "ingest", "--topic_pattern", rf"{re.escape(prefix)}\.(.*)", f"{lake}/{{1}}",
        "--kafka", bootstrap, "--pipeline-id", PIPELINE, "--checkpoint-location", str(checkpoint), *extra,
    ]  # fmt: skip


# -- reading the tables -----------------------------------------------------------------------


def log_versions(table: Path) -> list[tuple[int, float, dict]]:
    """(version, commit file mtime, {"adds": [...], "epoch": ..., "txns": n}) of each version."""
    out = []
    for path in sorted((table / "_delta_log").glob("*.json")):
        try:
            version = int(path.stem)
        except ValueError:
            continue
        adds, epoch, txns = [], None, 0
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "add" in action and action["add"].get("dataChange", True):
                adds.append(unquote(action["add"]["path"]))
            elif "txn" in action:
                txns += 1
            elif "commitInfo" in action:
                epoch = action["commitInfo"].get("deltaflow.epoch", epoch)
        out.append((version, path.stat().st_mtime, {"adds": adds, "epoch": epoch, "txns": txns}))
    return out


class FirstCommits:
    """When each table got its first batch commit (a version whose commitInfo names its
    micro-batch, ``deltaflow.epoch``; the writer's claim before it does not)."""

    def __init__(self, tables: Sequence[Path]) -> None:
        self.pending = {t: 0 for t in tables}  # table -> next version to look at
        self.first: dict[Path, float] = {}  # table -> the commit file's mtime

    def poll(self) -> bool:
        for table, version in list(self.pending.items()):
            while True:
                path = table / "_delta_log" / f"{version:020d}.json"
                try:
                    text = path.read_text()
                    mtime = path.stat().st_mtime
                except FileNotFoundError:
                    break
                if not text.endswith("\n") and '"commitInfo"' not in text:
                    break  # being written (a local commit is a rename, but be safe)
                version += 1
                if '"deltaflow.epoch"' in text:
                    self.first[table] = mtime
                    del self.pending[table]
                    break
            if table in self.pending:
                self.pending[table] = version
        return not self.pending


def txn_versions(table: Path, topic: str, partitions: int) -> list[int | None]:
    from deltalake import DeltaTable

    try:
        t = DeltaTable(str(table))
    except Exception:  # noqa: BLE001 - not made yet
        return [None] * partitions
    return [t.transaction_version(f"{PIPELINE}-{topic}-{p}") for p in range(partitions)]


def ids_of(tables: Sequence[Path]) -> np.ndarray:
    from deltalake import DeltaTable

    parts = [DeltaTable(str(t)).to_pyarrow_table(columns=["id"])["id"].to_numpy() for t in tables]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


@dataclass
class BatchEvents:
    """One micro-batch as Spark's event log tells it (wall clock seconds)."""

    progress: dict | None = None
    job_submitted: float | None = None  # the foreachBatch function's collect() started the job
    job_ended: float | None = None
    task_launches: list[float] = field(default_factory=list)
    task_finishes: list[float] = field(default_factory=list)
    task_run_s: float = 0.0  # the tasks' executor run time, summed


def spark_events(folder: Path) -> dict[int, BatchEvents]:
    """Each batch's progress report (``durationMs`` ...), job and tasks, from Spark's event log."""
    batches: dict[int, BatchEvents] = {}
    job_batch: dict[int, int] = {}
    stage_job: dict[int, int] = {}
    for path in sorted(p for p in folder.rglob("events_*") if p.is_file()):  # Spark 4: eventlog_v2_*/
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            name = event.get("Event", "")
            if name.endswith("QueryProgressEvent"):
                progress = event["progress"]
                batches.setdefault(int(progress["batchId"]), BatchEvents()).progress = progress
            elif name == "SparkListenerJobStart":
                batch = (event.get("Properties") or {}).get("streaming.sql.batchId")
                if batch is None:
                    continue
                job_batch[event["Job ID"]] = int(batch)
                batches.setdefault(int(batch), BatchEvents()).job_submitted = event["Submission Time"] / 1000
                for stage in event.get("Stage IDs", []):
                    stage_job[stage] = event["Job ID"]
            elif name == "SparkListenerJobEnd" and event["Job ID"] in job_batch:
                batches[job_batch[event["Job ID"]]].job_ended = event["Completion Time"] / 1000
            elif name == "SparkListenerTaskEnd" and stage_job.get(event["Stage ID"]) in job_batch:
                b = batches[job_batch[stage_job[event["Stage ID"]]]]
                info = event["Task Info"]
                b.task_launches.append(info["Launch Time"] / 1000)
                b.task_finishes.append(info["Finish Time"] / 1000)
                b.task_run_s += (event.get("Task Metrics") or {}).get("Executor Run Time", 0) / 1000
    return batches


def pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


# -- phase 1: footprint -----------------------------------------------------------------------


def footprint_run(count: int, per_partition: int, idle_s: float, work: Path, timeout_s: float) -> dict:
    from deltaflow.testing import start_broker

    run_dir = work / f"footprint-{count}"
    lake = run_dir / "lake"
    run_dir.mkdir()
    prefix = f"fp{uuid.uuid4().hex[:6]}"
    topics = topic_names(prefix, count)
    broker = start_broker()
    tree = None
    try:
        create_topics(broker, topics, PARTITIONS)
        targets = [(t, p) for p in range(PARTITIONS) for t in topics]
        produce(broker.bootstrap, targets, messages(per_partition) * len(targets))
        print(
            f"  {count} topic(s) x {PARTITIONS} partitions x {per_partition:,} messages produced; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        tables = [lake / t.split(".", 1)[1] for t in topics]
        firsts = FirstCommits(tables)
        argv = pattern_argv(
            prefix, lake, broker.bootstrap, run_dir / "checkpoint", "--allowed_latency", "5", *EXTRA_FLAGS
        )
        tree = Tree(argv, run_dir / "cli.log")
        while not firsts.poll():
            if not tree.alive():
                raise RuntimeError(f"the CLI exited {tree.process.returncode}:\n{tree.tail()}")
            if tree.elapsed() > timeout_s:
                print(f"  TIMEOUT: {len(firsts.pending)} table(s) without a commit after {timeout_s:.0f} s")
                tree.py_spy()
                print_log(tree)
                raise RuntimeError("footprint run timed out")
            time.sleep(0.25)
        seen_at = tree.elapsed()
        processes, pss, rows = tree.snapshot()
        first_s = max(firsts.first.values()) - tree.wall_start
        earliest_s = min(firsts.first.values()) - tree.wall_start
        print(
            f"  every table's first commit {first_s:.1f} s after start (first table {earliest_s:.1f} s; "
            f"seen at {seen_at:.1f} s): {processes} processes, PSS {pss / MIB:,.0f} MiB",
            flush=True,
        )
        print_tree(rows)
        time.sleep(5)  # the batch's tail (progress, auto-compaction check) before the idle window
        cpu = TreeCpu(tree.process.pid).start()
        time.sleep(idle_s)
        idle_cpu = cpu.stop()
        split = ", ".join(f"{k} {v:.2f}" for k, v in sorted(cpu.by_kind().items(), key=lambda kv: -kv[1]))
        after_processes, after_pss, after_rows = tree.snapshot()
        print(
            f"  idle {idle_s:.0f} s: {idle_cpu:.2f} CPU-s = {100 * idle_cpu / idle_s:.1f}% of a core "
            f"({split}); then {after_processes} processes, PSS {after_pss / MIB:,.0f} MiB",
            flush=True,
        )
        print_tree(after_rows)
        print_log(tree, limit=25)
        landed = [txn_versions(t, topic, PARTITIONS) for t, topic in zip(tables, topics, strict=True)]
        complete = all(v == [per_partition - 1] * PARTITIONS for v in landed)
        code = tree.stop()
        tree = None
        print(f"  stopped (exit {code}); every message landed: {complete}", flush=True)
        return {
            "topics": count,
            "processes": processes,
            "pss": pss,
            "max_processes": max(processes, after_processes),
            "max_pss": max(pss, after_pss),
            "first_s": first_s,
            "earliest_s": earliest_s,
            "idle_cpu_pct": 100 * idle_cpu / idle_s,
            "complete": complete,
        }
    finally:
        if tree is not None:
            tree.stop(timeout=30)
        broker.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def footprint(args: argparse.Namespace, work: Path) -> list[dict]:
    print(
        f"== footprint: {args.counts} topics, --allowed_latency 5, idle window {args.idle:.0f} s, "
        f"columns {'given (--schema)' if EXTRA_FLAGS else 'inferred'}",
        flush=True,
    )
    results = []
    for count in args.counts:
        results.append(footprint_run(count, args.per_partition, args.idle, work, args.timeout))
    print()
    print(describe())
    print(
        "| topics | processes at first commits (max) | PSS at first commits (max) | all first commits by "
        "| idle CPU (% of a core) |"
    )
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['topics']} | {r['processes']} ({r['max_processes']}) | {r['pss'] / MIB:,.0f} MiB "
            f"({r['max_pss'] / MIB:,.0f} MiB) | {r['first_s']:.1f} s | {r['idle_cpu_pct']:.1f}% |"
        )
    if len(results) > 1:
        x = np.array([r["topics"] for r in results], float)
        pss_slope = np.polyfit(x, [r["pss"] / MIB for r in results], 1)[0]
        cpu_slope = np.polyfit(x, [r["idle_cpu_pct"] for r in results], 1)[0]
        lo, hi = results[0], results[-1]
        span = hi["topics"] - lo["topics"]
        print(
            f"one more topic (least squares over {len(results)} counts): {pss_slope:.2f} MiB PSS, "
            f"{cpu_slope:.3f}% of a core idle; from {lo['topics']} to {hi['topics']}: "
            f"{(hi['pss'] - lo['pss']) / MIB / span:.2f} MiB, "
            f"{(hi['idle_cpu_pct'] - lo['idle_cpu_pct']) / span:.3f}% per topic"
        )
    worst_p = max(r["max_processes"] for r in results)
    worst_m = max(r["max_pss"] for r in results)
    worst_f = max(r["first_s"] for r in results)
    print(f"target <= {TARGET_PROCESSES} processes: {verdict(worst_p <= TARGET_PROCESSES)} (max {worst_p})")
    print(f"target <= 1.5 GiB PSS: {verdict(worst_m <= TARGET_PSS)} (max {worst_m / GIB:.2f} GiB)")
    print(f"target first commits <= 60 s: {verdict(worst_f <= TARGET_FIRST_COMMIT_S)} (max {worst_f:.1f} s)")
    print(f"every message landed in every run: {all(r['complete'] for r in results)}", flush=True)
    return results


# -- phase 2: drain ---------------------------------------------------------------------------


def drain_run(
    variant: str, payload: list[bytes], topics_n: int, work: Path, timeout_s: float, r: int
) -> dict:
    from deltaflow.testing import start_broker

    run_dir = work / f"drain-{variant}-{r}"
    lake = run_dir / "lake"
    run_dir.mkdir()
    prefix = f"dr{uuid.uuid4().hex[:6]}"
    broker = start_broker()
    tree = None
    try:
        if variant == "pattern":
            topics = topic_names(prefix, topics_n)
            create_topics(broker, topics, PARTITIONS)
            targets = [(t, p) for p in range(PARTITIONS) for t in topics]
            tables = [lake / t.split(".", 1)[1] for t in topics]
            argv = pattern_argv(
                prefix,
                lake,
                broker.bootstrap,
                run_dir / "checkpoint",
                "--ends_at_latest_offsets",
                *EXTRA_FLAGS,
            )
        else:
            topic = f"{prefix}-single"
            create_topics(broker, [topic], SINGLE_PARTITIONS)
            targets = [(topic, p) for p in range(SINGLE_PARTITIONS)]
            tables = [lake / "single"]
            argv = [
                str(DELTAFLOW), "ingest", topic, str(tables[0]), "--kafka", broker.bootstrap,
                "--pipeline-id", PIPELINE, "--checkpoint-location", str(run_dir / "checkpoint"),
                "--ends_at_latest_offsets", *EXTRA_FLAGS,
            ]  # fmt: skip
        t0 = time.perf_counter()
        produce(broker.bootstrap, targets, payload)
        print(
            f"  round {r} {variant}: {len(payload):,} messages into {len(targets)} partitions in "
            f"{time.perf_counter() - t0:.1f} s; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        tree = Tree(argv, run_dir / "cli.log")
        cpu = TreeCpu(tree.process.pid).start()
        done = tree.exited(timeout_s)
        elapsed = tree.elapsed()
        cpu_s = cpu.stop()
        code = tree.wait(10) if done else None
        if code is None:
            print(f"  TIMEOUT after {timeout_s:.0f} s", flush=True)
            tree.py_spy()
            print_log(tree)
            raise RuntimeError("drain timed out")
        if code != 0:
            raise RuntimeError(f"the CLI exited {code}:\n{tree.tail()}")
        split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(cpu.by_kind().items(), key=lambda kv: -kv[1]))
        print(
            f"  round {r} {variant}: {elapsed:.1f} s, {cpu_s:.1f} CPU-s ({split}); "
            f"at most {tree.max_processes} processes, PSS {tree.max_pss / MIB:,.0f} MiB (1-s samples)",
            flush=True,
        )
        commits = [c for c in tree.lines() if "committed batch" in c[3]]
        batches = sorted({int(m.group(1)) for c in commits if (m := COMMITTED.search(c[3]))})
        print(f"    {len(commits)} table commits in {len(batches)} batch(es)", flush=True)
        print_log(tree, limit=30)
        ids = ids_of(tables)
        exact = len(ids) == len(payload) and len(np.unique(ids)) == len(payload)
        print(f"    every message exactly once: {exact} ({len(ids):,} rows)", flush=True)
        assert exact, "messages lost or doubled"
        tree.stop()
        tree = None
        return {"variant": variant, "seconds": elapsed, "cpu": cpu_s}
    finally:
        if tree is not None:
            tree.stop(timeout=30)
        broker.stop()
        shutil.rmtree(run_dir, ignore_errors=True)


def drain(args: argparse.Namespace, work: Path) -> list[dict]:
    total = args.messages - args.messages % (args.drain_topics * PARTITIONS * SINGLE_PARTITIONS)
    print(
        f"== drain: {total:,} messages over {args.drain_topics} topics x {PARTITIONS} partitions vs one "
        f"{SINGLE_PARTITIONS}-partition topic, --ends_at_latest_offsets, {args.rounds} round(s), "
        f"columns {'given (--schema)' if EXTRA_FLAGS else 'inferred'}",
        flush=True,
    )
    payload = messages(total)
    results = []
    for r in range(1, args.rounds + 1):
        for variant in ("single", "pattern"):
            results.append(drain_run(variant, payload, args.drain_topics, work, args.timeout, r))
    print()
    print(describe())
    for r in range(args.rounds):
        single, pattern = results[2 * r], results[2 * r + 1]
        ratio = pattern["seconds"] / single["seconds"]
        print(
            f"round {r + 1}: one {SINGLE_PARTITIONS}-partition topic {single['seconds']:.1f} s "
            f"({total / single['seconds']:,.0f} msgs/s, {single['cpu']:.1f} CPU-s); "
            f"{args.drain_topics} topics {pattern['seconds']:.1f} s "
            f"({total / pattern['seconds']:,.0f} msgs/s, "
            f"{pattern['cpu']:.1f} CPU-s); ratio {ratio:.2f}: target <= {TARGET_DRAIN_RATIO}: "
            f"{verdict(ratio <= TARGET_DRAIN_RATIO)}",
            flush=True,
        )
    return results


# -- phase 3: steady load ---------------------------------------------------------------------


def steady(args: argparse.Namespace, work: Path) -> dict:
    from deltaflow.testing import start_broker

    count = args.steady_topics
    print(
        f"== steady: {args.rate:,} msgs/s for {args.seconds:.0f} s over {count} topics x {PARTITIONS} "
        f"partitions, --allowed_latency 5",
        flush=True,
    )
    run_dir = work / "steady"
    lake = run_dir / "lake"
    run_dir.mkdir()
    prefix = f"st{uuid.uuid4().hex[:6]}"
    topics = topic_names(prefix, count)
    tables = {t: lake / t.split(".", 1)[1] for t in topics}
    targets = [(t, p) for p in range(PARTITIONS) for t in topics]
    broker = start_broker()
    tree = None
    try:
        create_topics(broker, topics, PARTITIONS)
        argv = pattern_argv(
            prefix, lake, broker.bootstrap, run_dir / "checkpoint", "--allowed_latency", "5",
            "--schema", LATENCY_SCHEMA,
        )  # fmt: skip
        tree = Tree(argv, run_dir / "cli.log", event_log=run_dir / "events")
        offsets = run_dir / "checkpoint" / "offsets"
        while not (offsets.is_dir() and any(offsets.iterdir())):  # the query's first trigger ran
            if not tree.alive():
                raise RuntimeError(f"the CLI exited {tree.process.returncode}:\n{tree.tail()}")
            assert tree.elapsed() < args.timeout, f"no trigger within {args.timeout:.0f} s"
            time.sleep(0.25)
        print(f"  query started: its first trigger ran {tree.elapsed():.1f} s after start", flush=True)
        time.sleep(2)
        producer = SteadyProducer(broker.bootstrap, targets, args.rate, args.seconds)
        print(f"  producing; load average {os.getloadavg()[0]:.2f}", flush=True)
        cpu = TreeCpu(tree.process.pid).start()
        spy = None
        if args.profile:  # py-spy over the whole tree (Spark's Python processes too), collapsed stacks
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(tree.process.pid),
                 "--subprocesses", "--idle", "--rate", "20", "--format", "raw", "--output", args.profile],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        producer.start()
        # The broker's CPU, in windows of 10 s: tansu's cost of serving a fetch grows with the
        # record batches a partition holds (DELTA_NOTES.md), and it shares the 2 cores.
        tansu = psutil.Process(broker.process.pid)
        broker_cpu = [(time.monotonic(), sum(tansu.cpu_times()[:2]))]
        while producer.is_alive():
            producer.join(1.0)
            if not tree.alive():
                raise RuntimeError(f"the CLI exited {tree.process.returncode}:\n{tree.tail()}")
            if time.monotonic() - broker_cpu[-1][0] >= 10:
                broker_cpu.append((time.monotonic(), sum(tansu.cpu_times()[:2])))
        if producer.error is not None:
            raise producer.error
        cpu_s = cpu.stop()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
        duration = producer.ended - producer.started
        split = ", ".join(f"{k} {100 * v / duration:.0f}%" for k, v in sorted(cpu.by_kind().items()))
        print(
            f"  produced {producer.count:,} in {duration:.1f} s "
            f"({producer.count / duration:,.0f} msgs/s, worst "
            f"burst {producer.max_behind_s * 1000:.0f} ms late); tree CPU while producing "
            f"{100 * cpu_s / duration:.0f}% of a core ({split})",
            flush=True,
        )
        windows = [
            f"{100 * (c1 - c0) / (t1 - t0):.0f}%" for (t0, c0), (t1, c1) in itertools.pairwise(broker_cpu)
        ]
        print(f"  the broker's CPU in each 10 s of producing: {', '.join(windows)} of a core", flush=True)
        ends = high_watermarks(broker.bootstrap, targets)
        deadline = time.monotonic() + args.timeout
        behind = dict(tables)
        while behind:
            for topic, table in list(behind.items()):
                got = txn_versions(table, topic, PARTITIONS)
                if all(v is not None and v >= ends[topic, p] - 1 for p, v in enumerate(got)):
                    del behind[topic]
            if not behind:
                break
            if time.monotonic() > deadline or not tree.alive():
                tree.py_spy()
                print_log(tree)
                raise RuntimeError(f"{len(behind)} table(s) not caught up within {args.timeout:.0f} s")
            time.sleep(2)
        caught_up = time.time() - producer.ended
        print(f"  every table holds every offset {caught_up:.1f} s after the last produce", flush=True)
        max_processes, max_pss = tree.max_processes, tree.max_pss
        tree.stop()
        lines = tree.lines()
        tree = None
    finally:
        if tree is not None:
            tree.stop(timeout=30)
        broker.stop()

    # Every version of every table: rows, their produce times, the commit file's mtime.
    produced, committed, ids = [], [], []
    commit_files: dict[int, list[float]] = {}  # batch -> commit file mtimes
    tasks_done: dict[int, float] = {}  # batch -> newest data file mtime
    tables_per_batch: dict[int, int] = {}
    files_per_commit = []
    for table in tables.values():
        for _version, mtime, info in log_versions(table):
            if info["epoch"] is None:
                continue
            batch = int(info["epoch"])
            commit_files.setdefault(batch, []).append(mtime)
            tables_per_batch[batch] = tables_per_batch.get(batch, 0) + 1
            if info["adds"]:
                files_per_commit.append(len(info["adds"]))
            for rel in info["adds"]:
                path = table / rel
                tasks_done[batch] = max(tasks_done.get(batch, 0.0), path.stat().st_mtime)
                data = pq.read_table(path, columns=["id", "produced_us"])
                ids.append(data["id"].to_numpy())
                produced.append(data["produced_us"].fill_null(-1).to_numpy())
                committed.append(np.full(data.num_rows, mtime))
    ids_a, produced_a, committed_a = (
        np.concatenate(ids),
        np.concatenate(produced) / 1e6,
        np.concatenate(committed),
    )
    real = ids_a >= 0
    n = int(real.sum())
    exact = n == producer.count and len(np.unique(ids_a[real])) == n and int((~real).sum()) == len(targets)
    keep = real & (produced_a >= producer.started + args.warmup)
    latency = committed_a[keep] - produced_a[keep]

    # The commit phase of each batch with data after the warm-up.
    log_commits: dict[int, list[float]] = {}
    for at, _level, _name, message in lines:
        m = COMMITTED.search(message)
        if m:
            log_commits.setdefault(int(m.group(1)), []).append(at)
    steady_batches = [b for b in sorted(tasks_done) if tasks_done[b] >= producer.started + args.warmup]
    phase = np.array([max(commit_files[b]) - tasks_done[b] for b in steady_batches])
    span = np.array([max(log_commits[b]) - min(log_commits[b]) for b in steady_batches if b in log_commits])
    starts = np.array([min(commit_files[b]) for b in steady_batches])
    # When Spark logged each batch's offsets (its start, after planning) and its end.
    ckpt = run_dir / "checkpoint"
    planned = {b: (ckpt / "offsets" / str(b)).stat().st_mtime for b in steady_batches}
    ended = {b: (ckpt / "commits" / str(b)).stat().st_mtime for b in steady_batches}
    events = spark_events(run_dir / "events")
    shutil.rmtree(run_dir, ignore_errors=True)

    print()
    print(f"{describe()}; load average at the end {os.getloadavg()[0]:.2f}")
    print(
        f"{producer.count:,} messages at {producer.count / duration:,.0f} msgs/s over {count} topics; every "
        f"message exactly once: {exact}; the tree at most {max_processes} processes, PSS "
        f"{max_pss / MIB:,.0f} MiB"
    )
    print(
        f"produce -> commit file, {keep.sum():,} rows produced after the first {args.warmup:.0f} s: "
        f"p50 {pct(latency, 50):.2f} s, p95 {pct(latency, 95):.2f} s, p99 {pct(latency, 99):.2f} s, "
        f"max {latency.max():.2f} s; target p99 <= {TARGET_P99_S:.0f} s: "
        f"{verdict(pct(latency, 99) <= TARGET_P99_S)}"
    )
    print(
        f"{len(steady_batches)} batches after the warm-up (of {len(tasks_done)} with data), "
        f"{min(tables_per_batch[b] for b in steady_batches)}-"
        f"{max(tables_per_batch[b] for b in steady_batches)} "
        f"table commits each; one every p50 {pct(np.diff(starts), 50):.2f} s; files per commit p50 "
        f"{pct(np.array(files_per_commit), 50):.0f}"
    )
    print(
        f"commit phase (last task's file -> last table's commit file): p50 {pct(phase, 50):.2f} s, "
        f"max {phase.max():.2f} s; first -> last 'committed batch' log line: p50 {pct(span, 50):.2f} s, "
        f"max {span.max():.2f} s; target <= {TARGET_COMMIT_PHASE_S:.0f} s: "
        f"{verdict(phase.max() <= TARGET_COMMIT_PHASE_S)}"
    )
    keys = ("triggerExecution", "latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
    reports = [events[b].progress["durationMs"] for b in steady_batches if b in events and events[b].progress]
    if reports:
        print(f"Spark's durations of these batches (p50 / max; {len(reports)} progress reports):")
        for key in keys:
            values = np.array([d.get(key, 0) for d in reports]) / 1000
            print(f"  {key}: {pct(values, 50):.2f} / {values.max():.2f} s")

    def started(b: int) -> float:
        progress = events[b].progress if b in events else None
        if not progress:
            return float("nan")
        return dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()

    steps: dict[str, list[float]] = {}
    print(
        "per batch, seconds from each step to the next: trigger -> offsets logged -> job submitted "
        "(foreachBatch's collect) -> first task starts -> last task ends -> first / last table "
        "commit file -> Spark's commit log; tasks' run time summed"
    )
    for b in steady_batches:
        e = events.get(b, BatchEvents())
        first_task = min(e.task_launches, default=float("nan"))
        last_task = max(e.task_finishes, default=float("nan"))
        row = {
            "trigger -> offsets": planned[b] - started(b),
            "offsets -> job": (e.job_submitted or float("nan")) - planned[b],
            "job -> first task": first_task - (e.job_submitted or float("nan")),
            "tasks": last_task - first_task,
            "last task -> first commit": min(commit_files[b]) - last_task,
            "first -> last commit": max(commit_files[b]) - min(commit_files[b]),
            "last commit -> commit log": ended[b] - max(commit_files[b]),
        }
        for k, v in row.items():
            steps.setdefault(k, []).append(v)
        print(
            f"  batch {b}: {tables_per_batch[b]} tables, {len(e.task_launches)} tasks "
            f"({e.task_run_s:.2f} s run); " + ", ".join(f"{v:.2f}" for v in row.values())
        )
    print("  p50: " + ", ".join(f"{k} {pct(np.array(v), 50):.2f} s" for k, v in steps.items()))
    return {"p99": pct(latency, 99), "phase_max": float(phase.max()), "exact": exact}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("phases", nargs="*", choices=["all", "footprint", "drain", "steady"], default=["all"])
    parser.add_argument("--counts", default="1,10,50,200", help="topic counts of the footprint runs")
    parser.add_argument("--per-partition", type=int, default=1_000, help="footprint: messages per partition")
    parser.add_argument("--idle", type=float, default=30.0, help="footprint: seconds of the idle CPU window")
    parser.add_argument("--messages", type=int, default=1_000_000, help="drain: messages in all")
    parser.add_argument("--drain-topics", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1, help="drain: rounds of one topic, then many")
    parser.add_argument("--rate", type=int, default=10_000, help="steady: messages per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="steady: seconds of producing")
    parser.add_argument("--warmup", type=float, default=10.0, help="steady: first seconds left out")
    parser.add_argument("--steady-topics", type=int, default=200)
    parser.add_argument(
        "--profile", metavar="FILE",
        help="steady: py-spy record (idle threads too) of the tree while producing: collapsed stacks",
    )  # fmt: skip
    parser.add_argument(
        "--given-schema", action="store_true",
        help="footprint and drain: pass --schema (the messages' columns) instead of inferring them",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=600.0, help="bound of each wait, seconds")
    args = parser.parse_args()
    args.counts = [int(c) for c in args.counts.split(",")]
    phases = {"footprint", "drain", "steady"} if "all" in args.phases else set(args.phases)
    if args.given_schema:
        EXTRA_FLAGS.extend(["--schema", SCHEMA_DDL])

    work = Path(tempfile.mkdtemp(prefix="deltaflow-many-"))
    try:
        if "footprint" in phases:
            footprint(args, work)
            print(flush=True)
        if "drain" in phases:
            drain(args, work)
            print(flush=True)
        if "steady" in phases:
            steady(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
