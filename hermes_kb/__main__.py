"""``python -m hermes_kb``: the ``hermes`` command."""

from .cli import main

main()
