"""``python -m hermes_kb.cli``: the ``hermes`` command."""

from .app import main

main()
