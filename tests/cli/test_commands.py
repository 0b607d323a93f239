import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from deltaflow.cli import cli

ROOT = Path(__file__).resolve().parents[2]


def test_help_lists_commands_and_env_vars_without_starting_spark():
    out = subprocess.run(
        [sys.executable, "-c", "from deltaflow.cli import main; main(['demo', '--help'])"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "DELTAFLOW_DEMO_EVENTS" in out.stdout
    assert "DELTAFLOW_SPARK_MASTER" in out.stdout
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, deltaflow.cli; print('pyspark' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip() == "False"


def test_bad_flag_value_is_a_usage_error():
    result = CliRunner().invoke(cli, ["demo", "--events", "0"])
    assert result.exit_code == 2
    assert "--events" in result.output


def test_demo_streams_every_event_exactly_once(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "deltaflow.cli",
            "demo",
            "--source",
            "files",
            "--workdir",
            str(tmp_path),
            "--events",
            "5000",
            "--files",
            "4",
            "--files-per-batch",
            "2",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rows           5,000 (5,000 distinct event ids)" in out.stdout
    assert "micro-batches  2" in out.stdout
    assert "exactly once: OK (5,000 events generated)" in out.stdout
    assert (tmp_path / "tables" / "events" / "_delta_log").is_dir()


def test_kafka_demo_ingests_every_message_exactly_once(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "deltaflow.cli",
            "demo",
            "--workdir",
            str(tmp_path),
            "--events",
            "3000",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rows           2,997 (2,997 distinct event ids)" in out.stdout
    # Only the 3 malformed events are dead letters: no end-of-produce markers (the broker reports
    # each partition's tail because it is produced in a record batch of its own).
    assert "clickstream_dead_letters: 3 message(s)" in out.stdout
    assert "exactly once: OK (3,000 messages = 2,997 rows + 3 dead letters" in out.stdout
    assert (tmp_path / "tables" / "clickstream" / "_delta_log").is_dir()


def test_backfill_progress_line():
    from deltaflow.cli.output import ProgressLine

    line = ProgressLine.render(350_000, 650_000, 50_000.0)
    assert line == "[" + "#" * 10 + "." * 20 + "]  35% 350,000/1,000,000 messages, 50,000 msgs/s, ~13 s left"
    assert ProgressLine.render(10, 0, 0.0).startswith("[" + "#" * 30 + "] 100% 10/10 messages")
