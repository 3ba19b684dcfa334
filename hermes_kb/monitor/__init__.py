"""Always-on, lightweight training monitor (coarse profiling): standard library only.

    from hermes_kb.monitor import Monitor

    with Monitor("runs/exp1", samples_per_step=batch_size) as mon:
        for batch in mon.wrap(loader):      # measures the time blocked on the next batch
            train_step(batch)
            mon.step()                      # one call per step

Writes ``RUN_DIR/rank<R>.jsonl``: one environment record, then one record per step (wall
time, data wait, process CPU time, throughput, MFU when FLOPs are given, GC collections and
pause time, marked events such as ``with mon.event("checkpoint")``, device step times from
CUDA events read lazily, a fluctuation flag) and, every ``sample_every`` steps, process and
system CPU use, run-queue wait, memory, affinity and the busiest other processes. Memory stays
bounded however long the run: only a fixed window of step times is kept. ``hermes advise
RUN_DIR`` reads the logs back.
"""

from .detect import RollingDetector
from .recorder import Monitor

__all__ = ["Monitor", "RollingDetector"]
