"""The pyarrow filesystem executors and the driver read and write table files through."""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import ParseResult, urlparse

import pyarrow.fs as pafs

__all__ = ["S3_MAX_ATTEMPTS", "filesystem", "listed_uri", "table_relative"]

#: The development account of Microsoft's Azure Storage emulator (azurite): public, documented.
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
#: Attempts per S3 request of the executors' pyarrow filesystem before an error surfaces.
S3_MAX_ATTEMPTS = 10


def listed_uri(uri: str, path: str) -> str:
    """The URI of ``path``, listed from the filesystem :func:`filesystem` gave for ``uri`` (a
    path of the same store: ``bucket/key``, ``container/blob`` or a local path)."""
    parsed = urlparse(uri)
    if not parsed.scheme:
        return path
    scheme = parsed.scheme.lower()
    container, at, _ = parsed.netloc.partition("@")
    if scheme in ("abfs", "abfss") and at:  # abfss://container@account.dfs.core.windows.net/blob
        inside = path == container or path.startswith(container + "/")
        return f"{parsed.scheme}://{parsed.netloc}{path[len(container) :] if inside else '/' + path}"
    return f"{parsed.scheme}://{path}"


def table_relative(file_uri: str, table_uri: str) -> str | None:
    """``file_uri``'s path below the table's root (as the log names it, unescaped), or ``None``
    for a file outside the table."""
    root = table_uri.rstrip("/") + "/"
    return file_uri[len(root) :] if file_uri.startswith(root) else None


def filesystem(uri: str, storage_options: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem and the root path (within it) of the table at ``uri``.

    ``uri`` must be normalised (see :func:`normalize_uri`).
    """
    parsed = urlparse(uri)
    scheme = parsed.scheme.lower()
    if not scheme:
        return pafs.LocalFileSystem(), uri
    opts = {k.lower(): v for k, v in storage_options.items()}
    if scheme == "s3":
        # The standard AWS variables, as delta-rs reads them (pyarrow alone ignores the endpoint).
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
            if os.environ.get(name) and name.lower() not in opts:
                key = "aws_endpoint_url" if name.startswith("AWS_ENDPOINT_URL") else "aws_region"
                opts.setdefault(key, os.environ[name])
        endpoint = opts.get("aws_endpoint_url") or opts.get("endpoint_url") or opts.get("endpoint")
        kwargs: dict[str, object] = {}
        if opts.get("aws_access_key_id"):
            kwargs["access_key"] = opts["aws_access_key_id"]
            kwargs["secret_key"] = opts.get("aws_secret_access_key", "")
            if opts.get("aws_session_token"):
                kwargs["session_token"] = opts["aws_session_token"]
        if opts.get("aws_region") or opts.get("region"):
            kwargs["region"] = opts.get("aws_region") or opts.get("region")
        if endpoint:
            kwargs["endpoint_override"] = endpoint
            if endpoint.startswith("http://"):
                kwargs["scheme"] = "http"
        if opts.get("aws_virtual_hosted_style_request", "").lower() == "false" or opts.get(
            "aws_force_path_style", ""
        ).lower() in ("true", "1"):
            kwargs["force_virtual_addressing"] = False
        # Throttling (503 SlowDown), 5xx and timeouts: retried with exponential backoff per request.
        kwargs["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS)
        return pafs.S3FileSystem(**kwargs), parsed.netloc + parsed.path
    if scheme in ("az", "abfs", "abfss"):
        return _azure(parsed, opts)
    fs, path = pafs.FileSystem.from_uri(uri)
    return fs, path


def _azure(parsed: ParseResult, opts: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    """pyarrow's Azure filesystem from delta-rs' Azure storage options (or the environment).

    ``az://<container>/<path>`` and ``abfs[s]://<container>@<account>.dfs.core.windows.net/<path>``.
    An ``azure_endpoint`` (``http://127.0.0.1:10000/<account>`` for azurite) or
    ``azure_storage_use_emulator`` points at another service than Azure's.
    """

    def option(*names: str) -> str | None:
        for name in names:
            if opts.get(name):
                return opts[name]
            if os.environ.get(name.upper()):
                return os.environ[name.upper()]
        return None

    container, _, host = parsed.netloc.partition("@")
    account = option("azure_storage_account_name", "account_name", "azure_account_name")
    if host and not account:
        account = host.split(".")[0]
    kwargs: dict[str, object] = {"account_name": account or ""}
    key = option("azure_storage_account_key", "account_key", "azure_storage_key", "access_key")
    if key:
        kwargs["account_key"] = key
    endpoint = option("azure_endpoint", "azure_storage_endpoint", "endpoint")
    if (option("azure_storage_use_emulator", "use_emulator") or "").lower() in ("true", "1"):
        # azurite: its well-known development account unless another is given, as delta-rs does
        endpoint = endpoint or os.environ.get("AZURITE_BLOB_STORAGE_URL") or "http://127.0.0.1:10000"
        kwargs["account_name"] = account or AZURITE_ACCOUNT
        kwargs.setdefault("account_key", AZURITE_KEY)
    if endpoint:
        where = urlparse(endpoint)
        for service in ("blob", "dfs"):
            kwargs[f"{service}_storage_authority"] = where.netloc
            kwargs[f"{service}_storage_scheme"] = where.scheme or "https"
    return pafs.AzureFileSystem(**kwargs), container + parsed.path
