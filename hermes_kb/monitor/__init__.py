"""Always-on, lightweight training monitor (coarse profiling): standard library only.

    from hermes_kb.monitor import Monitor

    with Monitor("runs/exp1", samples_per_step=batch_size) as mon:
        for batch in mon.wrap(loader):      # measures the time blocked on the next batch
            train_step(batch)
            mon.step()                      # one call per step

Writes ``RUN_DIR/rank<R>.jsonl``: one environment record, then one record per step (wall
time, data wait, process CPU time, throughput, MFU, GC collections and pause time, marked events
such as ``with mon.event("checkpoint")``, device step times from CUDA events read lazily, time in
torch.distributed collectives, a fluctuation flag) and, about once a second, process and system
CPU use, run-queue wait, memory, affinity and the busiest other processes. After the warm-up it
detects, it captures by itself a recurring slow step at its next occurrence, the slowest rank of
a communication domain and a sustained throughput drop (``triggers.py``, ``peers.py``), finds
the process groups and times their collectives (``domains.py``), and counts one step's FLOPs for
MFU (``flops.py``); what it decided and why goes to ``RUN_DIR/rank<R>.monitor.jsonl``. Memory
stays bounded however long the run: only fixed windows of step times are kept. ``hermes advise
RUN_DIR`` reads it all back (``reader.py``).

The Monitor (``recorder.py``: the step record) is assembled from parts: the rank log and notes
writer (``rank_log.py``), resource sampling and the optimizer hooks (``sampling.py``), the
automatic captures (``auto_capture.py``, over ``capture.py``), the FLOP counting (``mfu.py``) and
its background thread (``ticker.py``).
"""

from .detect import RollingDetector
from .recorder import Monitor

__all__ = ["Monitor", "RollingDetector"]
