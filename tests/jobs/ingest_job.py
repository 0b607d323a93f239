"""``deltaflow ingest`` for the crash tests, run as its own process group.

    python -m tests.jobs.ingest_job <deltaflow ingest arguments>

A crash point reached inside a Spark task (a Python worker in its own process group) kills
this whole group, as a machine failure would.
"""

from __future__ import annotations

import os
import sys

from deltaflow.cli import main

if __name__ == "__main__":
    os.environ["DELTAFLOW_TEST_KILL_PGID"] = str(os.getpgrp())
    main(["ingest", *sys.argv[1:]])
