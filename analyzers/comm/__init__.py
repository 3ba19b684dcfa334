"""Communication and parallelism: collectives per group and their sync waits (``comm``),
gradient-bucket fusion (``buckets``), imbalance and pipeline bubbles across ranks (``parallel``),
and what the cross-rank analyzers read of a rank (``digest``)."""
