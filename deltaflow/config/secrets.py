"""Secrets in configuration: which keys hold one, and the one function that masks them.

Credentials are :class:`pydantic.SecretStr` in the config models; free-form maps (storage
options, Kafka settings) are masked by key name. Everything printed (``validate --show``,
errors, log lines of options) goes through :func:`masked`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import SecretStr

__all__ = ["MASK", "is_secret_key", "masked"]

#: What a secret value is printed as.
MASK = "**********"
#: Keys whose values are never printed: storage credentials, Kafka passwords and key material,
#: tokens, Azure SAS (``sas`` but not Kafka's ``sasl.mechanism``).
_SECRET_KEY = re.compile(
    r"password|secret|token|credential|access_key|account_key|sas(?!l)|jaas|keystore|key\.pem",
    re.IGNORECASE,
)


def is_secret_key(key: str) -> bool:
    """Whether the value of the option ``key`` is a secret."""
    return bool(_SECRET_KEY.search(key))


def masked(value: Any, key: str = "") -> Any:
    """``value`` (a config dump, a mapping of options or one option's value under ``key``) with
    every secret replaced by :data:`MASK`; empty values stay as they are."""
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, Mapping):
        return {k: masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [masked(v, key) for v in value]
    if key and is_secret_key(key) and value not in (None, ""):
        return MASK
    return value
