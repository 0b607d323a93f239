"""Debezium topics into mirror tables: ``deltaflow ingest --topic_pattern REGEX TEMPLATE --cdc debezium``.

A database of ``--tables`` (100) tables shaped like pgbench's accounts (``aid`` int key, ``bid``
int, ``abalance`` int, ``filler`` text, plus ``produced_us`` int64: the wall clock in µs right
before the change was produced) is kept by this script (the model of what every mirror must
hold) and written as Debezium's PostgreSQL connector writes it with Kafka Connect's JSON
converter, ``schemas.enable`` (``tests/fixtures/debezium.py``'s layout, with the connector's
whole ``source`` block): topic ``<prefix>.public.t000`` ... with 2 partitions, each change keyed
by ``{"aid": N}`` (its key struct), a key always to the same partition;
``source.sequence`` ``["<last commit LSN>", "<LSN>"]`` (each change a transaction of its own;
the snapshot's reads ``[null, "<LSN>"]``); a delete is the ``d`` event (``before`` the key only:
the default replica identity) and its tombstone. Changes are UPDATEs of a random existing
``aid`` (``abalance`` += a random delta, as pgbench's TPC-B-like script; 90%), INSERTs of a new
``aid`` (5%) and DELETEs of a random existing one (5%). The CLI runs as a subprocess (the whole
process tree measured: its Python driver, Spark's JVM and the Python processes Spark starts)
against a fresh local tansu broker (``deltaflow.testing.start_broker``), tables on local disk in
a temporary folder, ``--topic_pattern '<prefix>\\.public\\.(.*)' <lake>/{1} --cdc debezium``.
Every partition's last message is produced in a record batch of its own (tansu reports a
partition's high watermark as the base offset of its last record batch + 1).

Phases, one broker and one lake:

1. **snapshot**: ``--rows`` (1,000) snapshot reads (``op r``) per table, produced before the CLI
   starts; then ``deltaflow ingest ... --cdc debezium --allowed_latency 5`` starts (its Spark
   event log on, ``--metrics_port``) and loads them. Time from ``Popen`` until every mirror holds
   every offset (its txns); then every mirror is compared with the model.
2. **steady**: ``--rate`` (2,000) changes/s for ``--seconds`` (60), a burst every 10 ms
   (``linger.ms`` 5), random tables, while the same CLI runs; then one single-record UPDATE per
   partition (so the last changes become visible), and, once every mirror holds every offset,
   the CLI is stopped (SIGTERM) and every mirror compared with the model.
   *Latency* of a change = mtime of the Delta commit file of the first version whose table
   holds the row version (``aid``, ``produced_us``) - ``produced_us``; of a delete: of the first
   version that no longer holds the row version it deleted. Each table's log is replayed
   version by version (adds and removes, compactions included). A change the fold superseded
   within its batch (a later change of the same key in the same batch) never shows as itself:
   counted, left out. Changes produced in the first ``--warmup`` (10) s are left out.
   *Commit phase* of a batch = its last mirror's commit file mtime - the end of its last task
   (``SparkListenerTaskEnd`` in Spark's event log: the tasks have staged their files then; the
   staged files themselves are deleted after each commit, so their mtimes cannot be read
   afterwards); also the first -> last ``mirror <uri>: batch N, ...`` driver log line. *Each
   table's commit* (``KafkaMirrorSink.commit_batch``: load, fold, MERGE, staged files deleted)
   from the CLI's Prometheus histogram ``deltaflow_sink_commit_latency_seconds``, scraped every
   second: a table's count going up by one is one commit, its sum's increase that commit's
   seconds (matched to its batch through the table's ``mirror ...: batch N`` lines, in order).
3. **drain**: with the CLI stopped, ``--backlog`` (200,000) changes of the same mix; then
   ``deltaflow ingest ... --cdc debezium --ends_at_latest_offsets`` (same checkpoint: a restart)
   until it exits 0; wall time from ``Popen``, and from the batch's trigger (Spark's progress
   report) to its last mirror commit; every mirror compared with the model.

The tree (processes, PSS from ``/proc/<pid>/smaps_rollup``) is sampled every second while each
CLI runs; the maxima are reported. Each wait is bounded (``--timeout``, 600 s); brokers,
processes and temporary folders are stopped and removed in every case.

    .venv/bin/python benchmarks/debezium_mirrors.py [--tables 100] [--rows 1000] [--rate 2000] \
        [--seconds 60] [--warmup 10] [--backlog 200000] [--seed 1]

Targets (the issue): <= 12 processes and <= 2 GiB PSS; the commit phase of a batch touching
all tables <= 5 s; change -> visible p99 <= 15 s (3 x the trigger); the backlog's changes/s
compared with the postgres-cdc mirror's ~30,000 changes/s (BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import psutil
import pyarrow.parquet as pq
from cpu import TreeCpu
from machine import describe
from many_topics import (
    DELTAFLOW,
    GIB,
    MIB,
    PER_TABLE,
    BatchEvents,
    Tree,
    create_topics,
    high_watermarks,
    pct,
    print_log,
    print_tree,
    spark_events,
    verdict,
)

PARTITIONS = 2
PIPELINE = "mirrors"
TRIGGER_S = 5.0
BURST_EVERY_S = 0.01
UPDATE_SHARE, INSERT_SHARE = 0.90, 0.05  # the rest: deletes
COLUMNS = ("aid", "bid", "abalance", "filler", "produced_us")
MIRROR_LINE = re.compile(r"^mirror (\S+): batch (\d+), (\d+) row change")
HISTOGRAM = re.compile(r"^deltaflow_sink_commit_latency_seconds_(sum|count)\{([^}]*)\} (\S+)$", re.M)

TARGET_PROCESSES = 12
TARGET_PSS = 2 * GIB
TARGET_COMMIT_PHASE_S = 5.0
TARGET_P99_S = 3 * TRIGGER_S
POSTGRES_CDC_BACKLOG = 30_702  # changes/s, BENCHMARKS.md "PostgreSQL CDC -> typed mirror tables", run 2

PER_TABLE[r"^mirror \S+: batch"] = "mirror <table>: batch N, ..."  # summed up by print_log


# -- the database and its change stream ------------------------------------------------------


def _field(name: str, kind: str, optional: bool) -> dict:
    return {"type": kind, "optional": optional, "field": name}


class Database:
    """The tables' rows (what each mirror must hold) and their changes as Debezium's
    PostgreSQL connector writes them (JSON converter with schemas)."""

    def __init__(self, prefix: str, tables: int, seed: int) -> None:
        self.prefix = prefix
        self.topics = [f"{prefix}.public.t{i:03d}" for i in range(tables)]
        self.rows: list[dict[int, tuple[int, int, str, int]]] = [{} for _ in self.topics]
        self._keys: list[list[int]] = [[] for _ in self.topics]  # for a random existing aid
        self._where: list[dict[int, int]] = [{} for _ in self.topics]  # aid -> its place in _keys
        self._next_aid = [1] * tables
        self.rng = random.Random(seed)
        self.lsn = 22_000_000
        self.commit_lsn = self.lsn
        self.tx = 700
        self._key_head = [self._key_head_of(t) for t in self.topics]
        self._value_head = [self._value_head_of(t) for t in self.topics]

    @staticmethod
    def _key_head_of(topic: str) -> bytes:
        schema = {
            "type": "struct",
            "fields": [_field("aid", "int32", False)],
            "optional": False,
            "name": f"{topic}.Key",
        }
        return b'{"schema":' + json.dumps(schema, separators=(",", ":")).encode() + b',"payload":'

    @staticmethod
    def _value_head_of(topic: str) -> bytes:
        row = [
            _field("aid", "int32", False),
            _field("bid", "int32", True),
            _field("abalance", "int32", True),
            _field("filler", "string", True),
            _field("produced_us", "int64", True),
        ]
        value = {"type": "struct", "fields": row, "optional": True, "name": f"{topic}.Value"}
        source = [
            _field("version", "string", False),
            _field("connector", "string", False),
            _field("name", "string", False),
            _field("ts_ms", "int64", False),
            {
                "type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
                "parameters": {"allowed": "true,last,false,incremental"}, "default": "false",
                "field": "snapshot",
            },
            _field("db", "string", False),
            _field("sequence", "string", True),
            _field("schema", "string", False),
            _field("table", "string", False),
            _field("txId", "int64", True),
            _field("lsn", "int64", True),
            _field("xmin", "int64", True),
        ]  # fmt: skip
        transaction = [_field("id", "string", False), _field("total_order", "int64", False),
                       _field("data_collection_order", "int64", False)]  # fmt: skip
        envelope = {
            "type": "struct",
            "fields": [
                {**value, "field": "before"},
                {**value, "field": "after"},
                {"type": "struct", "fields": source, "optional": False,
                 "name": "io.debezium.connector.postgresql.Source", "field": "source"},
                _field("op", "string", False),
                _field("ts_ms", "int64", True),
                {"type": "struct", "fields": transaction, "optional": True,
                 "name": "event.block", "version": 1, "field": "transaction"},
            ],
            "optional": False,
            "name": f"{topic}.Envelope",
            "version": 1,
        }  # fmt: skip
        return b'{"schema":' + json.dumps(envelope, separators=(",", ":")).encode() + b',"payload":'

    def partition(self, aid: int) -> int:
        return zlib.crc32(b"%d" % aid) % PARTITIONS

    def key_bytes(self, t: int, aid: int) -> bytes:
        return self._key_head[t] + b'{"aid":%d}}' % aid

    def _message(self, t: int, op: str, before: dict | None, after: dict | None, snapshot: bool) -> bytes:
        now_ms = int(time.time() * 1000)
        if snapshot:
            sequence = f'[null,"{self.lsn}"]'
        else:
            self.lsn += 56
            sequence = f'["{self.commit_lsn}","{self.lsn}"]'
            self.tx += 1
        payload = {
            "before": before,
            "after": after,
            "source": {
                "version": "2.7.3.Final", "connector": "postgresql", "name": self.prefix, "ts_ms": now_ms,
                "snapshot": "true" if snapshot else "false", "db": "bench", "sequence": sequence,
                "schema": "public", "table": self.topics[t].rsplit(".", 1)[1], "txId": self.tx,
                "lsn": self.lsn, "xmin": None,
            },
            "op": op,
            "ts_ms": now_ms,
            "transaction": None,
        }  # fmt: skip
        if not snapshot:
            self.commit_lsn = self.lsn  # each change a transaction of its own
        return self._value_head[t] + json.dumps(payload, separators=(",", ":")).encode() + b"}"

    def _put(self, t: int, aid: int, row: tuple[int, int, str, int]) -> None:
        if aid not in self._where[t]:
            self._where[t][aid] = len(self._keys[t])
            self._keys[t].append(aid)
        self.rows[t][aid] = row

    def _pop(self, t: int, aid: int) -> tuple[int, int, str, int]:
        keys, where = self._keys[t], self._where[t]
        i = where.pop(aid)
        last = keys.pop()
        if last != aid:
            keys[i] = last
            where[last] = i
        return self.rows[t].pop(aid)

    @staticmethod
    def _image(aid: int, row: tuple[int, int, str, int]) -> dict:
        return dict(zip(COLUMNS, (aid, *row), strict=True))

    def snapshot(self, t: int, rows: int) -> list[tuple[str, int, bytes, bytes | None]]:
        """``rows`` snapshot reads of table ``t``: (topic, partition, key, value) each."""
        out = []
        for _ in range(rows):
            aid = self._next_aid[t]
            self._next_aid[t] += 1
            row = (self.rng.randrange(1, 11), 0, f"account {aid}".ljust(84), time.time_ns() // 1000)
            self._put(t, aid, row)
            out.append((self.topics[t], self.partition(aid), self.key_bytes(t, aid),
                        self._message(t, "r", None, self._image(aid, row), True)))  # fmt: skip
        return out

    def change(self, t: int | None = None, op: str | None = None, aid: int | None = None):
        """One random change (of table ``t``, ``op`` u/c/d, row ``aid`` when given): its messages
        (topic, partition, key, value; a delete's tombstone too) and its record (table, aid,
        op, produced_us, the row version a delete removed)."""
        if t is None:
            t = self.rng.randrange(len(self.topics))
        if op is None:
            x = self.rng.random()
            op = "u" if x < UPDATE_SHARE else "c" if x < UPDATE_SHARE + INSERT_SHARE else "d"
        if op != "c" and not self._keys[t]:
            op = "c"
        produced = time.time_ns() // 1000
        topic = self.topics[t]
        if op == "c":
            aid = self._next_aid[t]
            self._next_aid[t] += 1
            row = (self.rng.randrange(1, 11), 0, f"account {aid}".ljust(84), produced)
            self._put(t, aid, row)
            value = self._message(t, "c", None, self._image(aid, row), False)
            record = (t, aid, "c", produced, 0)
        elif op == "u":
            if aid is None:
                aid = self._keys[t][self.rng.randrange(len(self._keys[t]))]
            bid, balance, filler, _ = self.rows[t][aid]
            row = (bid, balance + self.rng.randint(-5000, 5000), filler, produced)
            self._put(t, aid, row)
            value = self._message(t, "u", None, self._image(aid, row), False)
            record = (t, aid, "u", produced, 0)
        else:
            if aid is None:
                aid = self._keys[t][self.rng.randrange(len(self._keys[t]))]
            old = self._pop(t, aid)
            before = {"aid": aid, "bid": None, "abalance": None, "filler": None, "produced_us": None}
            value = self._message(t, "d", before, None, False)
            record = (t, aid, "d", produced, old[3])
        part, key = self.partition(aid), self.key_bytes(t, aid)
        messages = [(topic, part, key, value)]
        if op == "d":
            messages.append((topic, part, key, None))
        return messages, record

    def markers(self) -> list[tuple[str, int, bytes, bytes | None]]:
        """One UPDATE per partition (of an existing row in it): each partition's last message."""
        out = []
        for t in range(len(self.topics)):
            for p in range(PARTITIONS):
                aid = next((a for a in self._keys[t] if self.partition(a) == p), None)
                messages, _ = self.change(t, "u" if aid is not None else "c", aid)
                out.extend(messages)
        return out


