"""The ``hermes`` command (typer): one module per command group (``inputs``: inspect and
analyze; ``advise``; ``compare``: diff and annotate; ``kb``; ``monitor``; ``schema``), wired in
``app``; ``common`` and ``checks`` hold what they share. No analysis lives here."""

from .app import app, main

__all__ = ["app", "main"]
