"""Table locations: the URI forms deltaflow accepts and their one canonical form."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlparse

__all__ = ["SUPPORTED_SCHEMES", "absolute_local", "join", "normalize_uri"]

#: URI schemes of table locations; a local path needs none.
SUPPORTED_SCHEMES = ("file", "s3", "s3a", "gs", "az", "abfs", "abfss")


def normalize_uri(uri: str) -> str:
    """Return the canonical form of a table URI.

    Local paths and ``file://`` URIs become absolute paths without a scheme (the form every
    Delta reader accepts); ``s3a://`` becomes ``s3://``; a trailing slash is dropped.
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if scheme == "file":
        return os.path.abspath(unquote(parsed.path))
    if scheme in ("",) or len(scheme) == 1:
        return os.path.abspath(os.path.expanduser(uri))
    if scheme == "s3a":
        uri = "s3://" + uri[len("s3a://") :]
    return uri.rstrip("/")


def absolute_local(location: str) -> str:
    """``location`` with a relative local path made absolute (against this process's working
    directory, ``~`` expanded as :func:`normalize_uri` does); URIs with a scheme and absolute
    paths unchanged.

    Resolved where the configuration is read: over Spark Connect the server's JVM and Python
    workers open the paths too, and resolve a relative one against *their* working directory
    (the folder the server was started from): another table, or no files at all.
    """
    scheme = urlparse(location).scheme
    if (scheme and len(scheme) > 1) or os.path.isabs(location):
        return location
    return os.path.abspath(os.path.expanduser(location))


def join(base: str, *parts: str) -> str:
    """Join path parts with ``/`` (object stores and POSIX paths alike)."""
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