def produce_all(bootstrap: str, messages: Sequence[tuple[str, int, bytes, bytes | None]]) -> None:
    """The messages in order, batched, except each partition's last one, which goes in a record
    batch of its own after the rest."""
    from confluent_kafka import Producer

    last: dict[tuple[str, int], int] = {}
    for i, (topic, part, _, _) in enumerate(messages):
        last[topic, part] = i
    tails = set(last.values())
    bulk = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10_000})
    single = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})

    def send(producer, topic: str, part: int, key: bytes, value: bytes | None) -> None:
        while True:
            try:
                producer.produce(topic, value, key, partition=part)
                return
            except BufferError:
                producer.poll(0.05)

    for i, m in enumerate(messages):
        if i not in tails:
            send(bulk, *m)
            if i % 1000 == 0:
                bulk.poll(0)
    assert bulk.flush(300) == 0
    for i in sorted(tails):
        send(single, *messages[i])
        single.poll(0)
    assert single.flush(120) == 0


class SteadyChanges(threading.Thread):
    """``rate`` changes/s for ``seconds``, a burst every ``BURST_EVERY_S``; then one single-record
    UPDATE per partition. An error is kept in ``error`` for the main thread."""

    def __init__(self, bootstrap: str, db: Database, rate: int, seconds: float) -> None:
        super().__init__(name="steady-changes", daemon=True)
        self.bootstrap, self.db, self.rate, self.seconds = bootstrap, db, rate, seconds
        self.records: list[tuple[int, int, str, int, int]] = []
        self.messages = 0
        self.started = self.ended = 0.0  # wall clock
        self.max_behind_s = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.error = exc

    def _run(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "batch.num.messages": 10_000}
        )
        per_burst = max(1, round(self.rate * BURST_EVERY_S))
        self.started = time.time()
        begin = tick = time.monotonic()
        while tick - begin < self.seconds:
            now = time.monotonic()
            if tick > now:
                time.sleep(tick - now)
            else:
                self.max_behind_s = max(self.max_behind_s, now - tick)
            for _ in range(per_burst):
                messages, record = self.db.change()
                self.records.append(record)
                for topic, part, key, value in messages:
                    while True:
                        try:
                            producer.produce(topic, value, key, partition=part)
                            break
                        except BufferError:
                            producer.poll(0.01)
                    self.messages += 1
            producer.poll(0)
            tick += BURST_EVERY_S
        self.ended = time.time()
        assert producer.flush(60) == 0
        produce_all(self.bootstrap, self.db.markers())


