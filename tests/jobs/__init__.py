"""Pipelines run as separate driver processes by the crash tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
JOB_TIMEOUT_S = 300


def run_job(module: str, *args: str, crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m tests.jobs.<module> ARGS`` in its own session (process group).

    ``crash_at`` (``"<point>:<batch_id>"``) makes the sink SIGKILL the job's whole process
    group at that step, as a machine failure would; see ``deltaflow.io.faults``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("DELTAFLOW_TEST_")}
    if crash_at:
        env["DELTAFLOW_TEST_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", f"tests.jobs.{module}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=JOB_TIMEOUT_S,
        start_new_session=True,
    )
