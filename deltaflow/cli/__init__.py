"""The ``deltaflow`` command line (see :mod:`deltaflow.cli.main`)."""

from deltaflow.cli.main import cli, main

__all__ = ["cli", "main"]
