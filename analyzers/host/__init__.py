"""The host side of a step: launch and synchronisation costs, GC and compilation (``cpu``),
per-call dispatch costs (``dispatch``), Python code that costs time for no training work
(``pyframes``) and small batches on CPU-only traces (``cpu_batch``)."""
