"""Rivven's connector files, read as they are: ``sources:`` and ``sinks:`` maps of named
connectors (``connector:`` + ``config:``), optionally ``pipelines:`` joining them by name.

:func:`translate` turns such a file into deltaflow's pipeline layout and says, key by key, what
each Rivven setting became (``deltaflow validate`` prints it). Nothing is dropped silently: a
key deltaflow cannot honour is a problem with its Rivven YAML path.

Rivven's Delta sink keys and where they go:

=========================  =====================================================================
``table_uri``,             the sink's options of the same name
``auto_create_table``,
``target_file_size_mb``,
``write_mode``,
``compression``,
``max_commit_retries``,
``partition_columns``,
``table_properties``,
``storage_options``
``batch_size``             the source's ``max_changes_per_batch`` (a micro-batch ends after the
                           transaction that reaches it; transactions are never split)
``flush_interval_secs``    the source's ``batch_interval``: changes wait at most this long, and
                           a micro-batch starts at once when ``batch_size`` changes wait (as
                           Rivven flushes on either), so a backlog drains at full speed
``s3:``                    ``storage_options``: ``AWS_REGION``, ``AWS_ENDPOINT_URL``,
                           ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
                           ``AWS_VIRTUAL_HOSTED_STYLE_REQUEST=false`` (``path_style_access``),
                           ``AWS_ALLOW_HTTP`` (``allow_http``)
``gcs:``                   refused: deltaflow's Parquet writers (pyarrow) take GCS credentials
                           from ``GOOGLE_APPLICATION_CREDENTIALS`` only, which delta-rs reads too
``azure:``                 ``storage_options``: ``AZURE_STORAGE_ACCOUNT_NAME``,
                           ``AZURE_STORAGE_ACCOUNT_KEY``
=========================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Translation", "is_rivven_layout", "translate"]

#: Rivven source connector -> deltaflow source type.
SOURCES = {"postgres-cdc": "postgres-cdc", "postgres_cdc": "postgres-cdc"}
#: Rivven sink connector names of the Delta sink.
SINKS = ("delta-lake", "delta_lake", "delta")
#: Rivven's postgres-cdc keys with another name in deltaflow.
SOURCE_RENAMES = {"slot_name": "slot", "publication_name": "publication", "snapshot_mode": "snapshot"}
SINK_SAME = (
    "table_uri",
    "auto_create_table",
    "target_file_size_mb",
    "write_mode",
    "compression",
    "max_commit_retries",
    "partition_columns",
    "table_properties",
    "storage_options",
)
STORAGE_BLOCKS: dict[str, dict[str, str]] = {
    "s3": {
        "region": "AWS_REGION",
        "endpoint": "AWS_ENDPOINT_URL",
        "access_key_id": "AWS_ACCESS_KEY_ID",
        "secret_access_key": "AWS_SECRET_ACCESS_KEY",
        "session_token": "AWS_SESSION_TOKEN",
        "path_style_access": "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
        "allow_http": "AWS_ALLOW_HTTP",
    },
    "azure": {"account": "AZURE_STORAGE_ACCOUNT_NAME", "access_key": "AZURE_STORAGE_ACCOUNT_KEY"},
}
_SECRET_WORDS = ("secret", "key", "password", "token")


@dataclass
class Translation:
    """deltaflow's pipeline file, what each Rivven key became, and the problems found."""

    data: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def is_rivven_layout(data: Mapping[str, Any]) -> bool:
    """A file of ``sources:``/``sinks:`` maps (deltaflow's own has a ``pipelines`` list)."""
    return ("sources" in data or "sinks" in data) and not isinstance(data.get("pipelines"), list)


