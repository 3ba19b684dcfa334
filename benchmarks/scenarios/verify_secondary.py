"""Measure a second fix on a scenario's fixed twin, to check a finding hermes reports there.

A fixed twin only removes the injected problem; hermes may still report another one on it (the
accuracy report counts such high findings as false alarms). This script checks one such finding
by applying its fix to the twin (or, with --variant bad, to the bad variant) and timing both, the same way common.py times the variants
(ROUNDS alternating rounds of TIMED_STEPS unprofiled steps, best round mean, after a quiet-machine
wait). It writes recorded/<scenario>/secondary.json, which eval.py reads: the finding stays in
the false-alarm count, and the report shows what fixing it measured.

Checks (``--check``):
  fused_optimizer  C-CPU-027: the twin's torch.optim.Adam/AdamW/SGD built with fused=True
                   (foreach=True where fused is refused), instead of the default per-tensor loop.
  log_off_step     C-CPU-019 (sync_logging): the buffered log lines are not written during the
                   timed steps (only at teardown), what a background writer thread achieves.
  acyclic_parse    C-CPU-011 (gc_pressure): parse_batch builds the same trees without the
                   children's back-reference to their parent, so reference counting frees them
                   and the collector has no cycles to find (the case's "reduce the Python
                   allocation churn" fix; the twin already has the first one, freeze + thresholds).
  augment_off_step C-PROG-001 (augment_in_step): the twin's batches arrive augmented, as DataLoader
                   workers would hand them over, so the step no longer augments at all.
  parse_off_step   C-PROG-001 (gc_pressure): the twin's labels arrive parsed, as DataLoader workers
                   would hand them over, so the step no longer runs parse_batch.
  compile_mlp      C-CPU-026 (ema_per_tensor): the twin's deep narrow MLP runs through torch.compile
                   (Inductor's generated C++ loops instead of hundreds of small operator calls).
  compile_model    C-COMP-003 (GPU conv nets: gpu_cudnn_benchmark, gpu_conv_nchw, gpu_cudnn_multiscale): the
                   scenario's ``resnet()`` wrapped in torch.compile.
  keep_memory      C-MON-012: glibc's mmap and trim thresholds raised (MALLOC_MMAP_THRESHOLD_,
                   MALLOC_TRIM_THRESHOLD_), so freed memory stays for the next step. The
                   environment must be set before the process starts: each round times both
                   settings in a fresh process.

  python benchmarks/scenarios/verify_secondary.py small_batch sync_logging ...
  python benchmarks/scenarios/verify_secondary.py sync_logging --check log_off_step
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import common  # noqa: E402

def _patch_optimizers(mod, torch) -> Callable[[], None]:
    """Make torch.optim.Adam/AdamW/SGD default to fused=True; returns the undo."""
    originals = {}
    for name in ("Adam", "AdamW", "SGD"):
        base = getattr(torch.optim, name)
        originals[name] = base

        def init(self, params, *a, _base=base, **kw):
            kw.pop("foreach", None)
            params = list(params)
            try:
                _base.__init__(self, params, *a, fused=True, **kw)
            except (RuntimeError, ValueError, TypeError):
                _base.__init__(self, params, *a, foreach=True, **kw)

        setattr(torch.optim, name, type(name, (base,), {"__init__": init}))

    def undo() -> None:
        for name, cls in originals.items():
            setattr(torch.optim, name, cls)

    return undo


def _patch_attr(mod, name: str, value) -> Callable[[], None]:
    old = getattr(mod, name)
    setattr(mod, name, value)
    return lambda: setattr(mod, name, old)


def _patch_compile(mod, torch) -> Callable[[], None]:
    """The scenario's model builder wrapped in torch.compile (default mode: Inductor fusion)."""
    orig = mod.resnet
    return _patch_attr(mod, "resnet", lambda *a, **kw: torch.compile(orig(*a, **kw)))


