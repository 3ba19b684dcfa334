"""Renderers: turn typed results into terminal tables, Markdown, HTML or JSON."""
