"""The README's code blocks, as printed (paths aside): its Python runs, its YAML validates, and
every command line it shows names options the command has."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from deltaflow.cli import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[tuple[int, str]]:
    """``(line of the opening fence, text)`` of each fenced block in ``language``."""
    found, current, start = [], None, 0
    for number, line in enumerate(README.read_text().splitlines(), 1):
        if current is None and line.strip() == f"```{language}":
            current, start = [], number
        elif current is not None and line.strip() == "```":
            found.append((start, "\n".join(current)))
            current = None
        elif current is not None:
            current.append(line)
    return found


def test_the_readme_has_the_blocks_this_file_checks():
    assert len(_blocks("python")) == 2
    assert len(_blocks("yaml")) == 5
    assert len(_blocks("bash")) >= 7


# -- YAML ---------------------------------------------------------------------------------------

#: Blocks that show a part of a pipeline file, and the rest of a file around them.
_AROUND_SINKS = "pipelines:\n  - id: shop-cdc\n    source: {type: postgres-cdc, publication: shop_pub}\n"
_AROUND_STORAGE = "pipelines:\n  - id: events\n    source: {type: files, path: /landing, format: json}\n"


def _as_file(block: str) -> str:
    if block.startswith("pipelines:") or block.startswith("spark:"):
        return block
    if block.startswith("    sinks:"):
        return _AROUND_SINKS + block
    if block.startswith("sinks:"):
        return _AROUND_STORAGE + "\n".join("    " + line for line in block.splitlines())
    raise AssertionError(f"a YAML block of a shape this test does not know:\n{block}")


@pytest.mark.parametrize("line, block", _blocks("yaml"), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_every_yaml_block_is_a_valid_pipeline_file(tmp_path, monkeypatch, line, block):
    for name in ("KAFKA_BROKERS", "PGPASSWORD", "KEY", "SECRET"):
        monkeypatch.setenv(name, "x")
    path = tmp_path / "pipelines.yml"
    path.write_text(_as_file(block))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, f"README line {line}:\n{result.output}"
    assert "valid" in result.output


# -- command lines ------------------------------------------------------------------------------


def _command_lines() -> list[tuple[int, str]]:
    """Every ``deltaflow ...`` line of the bash blocks, continuation lines joined, comments cut."""
    lines = []
    for start, block in _blocks("bash"):
        joined = re.sub(r"\\\n\s*", " ", block)
        # A usage line wrapped without a backslash: its next line starts with spaces and "[".
        joined = re.sub(r"\n\s+\[", " [", joined)
        for offset, text in enumerate(joined.splitlines(), 1):
            text = re.sub(r"\s+#.*$", "", text).strip()
            if re.match(r"^(\.venv/bin/)?deltaflow ", text):
                lines.append((start + offset, text.removeprefix(".venv/bin/")))
    return lines


def _options(command: str) -> set[str]:
    params = cli.commands[command].params
    return {opt for param in params for opt in [*param.opts, *param.secondary_opts] if opt.startswith("-")}


@pytest.mark.parametrize("line, text", _command_lines(), ids=lambda v: str(v) if isinstance(v, int) else "")
def test_every_command_line_names_options_its_command_has(line, text):
    words = shlex.split(text)
    command = words[1]
    assert command in cli.commands, f"README line {line}: no command {command!r}"
    if "[" in text or "|" in text or re.search(r"\b[A-Z]{3,}\b", text):
        # A usage line (placeholders, [optional] parts, alternatives): each option it names.
        unknown = {w.split("=")[0] for w in re.findall(r"(?<![\w-])--?[a-zA-Z][\w-]*", text)} - _options(
            command
        )
        assert not unknown, f"README line {line}: {command} has no option(s) {sorted(unknown)}"
        return
    # A command as printed: click parses it (types, choices, required arguments), runs nothing.
    context = cli.commands[command].make_context(command, words[2:])
    assert context.params, f"README line {line}"


def test_the_command_lines_of_the_readme_are_found():
    commands = {text.split()[1] for _, text in _command_lines()}
    assert {"ingest", "optimize", "vacuum", "restore", "add-files", "convert", "read"} <= commands


# -- Python -------------------------------------------------------------------------------------


def _paths(code: str, root: Path) -> str:
    """The block's absolute paths moved under ``root``: ``/data/x`` -> ``<root>/data/x``."""
    return re.sub(r'"(/(?:data|files|delta|checkpoints)/[^"]*)"', lambda m: json.dumps(f"{root}{m[1]}"), code)