# -- the mirrors ------------------------------------------------------------------------------


def txn_versions(table: Path, topic: str) -> list[int | None]:
    from deltalake import DeltaTable

    try:
        t = DeltaTable(str(table))
    except Exception:  # noqa: BLE001 - not made yet
        return [None] * PARTITIONS
    return [t.transaction_version(f"{PIPELINE}-{topic}-{p}") for p in range(PARTITIONS)]


def wait_caught_up(tree: Tree, broker, db: Database, tables: dict[str, Path], timeout_s: float) -> float:
    """Wait until every mirror holds every offset the broker has; the wall clock then."""
    ends = high_watermarks(broker.bootstrap, [(t, p) for t in db.topics for p in range(PARTITIONS)])
    deadline = time.monotonic() + timeout_s
    behind = dict(tables)
    while True:
        for topic, table in list(behind.items()):
            got = txn_versions(table, topic)
            if all(v is not None and v >= ends[topic, p] - 1 for p, v in enumerate(got)):
                del behind[topic]
        if not behind:
            return time.time()
        if not tree.alive():
            raise RuntimeError(f"the CLI exited {tree.process.returncode}:\n{tree.tail()}")
        if time.monotonic() > deadline:
            tree.py_spy()
            print_log(tree)
            raise RuntimeError(f"{len(behind)} mirror(s) not caught up within {timeout_s:.0f} s")
        time.sleep(1.0)


