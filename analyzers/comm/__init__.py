"""Communication and parallelism: collectives per group and their sync waits (``comm``: the
analyzer, over ``collectives`` (a rank's collectives), ``groups`` and ``bandwidth`` (per-group
facts, links), ``pipeline`` (pipeline stages), ``sync`` (sync waits) and ``stalls`` (transfer
stalls)), gradient-bucket fusion (``buckets``, over ``gradients``: what it reads of the trace),
imbalance and pipeline bubbles across ranks (``parallel``), and what the cross-rank analyzers
read of a rank (``digest``)."""
