"""Ascend-only analyses: AI CPU operators, pipeline utilisation, HCCL links and the other
signatures of torch_npu profiler output."""