def check_mirrors(db: Database, tables: dict[str, Path]) -> bool:
    """Every mirror equals the model; the first differences printed."""
    from deltalake import DeltaTable

    bad = 0
    for t, topic in enumerate(db.topics):
        data = DeltaTable(str(tables[topic])).to_pyarrow_table(columns=list(COLUMNS)).to_pydict()
        got = {r[0]: r[1:] for r in zip(*(data[c] for c in COLUMNS), strict=True)}
        want = db.rows[t]
        if got != want:
            bad += 1
            if bad <= 3:
                missing = sorted(set(want) - set(got))[:5]
                extra = sorted(set(got) - set(want))[:5]
                differ = [a for a in sorted(set(want) & set(got)) if want[a] != got[a]][:3]
                print(
                    f"    {topic}: {len(got)} rows, {len(want)} expected; missing {missing}, extra {extra}, "
                    f"different {[(a, got[a], want[a]) for a in differ]}",
                    flush=True,
                )
    rows = sum(len(r) for r in db.rows)
    print(f"  every mirror equals the model ({rows:,} rows in {len(db.topics)} tables): {bad == 0}"
          + ("" if bad == 0 else f" ({bad} differ)"), flush=True)  # fmt: skip
    return bad == 0


def replay_log(table: Path) -> tuple[list[tuple[float, int | None]], dict, dict]:
    """Replay a table's Delta log version by version: each version's (commit file mtime, batch),
    when each row version (aid, produced_us) first shows and when it leaves (mtimes)."""
    active: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    versions: list[tuple[float, int | None]] = []
    first: dict[tuple[int, int], float] = {}
    gone: dict[tuple[int, int], float] = {}
    state: set[tuple[int, int]] = set()
    for path in sorted((table / "_delta_log").glob("*.json")):
        try:
            int(path.stem)
        except ValueError:
            continue
        mtime, epoch = path.stat().st_mtime, None
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                rel = unquote(action["add"]["path"])
                data = pq.read_table(table / rel, columns=["aid", "produced_us"])
                active[rel] = (data["aid"].to_numpy(), data["produced_us"].to_numpy())
            elif "remove" in action:
                active.pop(unquote(action["remove"]["path"]), None)
            elif "commitInfo" in action:
                epoch = action["commitInfo"].get("deltaflow.epoch", epoch)
        versions.append((mtime, None if epoch is None else int(epoch)))
        now = {(int(a), int(p)) for aids, pus in active.values() for a, p in zip(aids, pus, strict=True)}
        for row in now - state:
            first.setdefault(row, mtime)
        for row in state - now:
            gone.setdefault(row, mtime)
        state = now
    return versions, first, gone


