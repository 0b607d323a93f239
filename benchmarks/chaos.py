"""Soak: exactly once while processes are killed and storage misbehaves.

Runs, for ``--duration`` seconds, ``deltaflow ingest`` (Kafka -> ``s3://lake/events`` with a
dead-letter table ``s3://lake/dlq`` and auto-compaction) and a YAML pipeline (landing JSON files
-> ``s3://lake/files``) against a local moto S3 server behind
:class:`deltaflow.testing.FaultyHttpProxy` and a local Kafka-protocol broker (tansu), while
messages and files keep arriving. A supervisor restarts every deltaflow process that exits, as
systemd or Kubernetes would. Faults, at random (``--seed``):

* SIGKILL of a process's whole group (driver, JVM, Python workers), at least ``--min-kills``,
  each after the process committed something since its start;
* the ingest's Spark checkpoint deleted while it is down (its Kafka progress is in the tables);
* lost commit responses (the log entry's PUT is forwarded, the client gets a 500);
* slow requests, failing requests (503), connection resets;
* a concurrent ``deltaflow optimize`` of the events table;
* ``deltaflow vacuum --full --retention-hours 0 --force --execute`` of a running workload's
  table beside its stream (never-referenced files: a batch's files before their commit).
* the ingest's topic deleted and re-created under its name (its offsets start again at 0;
  ingest runs with ``--fail_on_data_loss false`` and must restart at the new topic's earliest
  offset). Production pauses until the tables hold every message of the old topic, so the
  deletion itself loses nothing, and resumes once ingest has taken up the new topic (a new
  topic that passes the old offsets first cannot be told from the old one).
* a slow file write: a landing file written in place, half a line flushed, the rest
  ``SLOW_WRITE_PAUSE_S`` later (the files source waits for its ``min_file_age``).

Then the faults stop, each workload drains (``--ends_at_latest_offsets`` / ``--available-now``)
and two independent readers (DuckDB's delta extension over S3, and delta-rs) check that every
produced message is in ``events`` or ``dlq`` exactly once, every landed row in ``files``
exactly once, and that every file a log references exists. Exit 1 on any loss or duplicate.

    .venv/bin/python benchmarks/chaos.py --duration 600 --min-kills 20 [--seed 1]
        [--workloads ingest,yaml] [--json report.json]
"""

from __future__ import annotations

import argparse
import base64
import collections
import contextlib
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deltaflow.testing import S3_TEST_CREDENTIALS, FaultyHttpProxy, start_broker, start_s3  # noqa: E402

#: The PUT that writes a Delta log entry: the commit itself.
LOG_ENTRY = r"_delta_log/\d{20}\.json$"
PARTITIONS = 3
#: A process is killed once it committed since its start, or this long after its start.
KILL_ANYWAY_AFTER_S = 25.0
#: Messages produced per round, and the pause between rounds.
MESSAGES_PER_ROUND = 40
PRODUCE_EVERY_S = 0.5
#: One message in BAD_EVERY is not JSON: it must end up in the dead-letter table.
BAD_EVERY = 20
ROWS_PER_FILE = 50
LAND_EVERY_S = 1.0
#: A slow write's pause between its two halves (uniform): below the files source's default
#: min_file_age (10 s), as a writer that flushes as it goes.
SLOW_WRITE_PAUSE_S = (3.0, 8.0)
#: Seconds between two non-kill faults (uniform).
FAULT_GAP_S = (2.0, 6.0)
#: The vacuum beside a stream: never-referenced files of any age (a batch's before its commit).
VACUUM_FULL = ["--full", "--retention-hours", "0", "--force", "--execute"]
#: How long the drain of each workload may take.
DRAIN_TIMEOUT_S = 600
#: The re-created topic: at most this many per run; how long it waits for ingest to hold the
#: old topic's messages, and then to take up the new topic, before it gives up waiting.
MAX_RECREATES = 2
RECREATE_WAIT_S = 180.0
#: Stderr lines kept per unexpected exit.
TAIL_LINES = 5
CREDENTIALS = S3_TEST_CREDENTIALS


