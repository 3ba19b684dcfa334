"""The host side of a step. The cpu analyzer (``cpu``: host vs device busy) runs ``launches``
(launch cost, the host work that issues device work), ``syncs`` (synchronisations, host time
blocked on the device), ``gc_pauses``, ``compilation`` and ``runtime_calls`` (allocation, graph
capture, Ascend's task queue); the dispatch analyzer (``dispatch``: tiny operators, optimizer
steps, zero_grad) runs ``parallel_wrappers`` (DDP buffer broadcast, DataParallel, SyncBatchNorm);
``pyframes``: Python code that costs time for no training work; ``cpu_batch``: small batches on
CPU-only traces."""
