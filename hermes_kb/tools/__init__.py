"""Tools on top of the advisor: ``diff`` (two runs compared, predictions checked), ``annotate``
(a trace written back with the critical path and the evidence as tracks), ``coverage`` (where
each case of the knowledge base fires on the real traces and recorded scenarios)."""
