"""On a CUDA GPU: ``bigbatch train`` against a bare training loop on the same input pipeline, and whether the step
waits for its data (issue 14's GPU check).

Both sides train torchvision's ResNet-50 at 224 px, batch 256 (one micro-batch), SGD with momentum, autocast
(``--precision bf16`` or ``fp16``), reading the same folder of real JPEGs (ImageNet-like sizes, written by
``input_pipeline.write_folder``) through bigbatch's ``folder`` dataset with ``--workers`` DataLoader workers,
pinned memory and non-blocking copies:

  bigbatch  ``train()`` with the run's whole machinery (records, the transfer stage, the loss scale, ...);
            images/s from its training records (every 10 steps), after ``--warmup`` steps;
  bare      the loop a user would write: ``for images, labels in loader: forward, backward, step``, no
            per-step host sync; images/s over the same windows of 10 steps after the same warm-up.

Also printed: the pipeline alone (``data bench``'s measurement, no model) at the same workers, and bigbatch's
"input pipeline: waited X% of step time" (input-bound when over 10 %). The goal: bigbatch / bare >= 0.98.

    python benchmarks/gpu_train_step.py [--images 1280] [--warmup 10] [--steps 40] [--workers 16]
                                        [--precision bf16] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from input_pipeline import write_folder  # noqa: E402


def config(data: Path, args: argparse.Namespace, steps: int):
    from bigbatch.config import load_config

    return load_config("digits", [
        "model.name=resnet50", "data.name=folder", f"data.path={data}", "data.size=224",
        "data.preprocessing=standard", "batch=256", "subdivisions=1", f"steps={steps}",
        f"data.workers={args.workers}", f"precision={args.precision}", "schedule.warmup=[]", "log.every=10",
        "log.tensorboard=false", f"eval.every={10 * steps}", f"checkpoint.every={10 * steps}", "eval.batch=64"])


def bigbatch_rates(data: Path, args: argparse.Namespace, out: Path) -> tuple[list[float], dict]:
    from bigbatch.engine.trainer import train

    train(config(data, args, args.warmup + args.steps), out)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in records if "images_per_s" in r and r["step"] > args.warmup]
    waited = next((r for r in records if r.get("event") == "input_pipeline"), {})
    return rates, waited


def bare_rates(data: Path, args: argparse.Namespace) -> list[float]:
    import torchvision
    from torch.utils.data import DataLoader

    from bigbatch.tasks import build_task

    task = build_task(config(data, args, args.warmup + args.steps))
    dataset = task.train_set
    loader = DataLoader(dataset, batch_size=256, shuffle=True, num_workers=args.workers, pin_memory=True,
                        drop_last=True, collate_fn=dataset.collate, persistent_workers=True)
    model = torchvision.models.resnet50(num_classes=task.num_classes).cuda().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=dtype == torch.float16)
    rates, step, start = [], 0, None
    while step < args.warmup + args.steps:
        for images, labels, _ in loader:
            images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=dtype):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step == args.warmup or (step > args.warmup and (step - args.warmup) % 10 == 0):
                torch.cuda.synchronize()
                now = time.perf_counter()
                if start is not None:
                    rates.append(10 * 256 / (now - start))
                start = now
            if step == args.warmup + args.steps:
                break
    return rates


def pipeline_alone(data: Path, args: argparse.Namespace) -> float:
    from bigbatch.data.pipeline.bench import measure
    from bigbatch.tasks import build_task

    cfg = config(data, args, 1)
    return measure(cfg, build_task(cfg), args.workers, 256 * 8).images_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1280)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--precision", choices=("bf16", "fp16"), default="bf16")
    parser.add_argument("--out", type=Path, default=None, help="keep the bigbatch run here (default: a temp folder)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("this benchmark needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    with tempfile.TemporaryDirectory() as tmp:
        data = write_folder(Path(tmp) / "jpegs", args.images)
        out = args.out or Path(tmp) / "run"
        alone = pipeline_alone(data, args)
        bare = bare_rates(data, args)
        ours, waited = bigbatch_rates(data, args, out)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.workers} workers, "
          f"{args.precision}, ResNet-50 224 px batch 256, {args.images} JPEGs")
    print(f"input pipeline alone:      {alone:8.1f} img/s")
    print(f"bare loop (median of {len(bare)}):  {statistics.median(bare):8.1f} img/s  {[round(r) for r in bare]}")
    print(f"bigbatch  (median of {len(ours)}):  {statistics.median(ours):8.1f} img/s  {[round(r) for r in ours]}")
    print(f"bigbatch / bare: {statistics.median(ours) / statistics.median(bare):.3f} (goal >= 0.98)")
    print(f"bigbatch's input pipeline: {waited.get('share', float('nan')):.1%} of step time waiting for data "
          f"({'input-bound' if waited.get('share', 0) > 0.10 else 'not input-bound'})")


if __name__ == "__main__":
    main()
