"""What the PostgreSQL CDC benchmarks share: running pgbench against the benchmark's server, and a
thread that watches a Delta table's log for the rows each new commit makes visible."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from deltaflow.testing import PostgresServer, postgres_binary


def pgbench(server: PostgresServer, *args: str) -> None:
    command = [postgres_binary("pgbench"), "-h", server.host, "-p", str(server.port), "-U", "postgres"]
    subprocess.run([*command, *args, "postgres"], check=True, capture_output=True, text=True)


class CommitPoller(threading.Thread):
    """Every 50 ms, reads the table's new commit files; for each file a commit adds with new data
    (not auto-compaction's ``dataChange: false`` rewrites) calls :meth:`added` with the file's
    ``columns`` and the commit file's mtime (when the rows became visible), in µs."""

    def __init__(self, table: Path, columns: list[str]) -> None:
        super().__init__(name="delta-log-poller", daemon=True)
        self.table = table
        self.columns = columns
        self.seen_commits: set[str] = set()
        self.stop_event = threading.Event()

    def added(self, rows: pa.Table, visible_us: int) -> None:
        raise NotImplementedError

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.scan()
            time.sleep(0.05)
        self.scan()

    def scan(self) -> None:
        log = self.table / "_delta_log"
        if not log.is_dir():
            return
        for entry in sorted(log.glob("*.json")):
            if entry.name in self.seen_commits:
                continue
            self.seen_commits.add(entry.name)
            visible_us = int(entry.stat().st_mtime * 1e6)
            for line in entry.read_text().splitlines():
                action = json.loads(line)
                if "add" in action and action["add"].get("dataChange", True):
                    path = self.table / unquote(action["add"]["path"])
                    self.added(pq.read_table(path, columns=self.columns), visible_us)
