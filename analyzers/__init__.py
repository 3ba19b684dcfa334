"""Analyzers: pure functions of a TraceBundle that return typed facts (hermes_kb.analyzers)."""
