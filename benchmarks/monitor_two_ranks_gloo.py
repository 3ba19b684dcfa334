"""The 2-rank monitor scenario with real torch.distributed (gloo, CPU) and DDP: the ranks
synchronise every step in the gradient all-reduce, so their step times are equal and the slow
rank has to be found from its own work. Needs torch (torch==2.13.0).

- rank 1 is slow: every step it runs its forward/backward 1.6 times (extra work on the same model);
- rank 0 has a GC storm: a long-lived heap, gc thresholds (100, 2, 2), reference cycles kept for
  three steps, so full collections of tens of ms come back every few steps (and rank 1 waits
  for them at the next all-reduce);
- the Monitor runs with its automatic captures (at most 2 an hour; the slow-rank board every 0.5 s
  for a run of seconds): after the warm-up it detects, recurring slow steps and the slowest rank
  trigger torch.profiler captures, written next to the logs and analysed by ``hermes advise``.

    /tmp/torchvenv/bin/python benchmarks/monitor_two_ranks_gloo.py OUT_DIR [--steps 200]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_rank(rank: int, world: int, out: str, steps: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    from hermes_kb.monitor import Monitor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 512)
    heap, recent = [], deque(maxlen=3)
    if rank == 0:
        heap = [{"i": i, "v": [i]} for i in range(80_000)]
        gc.collect()
        gc.set_threshold(100, 2, 2)

    def batches():
        for i in range(steps):
            time.sleep(0.001)
            yield i

    with Monitor(out, samples_per_step=64, sample_every=20, procs_every_s=1.0, auto_capture=True,
                 captures_per_hour=2, poll_s=0.2, peers_every_s=0.5) as mon:
        for i in mon.wrap(batches()):
            if rank == 1:  # extra local work outside DDP's synchronised backward
                with torch.no_grad():
                    for _ in range(3):
                        model.module(x)
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            if rank == 0:
                cycles = []
                for _ in range(1500):
                    a, b = [], []
                    a.append(b)
                    b.append(a)
                    cycles.append(a)
                recent.append(cycles)
            mon.step()
    dist.destroy_process_group()
    del heap


def main(argv: list[str] | None = None) -> None:
    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--port", type=int, default=29533)
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    mp.spawn(run_rank, args=(2, a.out, a.steps, a.port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