@dataclasses.dataclass
class Report:
    seconds: float = 0.0
    kills: int = 0
    #: Kills of a process that had sent commits of its own since its start (the rest hit a
    #: process still starting or working on its first batch).
    kills_after_commits: int = 0
    faults: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    exits: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    unexpected_exits: list[str] = dataclasses.field(default_factory=list)
    produced_good: int = 0
    produced_bad: int = 0
    landed_rows: int = 0
    found: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    missing_files: int = 0

    @property
    def ok(self) -> bool:
        return self.missing_files == 0 and all(
            r["duplicates"] == 0 and r["lost"] == 0 and r["unexpected"] == 0 for r in self.found.values()
        )

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["faults"], data["exits"], data["ok"] = dict(self.faults), dict(self.exits), self.ok
        return data


class Worker:
    """A deltaflow process, restarted whenever it exits until :meth:`retire`."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path, report: Report) -> None:
        self.name, self.argv, self.env, self.log, self.report = name, argv, env, log, report
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0
        self.killed = False
        self.before_start: Callable[[], None] | None = None
        self._retired = False

    def start(self) -> None:
        if self.before_start is not None:
            self.before_start()
            self.before_start = None
        with self.log.open("ab") as out:
            out.write(f"\n=== start {time.strftime('%T')} ===\n".encode())
            self.process = subprocess.Popen(
                self.argv, cwd=ROOT, env=self.env, stdout=out, stderr=out, start_new_session=True
            )
        self.started_at, self.killed = time.monotonic(), False

    def check(self) -> None:
        """Restart the process if it exited; record how it exited."""
        if self._retired or self.process is None or self.process.poll() is None:
            return
        code = self.process.returncode
        self.report.exits[f"{self.name}:{'SIGKILL' if code == -signal.SIGKILL else code}"] += 1
        if not (self.killed and code == -signal.SIGKILL):
            tail = self.log.read_text(errors="replace").strip().splitlines()[-TAIL_LINES:]
            self.report.unexpected_exits.append(f"{self.name} exited {code}: " + " | ".join(tail))
        self.start()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def retire(self) -> None:
        self._retired = True
        self.kill()


def _bad(n: int) -> bytes:
    return b"not json %d" % n


@contextlib.contextmanager
def _services() -> Iterator[tuple[str, FaultyHttpProxy, Any]]:
    s3 = start_s3()
    proxy = FaultyHttpProxy(s3.endpoint)
    broker = start_broker()
    try:
        yield s3.endpoint, proxy, broker
    finally:
        broker.stop()
        proxy.close()
        s3.stop()


def run(
    duration_s: float,
    min_kills: int,
    seed: int = 1,
    workloads: tuple[str, ...] = ("ingest", "yaml"),
    work_dir: Path | None = None,
    say: Callable[[str], None] = print,
) -> Report:
    """Run the soak and verify; the report says what happened and what the readers found."""
    rng = random.Random(seed)
    report = Report()
    work = work_dir or Path(tempfile.mkdtemp(prefix="deltaflow-chaos-"))
    started = time.monotonic()
    with _services() as (endpoint, proxy, broker):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DELTAFLOW_TEST_"))}
        env.update(CREDENTIALS, AWS_ENDPOINT_URL=proxy.endpoint)
        direct = {**CREDENTIALS, "AWS_ENDPOINT_URL": endpoint}
        topic = broker.create_topic(partitions=PARTITIONS)
        cli = [sys.executable, "-m", "deltaflow.cli"]
        workers: list[Worker] = []
        produced: list[bytes] = []
        landed: list[int] = []
        stop = threading.Event()

        ingest_ckpt = work / "ingest-checkpoint"
        ingest_args = [*cli, "ingest", topic, "s3://lake/events", "--kafka", broker.bootstrap]
        ingest_args += ["--app_id", "chaos", "--schema", "id LONG, payload STRING"]
        ingest_args += ["--dlq_table_location", "s3://lake/dlq", "--checkpoint_location", str(ingest_ckpt)]
        ingest_args += ["--auto_compact_min_files", "5", "--max_messages_per_batch", "2000"]
        # The re-created topic: the new topic's offsets are read from its earliest.
        ingest_args += ["--fail_on_data_loss", "false"]
        producing = threading.Event()
        producing.set()
        produce_lock = threading.Lock()
        recreating: list[threading.Thread] = []
        if "ingest" in workloads:
            workers.append(
                Worker("ingest", [*ingest_args, "--allowed_latency", "1"], env, work / "ingest.log", report)
            )

            def produce() -> None:
                while not stop.is_set():
                    producing.wait()
                    with produce_lock:
                        start = len(produced)
                        batch = [
                            _bad(n)
                            if n % BAD_EVERY == BAD_EVERY - 1
                            else json.dumps({"id": n, "payload": f"p{n}"}).encode()
                            for n in range(start, start + MESSAGES_PER_ROUND)
                        ]
                        broker.produce(topic, batch, partitions=PARTITIONS)
                        produced.extend(batch)
                    stop.wait(PRODUCE_EVERY_S)

            threading.Thread(target=produce, name="producer", daemon=True).start()

        landing = work / "landing"
        pipeline = work / "pipeline.yaml"
        #: Pauses of the slow writes the faults asked for, taken by the lander in turn.
        slow_writes: list[float] = []
        lander: threading.Thread | None = None
        if "yaml" in workloads:
            landing.mkdir(parents=True)
            pipeline.write_text(
                textwrap.dedent(
                    f"""
                    pipelines:
                      - id: chaos-files
                        source: {{type: files, path: "{landing}", format: json,
                                  schema: "id LONG, name STRING",
                                  rescued_data_column: null, max_files_per_trigger: 50}}
                        checkpoint_location: "{work}/yaml-checkpoint"
                        sinks:
                          - table_uri: s3://lake/files
                            auto_compact_min_files: 5
                    """
                )
            )
            workers.append(Worker("yaml", [*cli, "run", str(pipeline)], env, work / "yaml.log", report))

            def land() -> None:
                n = 0
                while not stop.is_set():
                    rows = range(n * ROWS_PER_FILE, (n + 1) * ROWS_PER_FILE)
                    text = "".join(json.dumps({"id": i, "name": f"n{i}"}) + "\n" for i in rows)
                    if slow_writes:
                        # In place, as a writer that flushes as it goes: half a line, then a pause.
                        cut = len(text) // 2 + 3
                        with (landing / f"f{n:06d}.json").open("w") as out:
                            out.write(text[:cut])
                            out.flush()
                            time.sleep(slow_writes.pop(0))
                            out.write(text[cut:])
                    else:
                        tmp = landing / f".f{n:06d}.json.tmp"  # names starting with . are skipped
                        tmp.write_text(text)
                        tmp.rename(landing / f"f{n:06d}.json")
                    landed.extend(rows)
                    n += 1
                    stop.wait(LAND_EVERY_S)

            lander = threading.Thread(target=land, name="lander", daemon=True)
            lander.start()

        for w in workers:
            w.start()
        say(f"soak in {work}: {', '.join(w.name for w in workers)} for {duration_s:.0f} s")

        tables = {"ingest": "/lake/events/_delta_log/0", "yaml": "/lake/files/_delta_log/0"}

        def log_puts(worker: str) -> int:
            """Commits (attempts) to the worker's main table so far."""
            return sum(1 for m, p in list(proxy.requests) if m == "PUT" and tables[worker] in p)

        optimizers: list[subprocess.Popen[bytes]] = []
        vacuums: list[subprocess.Popen[bytes]] = []
        vacuumed = {"ingest": "s3://lake/events", "yaml": "s3://lake/files"}
        kill_every = duration_s / (min_kills + 1)
        next_kill = time.monotonic() + kill_every
        next_fault = time.monotonic() + rng.uniform(*FAULT_GAP_S)
        puts_at_start = {w.name: 0 for w in workers}
        deadline = time.monotonic() + duration_s
        proxy.lose_response("PUT", LOG_ENTRY, times=2)  # at least two lost responses early on
        report.faults["lost_response"] += 2
        # Kills or a lost response still missing by then: report, do not spin. Long enough for a
        # process restarted late by a slow machine to become killable anyway (KILL_ANYWAY_AFTER_S).
        give_up = deadline + max(duration_s, 2 * KILL_ANYWAY_AFTER_S)

        def owed() -> bool:
            """A slow machine may reach the deadline before the kills asked for, or before any
            commit met the lost-response rule armed above: go on until both happened."""
            return report.kills < min_kills or proxy.counts["lose_response"] == 0

        while time.monotonic() < deadline or (owed() and time.monotonic() < give_up):
            for w in workers:
                before = w.process
                w.check()
                if w.process is not before:
                    puts_at_start[w.name] = log_puts(w.name)
            now = time.monotonic()
            if now >= next_kill and (now < deadline or report.kills < min_kills):
                # Kill a process that committed since it started (so every kill interrupts work).
                ready = [
                    w
                    for w in workers
                    if log_puts(w.name) > puts_at_start[w.name] + 2
                    or now - w.started_at > KILL_ANYWAY_AFTER_S
                ]
                if ready:
                    victim = rng.choice(ready)
                    if victim.name == "ingest" and rng.random() < 0.3:
                        victim.kill()
                        victim.before_start = lambda: shutil.rmtree(ingest_ckpt, ignore_errors=True)
                        report.faults["checkpoint_deleted"] += 1
                    else:
                        victim.kill()
                    report.kills += 1
                    commits = log_puts(victim.name) - puts_at_start[victim.name]
                    report.kills_after_commits += commits > 0
                    say(
                        f"{now - started:6.0f} s  kill {victim.name} ({report.kills}) after "
                        f"{now - victim.started_at:.0f} s and {commits} commit request(s) of its own"
                    )
                    next_kill = now + kill_every
            if now >= next_fault and now < deadline:
                kind = rng.choice(
                    [
                        "lost_response",
                        "slow",
                        "failing",
                        "reset",
                        "optimize",
                        "vacuum_full",
                        "recreate_topic",
                        "slow_write",
                    ]
                )
                if kind == "lost_response":
                    proxy.lose_response("PUT", LOG_ENTRY, times=rng.randint(1, 3))
                elif kind == "slow":
                    proxy.delay("*", "", rng.uniform(0.2, 1.5), times=rng.randint(5, 40))
                elif kind == "failing":
                    proxy.fail("*", "", rng.choice([500, 503]), times=rng.randint(2, 12))
                elif kind == "reset":
                    proxy.reset("*", "", times=rng.randint(1, 6), after_forward=rng.random() < 0.5)
                elif kind == "slow_write" and "yaml" in workloads:
                    slow_writes.append(rng.uniform(*SLOW_WRITE_PAUSE_S))
                elif kind == "optimize" and "ingest" in workloads:
                    optimizers = [p for p in optimizers if p.poll() is None]
                    if not optimizers:
                        optimizers.append(
                            subprocess.Popen(
                                [*cli, "optimize", "s3://lake/events"],
                                cwd=ROOT,
                                env=env,
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                        )
                elif kind == "vacuum_full":
                    vacuums = [p for p in vacuums if p.poll() is None]
                    if not vacuums:
                        table = vacuumed[rng.choice(sorted(w.name for w in workers))]
                        vacuums.append(
                            subprocess.Popen(
                                [*cli, "vacuum", table, *VACUUM_FULL],
                                cwd=ROOT,
                                env=env,
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL,
                            )
                        )
                elif kind == "recreate_topic":
                    busy = any(t.is_alive() for t in recreating)
                    if "ingest" not in workloads or busy or len(recreating) >= MAX_RECREATES:
                        kind = "recreate_topic_not_now"
                    else:
                        thread = threading.Thread(
                            target=_recreate_topic,
                            args=(broker, topic, direct, producing, produce_lock, report, say),
                            name="recreate-topic",
                            daemon=True,
                        )
                        recreating.append(thread)
                        thread.start()
                report.faults[kind] += 1
                next_fault = now + rng.uniform(*FAULT_GAP_S)
            time.sleep(0.2)

        # A re-created topic under way waits for ingest to catch up and take up the new topic:
        # the workers are still supervised meanwhile (the loop may have ended on a kill, and a
        # worker left down would make it wait its whole bound for nothing).
        join_until = time.monotonic() + 2 * RECREATE_WAIT_S
        while any(t.is_alive() for t in recreating) and time.monotonic() < join_until:
            for w in workers:
                w.check()
            time.sleep(0.2)
        # Drain: no more faults, no more input; each workload catches up and exits 0.
        stop.set()
        producing.set()
        if lander is not None:
            lander.join()  # a slow write under way is finished first
        for w in workers:
            w.retire()
        for p in optimizers + vacuums:
            p.wait(300)
        proxy.heal()
        report.faults.update({f"proxy_{k}": v for k, v in proxy.counts.items()})
        say(f"{time.monotonic() - started:6.0f} s  draining")
        if "ingest" in workloads:
            _drain([*ingest_args, "--ends_at_latest_offsets"], env, work / "ingest.log", report, "ingest")
        if "yaml" in workloads:
            _drain([*cli, "run", str(pipeline), "--available-now"], env, work / "yaml.log", report, "yaml")

        say(f"{time.monotonic() - started:6.0f} s  verifying")
        good = [m for m in produced if not m.startswith(b"not json")]
        bad = [m for m in produced if m.startswith(b"not json")]
        report.produced_good, report.produced_bad, report.landed_rows = len(good), len(bad), len(landed)
        if "ingest" in workloads:
            expected_ids = [json.loads(m)["id"] for m in good]
            _check(report, "events", expected_ids, _ids("s3://lake/events", direct, endpoint, "id"))
            dead = _ids("s3://lake/dlq", direct, endpoint, "value_base64")
            decoded = {
                reader: values if isinstance(values, str) else [base64.b64decode(v) for v in values]
                for reader, values in dead.items()
            }
            _check(report, "dlq", bad, decoded)
        if "yaml" in workloads:
            _check(report, "files", landed, _ids("s3://lake/files", direct, endpoint, "id"))
        for table in [
            t for t, on in (("events", "ingest"), ("dlq", "ingest"), ("files", "yaml")) if on in workloads
        ]:
            report.missing_files += _missing_files(f"s3://lake/{table}", direct)
    report.seconds = time.monotonic() - started
    return report


def _recreate_topic(
    broker: Any,
    topic: str,
    options: dict[str, str],
    producing: threading.Event,
    produce_lock: threading.Lock,
    report: Report,
    say: Callable[[str], None],
) -> None:
    """Delete and re-create ``topic`` once the events table holds all of it; production
    resumes when ingest's progress has moved back to the new topic (or after the wait)."""
    producing.clear()
    with produce_lock:  # a round in flight lands before the topic is deleted
        pass
    try:
        latest = _latest_offsets(broker, topic)
        if not _wait_for(lambda: _progress(topic, options) == {p: o - 1 for p, o in latest.items() if o}):
            report.faults["recreate_topic_ingest_behind"] += 1
            return
        broker.recreate_topic(topic, partitions=PARTITIONS)
        report.faults["recreate_topic_done"] += 1
        say(f"re-created {topic} (the table held offsets {latest})")

        def taken_up() -> bool:
            progress = _progress(topic, options)
            return all(progress.get(p, -1) < o - 1 for p, o in latest.items() if o)

        if not _wait_for(taken_up):
            report.faults["recreate_topic_not_taken_up"] += 1
    finally:
        producing.set()


def _wait_for(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + RECREATE_WAIT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # no table yet, a store hiccup: ask again
            if condition():
                return True
        time.sleep(1.0)
    return False


def _latest_offsets(broker: Any, topic: str) -> dict[int, int]:
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(PARTITIONS)}
    admin = broker.admin()  # must outlive the futures
    answers = admin.list_offsets(request, request_timeout=15)
    return {tp.partition: int(f.result(timeout=30).offset) for tp, f in answers.items()}


def _progress(topic: str, options: dict[str, str]) -> dict[int, int]:
    """The events table's last offset per partition of ``topic`` (ingest's txns)."""
    from deltalake import DeltaTable

    table = DeltaTable("s3://lake/events", storage_options=options)
    versions = {p: table.transaction_version(f"chaos-{topic}-{p}") for p in range(PARTITIONS)}
    return {p: int(v) for p, v in versions.items() if v is not None}


def _drain(argv: list[str], env: dict[str, str], log: Path, report: Report, name: str) -> None:
    with log.open("ab") as out:
        done = subprocess.run(argv, cwd=ROOT, env=env, stdout=out, stderr=out, timeout=DRAIN_TIMEOUT_S)
    report.exits[f"{name}-drain:{done.returncode}"] += 1
    if done.returncode != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-TAIL_LINES:]
        report.unexpected_exits.append(f"{name} drain exited {done.returncode}: " + " | ".join(tail))


