"""Ascend-only analyses: AI CPU operators, pipeline utilisation, HCCL links and the other
signatures of torch_npu profiler output (``npu``: the analyzer, over ``aicore``, ``operators``,
``runtime``, ``transfers``, ``hccl_links`` and ``affinity``; ``tasks``: what they share)."""
