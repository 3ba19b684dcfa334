"""hermes for AI assistants: a Model Context Protocol server (``hermes mcp``, docs/agents.md)
over the advisor, the facts, the knowledge base and the what-if replay. ``safety`` confines
every path to the roots the server was started with, ``limits`` runs each tool in a process
with a deadline and pages answers over the size limit, ``work`` holds the tools' bodies (the
library's own calls, every number with its provenance) and ``server`` registers them with the
official ``mcp`` SDK, imported only when the server starts (the ``hermes-kb[mcp]`` extra)."""
