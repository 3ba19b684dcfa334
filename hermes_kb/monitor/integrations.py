"""The Monitor driven by framework callbacks: PyTorch Lightning and the Hugging Face Trainer.

    trainer = lightning.Trainer(callbacks=[lightning_callback("runs/exp1")])
    trainer = transformers.Trainer(..., callbacks=[hf_callback("runs/exp1")])

Neither framework is imported until one of these functions is called (they are optional
extras: ``pip install 'hermes-kb[lightning]'`` / ``'hermes-kb[hf]'``). Both adapt the same
``StepDriver``: the step boundary is the end of a training batch; the time from one batch's end
to the next batch's start is data wait (the framework fetches the batch there), minus any marked
evaluation or checkpoint inside that gap, which is recorded as an event instead.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .recorder import Monitor


class StepDriver:
    """Framework-neutral: call ``begin()`` when a batch starts, ``end()`` when it ends, and
    ``event_start(name)`` / ``event_end(name)`` around evaluation or checkpointing."""

    def __init__(self, run_dir: str | os.PathLike, **monitor_kw: Any):
        self.monitor = Monitor(run_dir, **monitor_kw)
        self._ended: float | None = None
        self._gap_events = 0.0
        self._open: dict[str, float] = {}
        self.started = False

    def start(self) -> None:
        if not self.started:
            self.monitor.start()
            self.started = True
            self._ended = time.perf_counter()

    def begin(self) -> None:
        if not self.started:
            self.start()
        now = time.perf_counter()
        for name in list(self._open):  # an event whose end the framework never reported
            self.event_end(name, now)
        if self._ended is not None:
            self.monitor.add_data_wait(max(now - self._ended - self._gap_events, 0.0))
        self._ended = None
        self._gap_events = 0.0

    def end(self, samples: int | None = None) -> None:
        if not self.started:
            return
        self.monitor.step(samples)
        self._ended = time.perf_counter()
        self._gap_events = 0.0

    def event_start(self, name: str, now: float | None = None) -> None:
        self._open[name] = time.perf_counter() if now is None else now

    def event_end(self, name: str, now: float | None = None) -> None:
        t0 = self._open.pop(name, None)
        if t0 is None:
            return
        dt = (time.perf_counter() if now is None else now) - t0
        self.monitor.mark(name, dt)
        if self._ended is not None and t0 >= self._ended:
            self._gap_events += dt  # not data wait: the gap held this event

    def close(self) -> None:
        if self.started:
            self.monitor.close()
            self.started = False


def _batch_size(batch: Any) -> int | None:
    try:
        if isinstance(batch, dict):
            batch = next(iter(batch.values()))
        elif isinstance(batch, (list, tuple)):
            batch = batch[0]
        return int(batch.shape[0])
    except Exception:
        return None


def lightning_callback(run_dir: str | os.PathLike, **monitor_kw: Any) -> Any:
    """A lightning Callback (lightning.pytorch, or the older pytorch_lightning package)."""
    try:
        from lightning.pytorch.callbacks import Callback
    except ImportError:
        from pytorch_lightning.callbacks import Callback  # raises ImportError when neither is installed

    class HermesMonitorCallback(Callback):
        def __init__(self) -> None:
            self.driver = StepDriver(run_dir, **monitor_kw)

        def on_train_start(self, trainer, pl_module) -> None:
            self.driver.start()  # on every rank: each writes its own rank<R>.jsonl

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.driver.begin()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.driver.end(_batch_size(batch))

        def on_validation_start(self, trainer, pl_module) -> None:
            self.driver.event_start("evaluate")

        def on_validation_end(self, trainer, pl_module) -> None:
            self.driver.event_end("evaluate")

        def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
            # called while the checkpoint dict is built, before it is written: the save ends at
            # the next batch start (begin() closes open events)
            self.driver.event_start("checkpoint")

        def on_train_end(self, trainer, pl_module) -> None:
            self.driver.close()

        def on_exception(self, trainer, pl_module, exception) -> None:
            self.driver.close()

    return HermesMonitorCallback()


def hf_callback(run_dir: str | os.PathLike, **monitor_kw: Any) -> Any:
    """A transformers.TrainerCallback."""
    from transformers import TrainerCallback

    class HermesMonitorCallback(TrainerCallback):
        def __init__(self) -> None:
            self.driver = StepDriver(run_dir, **monitor_kw)
            self._samples: int | None = None

        def on_train_begin(self, args, state, control, **kw):
            self._samples = args.per_device_train_batch_size * max(1, args.gradient_accumulation_steps)
            self.driver.start()

        def on_step_begin(self, args, state, control, **kw):
            self.driver.begin()

        def on_step_end(self, args, state, control, **kw):
            self.driver.end(self._samples)
            # the Trainer evaluates and saves after on_step_end, before the next step: time
            # them from here (on_evaluate / on_save come when each is done)
            self._gap_start = time.perf_counter()

        def on_evaluate(self, args, state, control, **kw):
            self.driver.event_start("evaluate", getattr(self, "_gap_start", None))
            self.driver.event_end("evaluate")
            self._gap_start = time.perf_counter()

        def on_save(self, args, state, control, **kw):
            self.driver.event_start("checkpoint", getattr(self, "_gap_start", None))
            self.driver.event_end("checkpoint")
            self._gap_start = time.perf_counter()

        def on_train_end(self, args, state, control, **kw):
            self.driver.close()

    return HermesMonitorCallback()


__all__ = ["StepDriver", "hf_callback", "lightning_callback"]