def _flag(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def _shown(name: str, value: Any) -> str:
    return "***" if any(w in name.lower() for w in _SECRET_WORDS) else repr(value)


def translate(data: Mapping[str, Any]) -> Translation:
    """deltaflow's layout for a Rivven file (see the module docstring for the key mapping)."""
    out = Translation()
    for key in data:
        if key not in ("version", "sources", "sinks", "pipelines", "spark"):
            out.problems.append(
                f"{key}: not a key of a Rivven connector file deltaflow runs (it reads version, sources, "
                "sinks, pipelines; and deltaflow's spark)"
            )
    sources = data.get("sources") or {}
    sinks = data.get("sinks") or {}
    if not isinstance(sources, dict) or not isinstance(sinks, dict):
        out.problems.append("sources and sinks must be maps of named connectors")
        return out
    joins = _joins(data.get("pipelines"), sources, sinks, out)
    pipelines = []
    for pipeline_id, source_name, sink_name, enabled in joins:
        spec = _pipeline(pipeline_id, source_name, sources[source_name], sink_name, sinks[sink_name], out)
        if spec is not None:
            spec["enabled"] = enabled
            pipelines.append(spec)
    out.data = {"pipelines": pipelines}
    if "spark" in data:
        out.data["spark"] = data["spark"]
    return out


def _joins(
    pipelines: Any, sources: Mapping[str, Any], sinks: Mapping[str, Any], out: Translation
) -> list[tuple[str, str, str, bool]]:
    if pipelines is None:
        if len(sources) == 1 and len(sinks) == 1:
            (source,), (sink,) = sources, sinks
            out.notes.append(f"pipeline {source}-{sink}: the file's one source into its one sink")
            return [(f"{source}-{sink}", source, sink, True)]
        out.problems.append(
            f"the file has {len(sources)} source(s) and {len(sinks)} sink(s): join them with "
            "pipelines: {<name>: {source: <source>, sink: <sink>}}"
        )
        return []
    if not isinstance(pipelines, dict):
        out.problems.append("pipelines: a map of named pipelines ({<name>: {source: ..., sink: ...}})")
        return []
    joins = []
    for name, given in pipelines.items():
        spec: dict[str, Any] = given or {}
        unknown = set(spec) - {"source", "sink", "enabled"}
        if unknown:
            out.problems.append(
                f"pipelines.{name}: unknown key(s) {', '.join(sorted(unknown))} (source, sink, enabled)"
            )
        wanted_source, wanted_sink = spec.get("source"), spec.get("sink")
        if wanted_source not in sources:
            out.problems.append(
                f"pipelines.{name}.source: no source {wanted_source!r} (the file has {', '.join(sources)})"
            )
        elif wanted_sink not in sinks:
            out.problems.append(
                f"pipelines.{name}.sink: no sink {wanted_sink!r} (the file has {', '.join(sinks)})"
            )
        elif not isinstance(spec.get("enabled", True), bool):
            out.problems.append(
                f"pipelines.{name}.enabled: must be true or false (received {spec['enabled']!r})"
            )
        else:
            joins.append((str(name), str(wanted_source), str(wanted_sink), bool(spec.get("enabled", True))))
    return joins


def _pipeline(
    pipeline_id: str, source_name: str, source: Any, sink_name: str, sink: Any, out: Translation
) -> dict[str, Any] | None:
    src = _connector(f"sources.{source_name}", source, out)
    snk = _connector(f"sinks.{sink_name}", sink, out)
    if src is None or snk is None:
        return None
    connector, config, where = src
    kind = SOURCES.get(connector)
    if kind is None:
        out.problems.append(
            f"{where}.connector: {connector!r} is not a source deltaflow runs from a Rivven file "
            f"(it runs {', '.join(sorted(set(SOURCES.values())))}; Kafka, files and Delta sources are "
            "in deltaflow's own pipeline layout)"
        )
        return None
    source_spec: dict[str, Any] = {"type": kind}
    rivven_name: dict[str, str] = {}
    for key, value in config.items():
        target = SOURCE_RENAMES.get(key, key)
        out.notes.append(f"{where}.config.{key}: the source's {target} ({_shown(key, value)})")
        source_spec[target] = value
        rivven_name[target] = f"{where}.config.{key}"
    if "streams" in source:
        out.problems.append(
            f"{where}.streams: deltaflow captures the publication's tables; choose them with the publication "
            "(CREATE/ALTER PUBLICATION ... FOR TABLE ...) and leave streams out"
        )
    for spec, at, key in ((source, where, "topic"), (sink, f"sinks.{sink_name}", "topics")):
        if key in spec:
            out.notes.append(
                f"{at}.{key}: not used; deltaflow writes the source's events straight into the sink (no "
                "broker topic between them)"
            )
    sink_connector, sink_config, sink_where = snk
    if sink_connector not in SINKS:
        out.problems.append(f"{sink_where}.connector: {sink_connector!r} is not a Delta sink (delta-lake)")
        return None
    pipeline: dict[str, Any] = {"id": pipeline_id, "source": source_spec}
    sink_spec: dict[str, Any] = {"name": sink_name}
    storage: dict[str, Any] = dict(sink_config.get("storage_options") or {})
    for key, value in sink_config.items():
        path = f"{sink_where}.config.{key}"
        if key in SINK_SAME:
            sink_spec[key] = value
            if key != "storage_options":
                out.notes.append(f"{path}: the sink's {key} ({_shown(key, value)})")
        elif key in ("batch_size", "flush_interval_secs"):
            target = "max_changes_per_batch" if key == "batch_size" else "batch_interval"
            if target in source_spec:
                out.notes.append(f"{path}: {value!r} not used: the source sets {target} itself")
                continue
            source_spec[target] = value
            rivven_name[target] = path
            meaning = (
                "a micro-batch ends after the transaction that reaches it; transactions are never split"
                if key == "batch_size"
                else f"changes wait at most {value} s; a micro-batch starts at once when batch_size "
                "changes wait"
            )
            out.notes.append(f"{path}: {value!r} -> the source's {target} ({meaning})")
        elif key == "gcs":
            out.problems.append(
                f"{path}: set GOOGLE_APPLICATION_CREDENTIALS=<service account file> in the environment "
                "instead (deltaflow's Parquet writers read GCS credentials only from there; delta-rs does "
                "too) and remove the block"
            )
        elif key in STORAGE_BLOCKS and isinstance(value, dict):
            names = STORAGE_BLOCKS[key]
            for option, setting in value.items():
                if option not in names:
                    out.problems.append(f"{path}.{option}: unknown key (known: {', '.join(names)})")
                    continue
                text = str(setting).lower() if isinstance(setting, bool) else str(setting)
                if option == "path_style_access":
                    text = "false" if _flag(setting) else "true"
                given = next((k for k in storage if k.lower() == names[option].lower()), None)
                if given is not None:  # storage_options name it already (in any case): it wins
                    out.notes.append(f"{path}.{option}: not used: storage_options sets {given}")
                    continue
                storage[names[option]] = text
                out.notes.append(
                    f"{path}.{option}: storage option {names[option]}={_shown(names[option], text)}"
                )
        else:
            known = [*SINK_SAME, "batch_size", "flush_interval_secs", *STORAGE_BLOCKS, "gcs"]
            out.problems.append(f"{path}: unknown key of Rivven's Delta sink (known: {', '.join(known)})")
    if storage:
        sink_spec["storage_options"] = storage
    _check_source(source_spec, rivven_name, where, out)
    pipeline["sinks"] = [sink_spec]
    out.notes.append(f"pipeline {pipeline_id}: sources.{source_name} -> sinks.{sink_name}")
    return pipeline


def _check_source(
    spec: Mapping[str, Any], rivven_name: Mapping[str, str], where: str, out: Translation
) -> None:
    """The source's options as deltaflow validates them, each problem at its Rivven path
    (``rivven_name``: option -> the Rivven key that set it)."""
    from pydantic import ValidationError

    from deltaflow.config.models import problem
    from deltaflow.config.postgres import PostgresCdcOptions

    try:
        PostgresCdcOptions(**{k: v for k, v in spec.items() if k != "type"})
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            field = str(err["loc"][0]) if err["loc"] else ""
            name = rivven_name.get(field, field)
            at = f"sinks.{name[len('<sink>.') :]}" if name.startswith("<sink>.") else f"{where}.config.{name}"
            out.problems.append(problem(err, at if field else f"{where}.config"))


def _connector(where: str, spec: Any, out: Translation) -> tuple[str, dict[str, Any], str] | None:
    if not isinstance(spec, dict) or "connector" not in spec:
        out.problems.append(f"{where}: a connector needs connector: and config:")
        return None
    unknown = set(spec) - {"connector", "config", "topic", "streams", "topics"}
    if unknown:
        out.problems.append(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (connector, config)")
    config = spec.get("config") or {}
    if not isinstance(config, dict):
        out.problems.append(f"{where}.config: must be a map")
        return None
    return str(spec["connector"]), config, where
