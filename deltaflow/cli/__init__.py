"""The ``deltaflow`` command line."""

from deltaflow.cli.commands import cli, main

__all__ = ["cli", "main"]