CHECKS: dict[str, tuple[str, str, Callable]] = {
    "fused_optimizer": ("C-CPU-027", "optimizer built with fused=True (foreach=True where fused is refused)",
                        _patch_optimizers),
    "log_off_step": ("C-CPU-019", "log lines not written during the timed steps (written at teardown), as a "
                     "background writer would", lambda mod, torch: _patch_attr(mod, "FLUSH_EVERY", 10**9)),
    "compile_model": ("C-COMP-003", "the conv net wrapped in torch.compile (Inductor fuses the batch-norm, ReLU and "
                      "residual-add chains)", _patch_compile),
    "augment_off_step": ("C-PROG-001", "the batches arrive augmented (as DataLoader workers would give them): no "
                         "augmentation in the training step", lambda mod, torch: _patch_attr(mod, "AUGMENT_IN_STEP", False)),
    "parse_off_step": ("C-PROG-001", "the labels arrive parsed (as DataLoader workers would give them): no "
                       "parse_batch in the training step", lambda mod, torch: _patch_attr(mod, "PARSE_IN_STEP", False)),
    "compile_mlp": ("C-CPU-026", "the MLP's forward and backward through torch.compile (Inductor's C++ loops instead of "
                    "one operator call per small tensor)", lambda mod, torch: _patch_attr(mod, "COMPILE_MODEL", True)),
    "acyclic_parse": ("C-CPU-011", "parse_batch without parent back-references (no reference cycles for the "
                      "collector to find)", lambda mod, torch: _patch_attr(mod, "parse_batch", functools.partial(mod.parse_batch, back_refs=False))),
}  # fmt: skip


KEEP_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 32)}
ENV_CHECKS = {"keep_memory": ("C-MON-012", "glibc keeps freed memory: " + ", ".join(f"{k}={v}" for k, v in KEEP_MEMORY.items()),
                              KEEP_MEMORY)}  # fmt: skip


def _timed_in_process(scenario: str, variant: str, env: dict[str, str]) -> float:
    code = (f"import sys, statistics; sys.path.insert(0, {str(Path(__file__).parent)!r}); import common, {scenario} as m; "
            f"print(statistics.fmean(common._time(m.make_run({variant!r}))))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _timed(mod, variant: str, patch: Callable | None, torch) -> float:
    undo = patch(mod, torch) if patch is not None else None
    try:
        return statistics.fmean(common._time(mod.make_run(variant)))
    finally:
        if undo is not None:
            undo()


def verify(scenario: str, check: str, variant: str = "fixed") -> dict:
    import torch

    mod = importlib.import_module(scenario)
    case, change, patch = CHECKS[check] if check in CHECKS else ENV_CHECKS[check]
    rounds: dict[str, list[float]] = {"as_recorded": [], "second_fix": []}
    loads = []
    for _ in range(common.ROUNDS):
        loads.append(common.wait_for_quiet())
        if check in ENV_CHECKS:
            rounds["as_recorded"].append(_timed_in_process(scenario, variant, {}))
            rounds["second_fix"].append(_timed_in_process(scenario, variant, patch))
        else:
            rounds["as_recorded"].append(_timed(mod, variant, None, torch))
            rounds["second_fix"].append(_timed(mod, variant, patch, torch))
    best = {k: min(v) for k, v in rounds.items()}
    return {
        "variant": variant, "check": check, "case": case, "change": change,
        "step_s_best_round": best, "step_s_round_means": rounds,
        "speedup": best["as_recorded"] / best["second_fix"], "timing_load": loads,
        "torch": torch.__version__,
        "protocol": f"{common.ROUNDS} rounds x the scenario's unprofiled steps (Run.timed_steps, else "
                    f"{common.TIMED_STEPS}) of the variant, as recorded and with the second fix, alternating; best round mean",
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="+")
    ap.add_argument("--check", default="fused_optimizer", choices=sorted([*CHECKS, *ENV_CHECKS]))
    ap.add_argument("--variant", default="fixed", choices=("fixed", "bad"))
    args = ap.parse_args()
    for name in args.scenarios:
        res = verify(name, args.check, args.variant)
        path = common.OUT / name / "secondary.json"
        doc = json.loads(path.read_text()) if path.is_file() else {}
        doc[f"{res['variant']}/{res['case']}"] = res
        path.write_text(json.dumps(doc, indent=2) + "\n")
        print(name, res["case"], f"{res['speedup']:.2f}x", res["step_s_best_round"])


if __name__ == "__main__":
    main()