class MetricsScraper(threading.Thread):
    """Scrapes ``deltaflow_sink_commit_latency_seconds`` (sum, count per table) every second."""

    def __init__(self, port: int) -> None:
        super().__init__(name="metrics-scraper", daemon=True)
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.samples: dict[str, list[tuple[float, float]]] = {}  # table -> [(count, sum)]
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(1.0):
            try:
                text = urllib.request.urlopen(self.url, timeout=2).read().decode()
            except OSError:
                continue
            seen: dict[str, dict[str, float]] = {}
            for kind, labels, value in HISTOGRAM.findall(text):
                m = re.search(r'table="([^"]*)"', labels)
                if m:
                    seen.setdefault(m.group(1), {})[kind] = float(value)
            for table, v in seen.items():
                if "count" in v and "sum" in v:
                    rows = self.samples.setdefault(table, [(0.0, 0.0)])  # none before the process
                    if not rows or rows[-1][0] != v["count"]:
                        rows.append((v["count"], v["sum"]))

    def per_commit(self, commits: dict[str, list[int]]) -> dict[tuple[str, int], float]:
        """(table, batch) -> seconds of that table's commit, where one scrape saw one more commit
        (``commits``: each table's batches in the order it logged them)."""
        out = {}
        for table, rows in self.samples.items():
            batches = commits.get(table, [])
            for (c0, s0), (c1, s1) in itertools.pairwise(rows):
                if c1 == c0 + 1 and int(c1) - 1 < len(batches):
                    out[table, batches[int(c1) - 1]] = s1 - s0
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mirror_lines(tree: Tree) -> list[tuple[float, str, int, int]]:
    """The driver's ``mirror <uri>: batch N, R row change(s)`` lines: (wall clock, uri, N, R)."""
    out = []
    for at, _level, _name, message in tree.lines():
        m = MIRROR_LINE.match(message)
        if m:
            out.append((at, m.group(1), int(m.group(2)), int(m.group(3))))
    return out


# -- the run ----------------------------------------------------------------------------------


@dataclass
class Cli:
    """One run of the CLI: its tree, its metrics, its Spark event log."""

    tree: Tree
    scraper: MetricsScraper
    events: Path
    max_processes: int = 0
    max_pss: int = 0

    def stop(self) -> int | None:
        self.scraper.stop_event.set()
        self.max_processes, self.max_pss = self.tree.max_processes, self.tree.max_pss
        return self.tree.stop()


def start_cli(db: Database, work: Path, name: str, bootstrap: str, *extra: str) -> Cli:
    port = free_port()
    argv = [
        str(DELTAFLOW), "ingest", "--topic_pattern", rf"{re.escape(db.prefix)}\.public\.(.*)",
        f"{work / 'lake'}/{{1}}", "--cdc", "debezium", "--kafka", bootstrap, "--pipeline-id", PIPELINE,
        "--checkpoint-location", str(work / "checkpoint"), "--metrics_port", str(port), *extra,
    ]  # fmt: skip
    print(f"  $ {' '.join(argv)}", flush=True)
    (work / name).mkdir()
    tree = Tree(argv, work / name / "cli.log", event_log=work / name / "events")
    scraper = MetricsScraper(port)
    scraper.start()
    return Cli(tree, scraper, work / name / "events")