def test_the_quick_start_runs_as_printed(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (line, code), _ = _blocks("python")
    landing = tmp_path / "data" / "landing"
    landing.mkdir(parents=True)
    rows = [{"id": i, "ts": "2026-11-27T08:00:00Z", "country": ["fr", "de"][i % 2]} for i in range(6)]
    (landing / "part-0.json").write_text("\n".join(json.dumps(r) for r in rows))
    backfill = tmp_path / "data" / "backfill"
    backfill.mkdir()
    pq.write_table(
        pa.table(
            {
                "id": [100, 101],
                "ts": pa.array([None, None], pa.timestamp("us", "UTC")),
                "country": ["it", "it"],
            }
        ),
        backfill / "part-0.parquet",
    )
    started = _run_statements(spark, _paths(code, tmp_path), {}, f"README.md:{line}")
    assert len(started) == 2, f"README line {line}: the Quick start starts two queries"
    events = DeltaTable(str(tmp_path / "data" / "tables" / "events")).to_pyarrow_table()
    assert sorted(events["id"].to_pylist()) == [0, 1, 2, 3, 4, 5, 100, 101]
    assert DeltaTable(str(tmp_path / "data" / "tables" / "events")).metadata().partition_columns == [
        "country"
    ]
    copy = DeltaTable(str(tmp_path / "data" / "tables" / "events_fmt")).to_pyarrow_table()
    assert sorted(copy["id"].to_pylist()) == [0, 1, 2, 3, 4, 5]


def _run_statements(spark, code: str, namespace: dict[str, object], where: str) -> list[object]:
    """Run ``code`` statement by statement; a streaming query a statement starts has processed
    everything available before the next statement runs (as a job reading its output later
    would see it). The queries started, stopped."""
    import ast

    started: list[object] = []
    try:
        for statement in ast.parse(code).body:
            before = {q.id for q in spark.streams.active}
            exec(compile(ast.Module([statement], []), where, "exec"), namespace)
            for query in [q for q in spark.streams.active if q.id not in before]:
                started.append(query)
                query.processAllAvailable()
    finally:
        for query in started:
            query.stop()  # type: ignore[attr-defined]
    return started


def test_the_delta_format_block_runs_as_printed(spark, tmp_path):
    import pyarrow as pa
    from deltalake import write_deltalake

    _, (line, code) = _blocks("python")
    write_deltalake(
        str(tmp_path / "files/delta/user_events"), pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]})
    )
    path = str(tmp_path / "merged")
    write_deltalake(path, pa.table({"id": [1, 2], "name": ["old", "gone"]}))
    changes = spark.createDataFrame(
        [(1, "new", "UPSERT"), (2, None, "DELETE"), (4, "d", "UPSERT")], "id LONG, name STRING, op STRING"
    )
    namespace: dict[str, object] = {
        "deltaflow": __import__("deltaflow"),
        "df": spark.createDataFrame([(9, "z")], "id LONG, name STRING"),
        "changes": changes,
        "path": path,
    }
    # `versionAsOf 3` reads the copy as of its fourth commit; here the copy has one (paths aside).
    code = _paths(code, tmp_path).replace('option("versionAsOf", 3)', 'option("versionAsOf", 0)')
    started = _run_statements(spark, code, namespace, f"README.md:{line}")
    assert len(started) == 1
    copied = DeltaTable(str(tmp_path / "delta/user_events_copy")).to_pyarrow_table()
    assert sorted(copied["id"].to_pylist()) == [1, 2, 3]
    merged = DeltaTable(path).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["name"]) for r in merged) == [(1, "new"), (4, "d"), (9, "z")]
