"""The one style of configuration: frozen pydantic models, and one way to report their problems.

Every option set is a :class:`FrozenModel` (unknown keys refused, values never changed after
validation). Every validation problem reads the same everywhere (sink options, ingest flags,
pipeline files, data-source options): the key, what is allowed, and the value received,
masked when it is a secret (:func:`problem`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError

from deltaflow.config.secrets import masked
from deltaflow.errors import ConfigError

__all__ = ["FrozenModel", "JsonObject", "SparkOptions", "problem", "problems"]


def _json_text(value: Any) -> Any:
    return json.loads(value or "{}") if isinstance(value, str) else value


#: A mapping option of a Spark data source (``storage_options``): Spark passes every option as
#: a string, so it arrives as JSON text (empty: ``{}``); a mapping given directly is taken as is.
JsonObject = Annotated[dict[str, str], BeforeValidator(_json_text)]


class FrozenModel(BaseModel):
    """Base of deltaflow's option sets: immutable, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def problem(err: Mapping[str, Any], where: str, *, received: Any = None, show: bool = True) -> str:
    """One pydantic error as ``where: what is wrong (received <value>)``."""
    kind = err["type"]
    if kind == "missing":
        return f"{where}: required option is missing"
    if kind == "extra_forbidden":
        return f"{where}: unknown option"
    if kind == "literal_error":
        msg = f"must be one of {err.get('ctx', {}).get('expected', '')}"
    else:
        msg = str(err["msg"]).removeprefix("Value error, ")
    if not where:  # a rule across options: its message names them
        return msg
    value = err.get("input") if received is None else received
    shown = masked(value, where.rsplit(".", 1)[-1])
    if not show or isinstance(shown, dict | list):
        return f"{where}: {msg}"
    return f"{where}: {msg} (received {shown!r})"


def problems(exc: ValidationError, where: Callable[[Sequence[Any]], str] | None = None) -> list[str]:
    """Every problem of ``exc``; ``where`` names an error's location (default: dotted keys)."""
    name = where or (lambda loc: ".".join(str(p) for p in loc))
    return [problem(err, name(err["loc"])) for err in exc.errors(include_url=False)]


class SparkOptions(FrozenModel):
    """Options a Spark data source receives: lower-cased string values, validated once here."""

    #: What the options configure, for messages ("the Delta source").
    what: ClassVar[str] = "the data source"

    @classmethod
    def from_spark_options(
        cls, options: Mapping[str, str], *, aliases: Mapping[str, str] | None = None
    ) -> Self:
        """Validate Spark's options; ``aliases`` map other names to fields (``path``: the table).

        Raises:
            ConfigError: every problem, naming the option, the value and what is allowed.
        """
        aliases = aliases or {}
        lowered = {key.lower(): value for key, value in options.items()}
        values: dict[str, Any] = {k: v for k, v in lowered.items() if k not in aliases}
        for alias, name in aliases.items():  # the field's own name wins over an alias
            if alias in lowered:
                values.setdefault(name, lowered[alias])
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(
                f"invalid options of {cls.what}: " + "; ".join(problems(exc)),
                errors=exc.errors(include_url=False),
            ) from None
