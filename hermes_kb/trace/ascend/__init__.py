"""The Ascend torch_npu profiler reader: ``files`` (a *_ascend_pt directory and what it holds),
``timeline`` and ``tables`` (the text export), ``db`` (the sqlite export) and ``reader`` (one
rank to a RankTrace)."""