def _ids(uri: str, options: dict[str, str], endpoint: str, column: str) -> dict[str, list[Any] | str]:
    """``column`` of every row, read by DuckDB's delta extension and by delta-rs (a reader that
    fails, e.g. on a file the log references and the bucket lacks, gives its error instead)."""
    from deltalake import DeltaTable

    from tests.fixtures.readers import duckdb_delta

    out: dict[str, list[Any] | str] = {}
    con = duckdb_delta(endpoint)
    try:
        out["duckdb"] = [r[0] for r in con.execute(f"SELECT {column} FROM delta_scan('{uri}')").fetchall()]
    except Exception as exc:  # noqa: BLE001 - reported, the run is then not ok
        out["duckdb"] = f"{type(exc).__name__}: {exc}"
    finally:
        con.close()
    try:
        table = DeltaTable(uri, storage_options=options).to_pyarrow_table(columns=[column])
        out["delta-rs"] = table[column].to_pylist()
    except Exception as exc:  # noqa: BLE001 - reported, the run is then not ok
        out["delta-rs"] = f"{type(exc).__name__}: {exc}"
    return out


def _check(report: Report, table: str, expected: list[Any], found: dict[str, list[Any] | str]) -> None:
    want = collections.Counter(expected)
    for reader, values in found.items():
        if isinstance(values, str):  # unreadable: no row could be checked
            report.found[f"{table} ({reader})"] = {
                "rows": 0,
                "expected": len(expected),
                "duplicates": 0,
                "lost": len(set(expected)),
                "unexpected": 0,
                "error": values,
            }
            continue
        got = collections.Counter(values)
        report.found[f"{table} ({reader})"] = {
            "rows": len(values),
            "expected": len(expected),
            "duplicates": sum(c - 1 for c in got.values() if c > 1),
            "lost": sum(1 for v in want if v not in got),
            "unexpected": sum(1 for v in got if v not in want),
        }


def _missing_files(uri: str, options: dict[str, str]) -> int:
    import pyarrow as pa
    from deltalake import DeltaTable
    from pyarrow import fs as pafs

    from deltaflow.io.storage import filesystem

    table = DeltaTable(uri, storage_options=options)
    fs, root = filesystem(uri, options)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    present = {i.path.removeprefix(root + "/") for i in infos if i.type == pafs.FileType.File}
    referenced = {a["path"] for a in pa.table(table.get_add_actions(flatten=True)).to_pylist()}
    return len(referenced - present)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--min-kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workloads", default="ingest,yaml")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()
    report = run(args.duration, args.min_kills, args.seed, tuple(args.workloads.split(",")))
    data = report.as_dict()
    if args.json:
        args.json.write_text(json.dumps(data, indent=2))
    print(json.dumps(data, indent=2))
    sys.exit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
