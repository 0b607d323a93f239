"""``python -m deltaflow.cli``: the ``deltaflow`` command."""

from deltaflow.cli.commands import main

main()
