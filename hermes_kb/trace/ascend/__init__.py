"""The Ascend torch_npu profiler reader: ``files`` (a *_ascend_pt directory and what it holds),
``timeline`` and ``tables`` (the text export), ``db`` (the sqlite export, over ``db_file``,
``db_host``, ``db_device``, ``db_tables`` and ``analysis_db``), ``reader`` (one rank of the text
export) and ``build`` (either export's tables to a RankTrace, with ``collectives``: the HCCL ops,
and ``links``: host to device)."""