def run(args: argparse.Namespace, work: Path) -> None:
    from deltaflow.testing import start_broker

    db = Database(f"db{uuid.uuid4().hex[:6]}", args.tables, args.seed)
    tables = {t: work / "lake" / t.rsplit(".", 1)[1] for t in db.topics}
    broker = start_broker()
    cli: Cli | None = None
    spy: subprocess.Popen | None = None
    ok: dict[str, bool] = {}
    try:
        create_topics(broker, db.topics, PARTITIONS)
        # Phase 1: the snapshot.
        t0 = time.perf_counter()
        snapshot = [m for t in range(args.tables) for m in db.snapshot(t, args.rows)]
        produce_all(broker.bootstrap, snapshot)
        size = sum(len(m[3] or b"") for m in snapshot) / len(snapshot)
        print(
            f"== snapshot: {len(snapshot):,} reads (op r) into {args.tables} topics x {PARTITIONS} "
            f"partitions ({size:,.0f} bytes a value) produced in {time.perf_counter() - t0:.1f} s; "
            f"load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        del snapshot
        cli = start_cli(db, work, "steady", broker.bootstrap, "--allowed_latency", f"{TRIGGER_S:g}")
        loaded = wait_caught_up(cli.tree, broker, db, tables, args.timeout)
        processes, pss, rows = cli.tree.snapshot()
        print(
            f"  every mirror holds the snapshot {loaded - cli.tree.wall_start:.1f} s after Popen; now "
            f"{processes} processes, PSS {pss / MIB:,.0f} MiB",
            flush=True,
        )
        print_tree(rows)
        ok["snapshot"] = check_mirrors(db, tables)

        # Phase 2: steady changes.
        time.sleep(2)
        producer = SteadyChanges(broker.bootstrap, db, args.rate, args.seconds)
        print(
            f"== steady: {args.rate:,} changes/s for {args.seconds:.0f} s over {args.tables} tables, "
            f"--allowed_latency {TRIGGER_S:g}; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        cpu = TreeCpu(cli.tree.process.pid).start()
        if args.profile:  # the driver alone: the commit threads are there
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(cli.tree.process.pid),
                 "--idle", "--nonblocking", "--threads", "--rate", "20", "--format", "raw",
                 "--output", f"{args.profile}-steady.txt"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        producer.start()
        # The broker's CPU in windows of 10 s (it shares the 2 cores).
        tansu = psutil.Process(broker.process.pid)
        broker_cpu = [(time.monotonic(), sum(tansu.cpu_times()[:2]))]
        while producer.is_alive():
            producer.join(1.0)
            if time.monotonic() - broker_cpu[-1][0] >= 10:
                broker_cpu.append((time.monotonic(), sum(tansu.cpu_times()[:2])))
            if not cli.tree.alive():
                raise RuntimeError(f"the CLI exited {cli.tree.process.returncode}:\n{cli.tree.tail()}")
        if producer.error is not None:
            raise producer.error
        cpu_s = cpu.stop()
        duration = producer.ended - producer.started
        split = ", ".join(f"{k} {100 * v / duration:.0f}%" for k, v in sorted(cpu.by_kind().items()))
        print(
            f"  produced {len(producer.records):,} changes ({producer.messages:,} messages with the "
            f"tombstones) in {duration:.1f} s = {len(producer.records) / duration:,.0f} changes/s (worst "
            f"burst {producer.max_behind_s * 1000:.0f} ms late); tree CPU {100 * cpu_s / duration:.0f}% of "
            f"a core ({split}); load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        windows = [
            f"{100 * (c1 - c0) / (t1 - t0):.0f}%" for (t0, c0), (t1, c1) in itertools.pairwise(broker_cpu)
        ]
        print(f"  the broker's CPU in each 10 s of changes: {', '.join(windows)} of a core", flush=True)
        caught = wait_caught_up(cli.tree, broker, db, tables, args.timeout)
        print(f"  every mirror holds every offset {caught - producer.ended:.1f} s after the last change")
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
            spy = None
        time.sleep(1.5)  # one more scrape of the metrics
        code = cli.stop()
        print(
            f"  stopped (exit {code}); at most {cli.max_processes} processes, PSS "
            f"{cli.max_pss / MIB:,.0f} MiB"
        )
        print_log(cli.tree, limit=30)
        ok["steady"] = check_mirrors(db, tables)
        steady, cli = cli, None

        # Phase 3: the backlog drain.
        t0 = time.perf_counter()
        backlog, changes = [], 0
        while changes < args.backlog:
            messages, _ = db.change()
            backlog.extend(messages)
            changes += 1
        produce_all(broker.bootstrap, backlog)
        print(
            f"== drain: {changes:,} changes ({len(backlog):,} messages with the tombstones) produced in "
            f"{time.perf_counter() - t0:.1f} s with the CLI stopped; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        del backlog
        cli = start_cli(db, work, "drain", broker.bootstrap, "--ends_at_latest_offsets")
        cpu = TreeCpu(cli.tree.process.pid).start()
        if args.profile:  # the whole tree: the tasks run in Spark's Python workers
            spy = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(cli.tree.process.pid),
                 "--subprocesses", "--idle", "--nonblocking", "--rate", "20", "--format", "raw",
                 "--output", f"{args.profile}-drain.txt"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        done = cli.tree.exited(args.timeout)
        elapsed = cli.tree.elapsed()
        drain_cpu = cpu.stop()
        code = cli.tree.wait(10) if done else None
        if code != 0:
            if code is None:
                cli.tree.py_spy()
            raise RuntimeError(f"the drain exited {code}:\n{cli.tree.tail()}")
        if spy is not None:
            spy.wait(60)  # it ends with the process it records
            spy = None
        cli.stop()
        print(
            f"  exited 0 after {elapsed:.1f} s = {changes / elapsed:,.0f} changes/s (process start "
            f"included); {drain_cpu:.1f} CPU-s; at most {cli.max_processes} processes, PSS "
            f"{cli.max_pss / MIB:,.0f} MiB",
            flush=True,
        )
        print_log(cli.tree, limit=30)
        ok["drain"] = check_mirrors(db, tables)
        drain, cli = cli, None
    finally:
        if spy is not None:
            spy.kill()
        if cli is not None:
            cli.scraper.stop_event.set()
            cli.tree.stop(timeout=30)
        broker.stop()
    report(args, db, tables, producer, steady, drain, changes, elapsed, ok)


def report(
    args: argparse.Namespace,
    db: Database,
    tables: dict[str, Path],
    producer: SteadyChanges,
    steady: Cli,
    drain: Cli,
    backlog: int,
    drain_s: float,
    ok: dict[str, bool],
) -> None:
    # Each table's log, replayed: when each row version first shows and leaves; versions per batch.
    commit_files: dict[int, list[float]] = {}
    first: list[dict] = []
    gone: list[dict] = []
    for topic in db.topics:
        versions, f, g = replay_log(tables[topic])
        first.append(f)
        gone.append(g)
        for mtime, batch in versions:
            if batch is not None:
                commit_files.setdefault(batch, []).append(mtime)
    # Latency of each change after the warm-up.
    latency, superseded, total = [], 0, 0
    for t, aid, op, produced, removed in producer.records:
        if produced / 1e6 < producer.started + args.warmup:
            continue
        total += 1
        at = gone[t].get((aid, removed)) if op == "d" else first[t].get((aid, produced))
        if at is None:
            superseded += 1
        else:
            latency.append(at - produced / 1e6)
    lat = np.array(latency)

    print()
    print(f"{describe()}; load average at the end {os.getloadavg()[0]:.2f}")
    print(
        "batch: tables | row changes | tasks (first start -> last end, s; run time summed) | commit phase: "
        "last task end -> last commit file, -> last 'mirror' line | first -> last 'mirror' line |"
        " one table's commit_batch s: p50 / max / sum (measured)"
    )
    phases: dict[str, dict[int, tuple[float, float, int]]] = {}
    per_table_s: dict[str, list[float]] = {}
    for label, cli in (("steady", steady), ("drain", drain)):
        by_batch: dict[int, list[tuple[float, str, int]]] = {}
        per_table: dict[str, list[int]] = {}
        for at, uri, batch, rows in mirror_lines(cli.tree):
            by_batch.setdefault(batch, []).append((at, uri, rows))
            per_table.setdefault(uri, []).append(batch)
        events = spark_events(cli.events)
        seconds = cli.scraper.per_commit(per_table)
        for b in sorted(by_batch):
            lines = by_batch[b]
            e = events.get(b, BatchEvents())
            last_task = max(e.task_finishes, default=float("nan"))
            first_task = min(e.task_launches, default=float("nan"))
            phase = max(commit_files[b]) - last_task
            by_log = max(a for a, _, _ in lines) - last_task
            span = max(a for a, _, _ in lines) - min(a for a, _, _ in lines)
            start = min(a for a, _, _ in lines)
            kind = label
            if label == "steady" and (b == min(by_batch) or start < producer.started + args.warmup):
                kind = "snapshot" if b == min(by_batch) else "warm-up"
            elif label == "steady" and start > producer.ended + 2 * TRIGGER_S:
                kind = "tail"
            s = np.array([seconds[u, b] for _, u, _ in lines if (u, b) in seconds])
            each = f"{pct(s, 50):.3f} / {s.max():.3f} / {s.sum():.1f} ({len(s)})" if len(s) else "-"
            print(
                f"  {kind} {b}: {len(lines)} | {sum(r for _, _, r in lines):,} | {len(e.task_launches)} "
                f"({last_task - first_task:.2f}, run {e.task_run_s:.2f}) | {phase:.2f} s, {by_log:.2f} s | "
                f"{span:.2f} s | {each}",
                flush=True,
            )
            phases.setdefault(kind, {})[b] = (phase, by_log, len(lines))
            if kind in ("steady", "drain"):
                per_table_s.setdefault(kind, []).extend(s.tolist())
        if label == "drain":
            triggers = [
                time_of(events[b].progress["timestamp"])
                for b in by_batch
                if b in events and events[b].progress
            ]
            last_commit = max(max(commit_files[b]) for b in by_batch)
            drain_query_s = last_commit - min(triggers) if triggers else float("nan")
            drain_batches = len(by_batch)

    print()
    n = len(producer.records)
    steady_phases = phases.get("steady", {})
    full = [p for p, _, k in steady_phases.values() if k == len(db.topics)]
    ph = np.array([p for p, _, _ in steady_phases.values()])
    lg = np.array([p for _, p, _ in steady_phases.values()])
    print(
        f"steady: {n:,} changes at {n / (producer.ended - producer.started):,.0f} changes/s; "
        f"{len(steady_phases)} batches after the warm-up"
    )
    print(
        f"  change -> visible (commit file mtime), {len(lat):,} changes produced after the first "
        f"{args.warmup:.0f} s ({superseded:,} of {total:,} superseded within their batch, left out): "
        f"p50 {pct(lat, 50):.2f} s, p95 {pct(lat, 95):.2f} s, p99 {pct(lat, 99):.2f} s, max "
        f"{lat.max() if len(lat) else float('nan'):.2f} s; target p99 <= {TARGET_P99_S:.0f} s: "
        f"{verdict(pct(lat, 99) <= TARGET_P99_S)}"
    )
    print(
        f"  commit phase (last task end -> last commit file): p50 {pct(ph, 50):.2f} s, max "
        f"{ph.max() if len(ph) else float('nan'):.2f} s ({len(full)} of {len(ph)} batches touched all "
        f"{len(db.topics)} tables: max {max(full, default=float('nan')):.2f} s); to the last 'mirror' "
        f"line p50 {pct(lg, 50):.2f} s, max {lg.max() if len(lg) else float('nan'):.2f} s; target <= "
        f"{TARGET_COMMIT_PHASE_S:.0f} s: {verdict(bool(full) and max(full) <= TARGET_COMMIT_PHASE_S)}"
    )
    for kind, values in per_table_s.items():
        v = np.array(values)
        print(
            f"  one table's commit_batch (load, fold, MERGE, staged files deleted), {kind} batches: p50 "
            f"{pct(v, 50):.3f} s, p90 {pct(v, 90):.3f} s, max {v.max() if len(v) else float('nan'):.3f} s "
            f"({len(v)} commits measured)"
        )
    for kind in ("snapshot", "drain"):
        for b, (p, lg_b, k) in phases.get(kind, {}).items():
            print(
                f"  {kind} batch {b}: {k} tables, commit phase {p:.2f} s (to the last 'mirror' line "
                f"{lg_b:.2f} s)"
            )
    print(
        f"drain: {backlog:,} changes in {drain_batches} batch(es); process start to exit {drain_s:.1f} s = "
        f"{backlog / drain_s:,.0f} changes/s; first trigger to last mirror commit {drain_query_s:.1f} s = "
        f"{backlog / drain_query_s:,.0f} changes/s (postgres-cdc mirror: {POSTGRES_CDC_BACKLOG:,} "
        "changes/s, query start included)"
    )
    worst_p = max(steady.max_processes, drain.max_processes)
    worst_m = max(steady.max_pss, drain.max_pss)
    print(
        f"process tree: at most {steady.max_processes} (snapshot + steady) / {drain.max_processes} (drain) "
        f"processes, PSS {steady.max_pss / MIB:,.0f} / {drain.max_pss / MIB:,.0f} MiB; target <= "
        f"{TARGET_PROCESSES} processes: {verdict(worst_p <= TARGET_PROCESSES)}; <= 2 GiB: "
        f"{verdict(worst_m <= TARGET_PSS)}"
    )
    print(
        f"every mirror equals the model: after the snapshot {ok.get('snapshot')}, after the steady load "
        f"{ok.get('steady')}, after the drain {ok.get('drain')}",
        flush=True,
    )
    if args.profile:
        profile_summary(
            Path(f"{args.profile}-steady.txt"), "commit_batch (deltaflow/sinks/kafka_mirror", "._commit ("
        )
        profile_summary(
            Path(f"{args.profile}-drain.txt"),
            "_write_change_task (deltaflow/sources/kafka_ingest",
            "ChangeReader.fold (",
        )


def profile_summary(path: Path, anchor: str, drill: str) -> None:
    """Where the samples (py-spy, idle included) below a function (``anchor``, part of its frame)
    went: the function it called, and below the callee ``drill``, the innermost frames."""
    steps: dict[str, int] = {}
    below: dict[str, int] = {}
    total = 0
    if not path.exists():
        print(f"profile {path}: not written")
        return
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
        at = next((i for i, f in enumerate(frames) if anchor in f), None)
        if at is None or not count.isdigit():
            continue
        n = int(count)
        total += n
        step = frames[at + 1] if at + 1 < len(frames) else "(itself)"
        steps[step] = steps.get(step, 0) + n
        if drill in step:
            below[frames[-1]] = below.get(frames[-1], 0) + n
    print(f"profile {path}: {total:,} samples below {anchor}...")
    for name, n in sorted(steps.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {100 * n / max(total, 1):5.1f}%  {name}")
    print(f"  innermost frames below {drill.strip('.( ')}:")
    for name, n in sorted(below.items(), key=lambda kv: -kv[1])[:12]:
        print(f"  {100 * n / max(total, 1):5.1f}%  {name}")


def time_of(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--rows", type=int, default=1_000, help="snapshot rows per table")
    parser.add_argument("--rate", type=int, default=2_000, help="steady: changes per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="steady: seconds of changes")
    parser.add_argument("--warmup", type=float, default=10.0, help="steady: first seconds left out")
    parser.add_argument("--backlog", type=int, default=200_000, help="drain: changes")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--profile",
        metavar="PREFIX",
        help="py-spy: PREFIX-steady.txt (the CLI's driver while the steady changes run), PREFIX-drain.txt "
        "(the whole tree during the drain)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="bound of each wait, seconds")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="deltaflow-debezium-"))
    try:
        run(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
