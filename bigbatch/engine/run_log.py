"""What a run writes as it goes: ``metrics.jsonl``, TensorBoard events, and a progress display.

``metrics.jsonl`` holds one JSON object a line. Training records: ``step``, ``images``,
``epoch``, ``lr``, ``loss``, ``images_per_s``. Evaluation records: ``step``, ``split`` and the
metrics (``top1``, ...). On a terminal a progress bar shows step, images/s, loss, lr and ETA;
otherwise a plain line is printed at every training record.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records past ``last_step`` (written by a run that died after its last checkpoint)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    path.write_text("".join(line + "\n" for line in kept))


class RunLog:
    def __init__(self, out_dir: Path, total_steps: int, start_step: int, batch: int, tensorboard: bool = True):
        self.out_dir = out_dir
        self.total_steps = total_steps
        self.batch = batch
        metrics = out_dir / "metrics.jsonl"
        truncate_metrics(metrics, start_step)
        self._metrics = open(metrics, "a", encoding="utf-8")
        self._writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # Events after the checkpoint's step were written by a run that died: hide them on resume.
            purge = start_step + 1 if start_step else None
            self._writer = SummaryWriter(str(out_dir / "tensorboard"), purge_step=purge)
        self._bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)
        self._last_time = time.perf_counter()
        self._last_step = start_step

    def progress(self, step: int) -> None:
        """Advance the progress bar (on a terminal) to ``step`` steps done."""
        if self._bar is not None:
            self._bar.update(step - self._bar.n)

    def _write(self, record: dict[str, Any]) -> None:
        self._metrics.write(json.dumps(record) + "\n")
        self._metrics.flush()

    def train(self, step: int, epoch: float, lr: float, loss: float, **extra: float) -> None:
        """A training record after optimizer step ``step`` (1-based count of steps done)."""
        now = time.perf_counter()
        rate = (step - self._last_step) * self.batch / max(now - self._last_time, 1e-9)
        self._last_time, self._last_step = now, step
        record = {"step": step, "images": step * self.batch, "epoch": round(epoch, 4), "lr": lr, "loss": loss,
                  "images_per_s": round(rate, 1), **extra}
        self._write(record)
        if self._writer is not None:
            for key in ("loss", "lr", "images_per_s", *extra):
                self._writer.add_scalar(f"train/{key}", record[key], step)
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.4g}", img_s=f"{rate:.0f}", refresh=False)
            self._bar.update(step - self._bar.n)
        else:
            print(f"step {step}/{self.total_steps}  epoch {epoch:.2f}  loss {loss:.4f}  lr {lr:.4g}  "
                  f"{rate:.0f} img/s", flush=True)

    def event(self, step: int, name: str, values: dict[str, float]) -> None:
        """A record of something else that happened (``event: name``), e.g. the memory peaks at the end."""
        self._write({"step": step, "event": name, **values})
        shown = "  ".join(f"{k} {v:g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in values.items())
        message = f"{name}: {shown}"
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def skipped(self, step: int, skipped: int, loss_scale: float, layer: str | None) -> None:
        """A step not applied: its gradients were not finite (``step`` steps had been applied)."""
        self._write({"step": step, "event": "skipped", "skipped": skipped, "loss_scale": loss_scale,
                     "nonfinite": layer})
        message = f"step {step + 1}: non-finite gradient (first in {layer}); not applied, loss scale now {loss_scale:g}"
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def evaluation(self, step: int, split: str, metrics: dict[str, float]) -> None:
        self._write({"step": step, "split": split, **metrics})
        if self._writer is not None:
            for key, value in metrics.items():
                self._writer.add_scalar(f"{split}/{key}", value, step)
        shown = "  ".join(f"{k} {v:.4g}" for k, v in metrics.items() if "/" not in k)  # per-class: metrics.jsonl
        message = f"eval step {step}  {split}  {shown}"
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._writer is not None:
            self._writer.close()
        self._metrics.close()
