"""``python -m deltaflow.cli``: the ``deltaflow`` command."""

from deltaflow.cli.main import main

main()
