"""Table URIs as templates over topic names: ``s3://lake/bronze/{topic}``, ``/lake/{1}/{2}``.

``deltaflow ingest --topic_pattern REGEX TEMPLATE`` (and a YAML Kafka source with several
topics) writes each topic into the table its name renders: ``{topic}`` is the topic's name,
``{1}`` ... ``{9}`` are the groups of the pattern's match. Kafka topic names hold only ASCII
letters, digits, ``.``, ``_`` and ``-``, all safe in a path; anything else (a group cannot hold
more than its topic) is replaced by ``_``. Several topics may render the same table (a table then
holds each topic's progress).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deltaflow.config.locations import normalize_uri
from deltaflow.errors import ConfigError

__all__ = ["TableTemplate", "has_placeholders", "static_prefix"]

#: ``{topic}`` or ``{1}`` ... ``{9}``; any other ``{...}`` is refused.
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
_GROUP = re.compile(r"[1-9]")
#: Characters kept as they are in a rendered name (Kafka's legal topic characters).
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class TableTemplate:
    """A table URI with placeholders, checked against how topics are chosen.

    Attributes:
        text: The template as given.
        pattern: The topics' regular expression (``--topic_pattern``), when they are chosen by one.
    """

    text: str
    pattern: str | None = None

    @classmethod
    def of(cls, text: str, *, pattern: str | None, several: bool, what: str = "TABLE_URI") -> TableTemplate:
        """Check ``text`` and return it as a template.

        Args:
            pattern: The topic pattern, if topics are chosen by one (its groups may be used).
            several: Whether several topics may be read (a pattern, or a list of topics): then
                the template must name the topic, or every topic would land in one table.
            what: The option's name in error messages.

        Raises:
            ConfigError: an unknown placeholder, a group the pattern lacks, or several topics
                into a template without a placeholder.
        """
        names = _PLACEHOLDER.findall(text)
        unknown = [n for n in names if n != "topic" and not _GROUP.fullmatch(n)]
        if unknown or "{" in _PLACEHOLDER.sub("", text) or "}" in _PLACEHOLDER.sub("", text):
            raise ConfigError(
                f"{what} {text!r}: unknown placeholder {'{' + unknown[0] + '}' if unknown else 'brace'}; "
                "a table template takes {topic} (the topic's name) and {1} ... {9} (the groups of "
                "--topic_pattern)",
                template=text,
            )
        groups = sorted({int(n) for n in names if n != "topic"})
        if groups:
            if pattern is None:
                raise ConfigError(
                    f"{what} {text!r} uses {{{groups[-1]}}}, a group of --topic_pattern, but the "
                    "topics are listed, not matched: use {topic}",
                    template=text,
                )
            have = re.compile(pattern).groups
            if groups[-1] > have:
                raise ConfigError(
                    f"{what} {text!r} uses {{{groups[-1]}}}, but --topic_pattern {pattern!r} has "
                    f"{have} group(s)",
                    template=text,
                )
        if several and not names:
            raise ConfigError(
                f"{what} {text!r} names one table for several topics: put {{topic}} (or a group of "
                "--topic_pattern, {1} ...) in it to give each topic its own table, e.g. "
                f"{text.rstrip('/')}/{{topic}}",
                template=text,
            )
        return cls(text, pattern)

    @property
    def has_placeholders(self) -> bool:
        return bool(_PLACEHOLDER.search(self.text))

    def render(self, topic: str) -> str | None:
        """The normalised table URI of ``topic``; ``None`` when the pattern does not match it
        or a group it uses matched nothing."""
        groups: tuple[str | None, ...] = ()
        if self.pattern is not None:
            match = re.fullmatch(self.pattern, topic)
            if match is None:
                return None
            groups = match.groups()
        values = {"topic": topic, **{str(i): g for i, g in enumerate(groups, start=1)}}
        out = []
        last = 0
        for m in _PLACEHOLDER.finditer(self.text):
            value = values.get(m.group(1))
            if not value:
                return None
            out += [self.text[last : m.start()], _UNSAFE.sub("_", value)]
            last = m.end()
        out.append(self.text[last:])
        return normalize_uri("".join(out))


def has_placeholders(text: str) -> bool:
    """Whether ``text`` names a table per topic (``{topic}`` or ``{1}`` ... ``{9}``)."""
    return any(n == "topic" or _GROUP.fullmatch(n) for n in _PLACEHOLDER.findall(text))


def static_prefix(text: str) -> str:
    """The folder of ``text`` before its first placeholder (``/lake/bronze/{topic}`` ->
    ``/lake/bronze``): where a template's shared state (the Spark checkpoint) lives."""
    head = text.split("{", 1)[0]
    if "{" in text:
        head = head.rsplit("/", 1)[0] if "/" in head else head
    return normalize_uri(head or ".")
