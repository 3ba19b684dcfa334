"""Issue 22's scenario with real torch.distributed (gloo, CPU): two ranks training a small model with
DistributedDataParallel and averaging the loss across ranks every step (``dist.all_reduce``, as
training loops do for logging), under the always-on monitor with its default triggers and the
real torch.profiler. Needs torch (torch==2.13.0). The injected problems, as in
``monitor_triggers.py`` (their steps and sizes are known here):

- a noisy warm-up on both ranks: steps 0-39 take up to 3x the base step more, fading to nothing;
- slow steps on rank 0: every ``PERIOD`` steps from ``FIRST_SLOW`` on, ``SLOW_S`` more;
- a slowed rank: rank 1 spends ``RANK1_EXTRA_S`` more every step after its backward pass, so rank 0
  waits for it in the loss all-reduce: the ranks run in lock-step (equal step times) and only the
  time each spends in collectives, which the monitor times, tells the slow rank apart.

The extra times are sleeps, so that they hold on a loaded 2-core machine. The monitor finds the
process group by itself (``world``, from torch.distributed's registry) and times the all-reduce
calls (DDP's own gradient all-reduce runs in C++ and is not seen on gloo).

    /tmp/hm/tv/bin/python benchmarks/monitor_triggers_gloo.py OUT_DIR [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE_S = 0.008  # sleep per step besides the model's ~1-2 ms
WARMUP_NOISY = 40
FIRST_SLOW = 100
PERIOD = 25
SLOW_S = 0.040
RANK1_EXTRA_S = 0.006


def extra_seconds(rank: int, i: int, rnd: random.Random) -> float:
    """The sleep this script adds to step i of ``rank`` (besides the model's work)."""
    t = BASE_S
    if i < WARMUP_NOISY:
        t += BASE_S * rnd.uniform(0.0, 3.0) * (1.0 - i / WARMUP_NOISY)
    if rank == 0 and i >= FIRST_SLOW and (i - FIRST_SLOW) % PERIOD == 0:
        t += SLOW_S
    if rank == 1:
        t += RANK1_EXTRA_S
    return t


def run_rank(rank: int, world: int, out: str, steps: int, port: int, peers_every_s: float) -> None:
    import torch
    import torch.distributed as dist

    from hermes_kb.monitor import Monitor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256)))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 256)
    rnd = random.Random(1000 + rank)
    with Monitor(out, samples_per_step=32, poll_s=0.05, peers_every_s=peers_every_s) as mon:
        for i in range(steps):
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            time.sleep(extra_seconds(rank, i, rnd))
            logged = loss.detach().clone()
            dist.all_reduce(logged)  # the loss averaged over ranks, for the log
            mon.step()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    import torch.multiprocessing as mp

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--port", type=int, default=29547)
    ap.add_argument("--peers-every", type=float, default=0.25, help="seconds between slow-rank verdicts")
    a = ap.parse_args(argv)
    Path(a.out).mkdir(parents=True, exist_ok=True)
    mp.spawn(run_rank, args=(2, a.out, a.steps, a.port, a.peers_every), nprocs=2, join=True)


if __name__ == "__main__":
    main()
