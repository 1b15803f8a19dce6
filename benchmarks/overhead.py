"""bigbatch's training step against a minimal hand-written PyTorch loop, side by side.

Both sides train the same model (the digits recipe's small CNN) from the same weights on the
same micro-batches of the same in-memory data: batch 256 cut into 8 micro-batches of 32. Rounds
alternate which side goes first; each round times ``--steps`` optimizer steps of each side, and
the ratio bigbatch / hand-written is taken per round. The median ratio is reported.

Two comparisons:
  step         bigbatch's per-step work in the loop (the LR from the schedule, place the batch,
               the training step as ``bigbatch train`` builds it: ``engine/parts.py``'s ``TrainStep``
               with its clipping, BatchNorm snapshot for the retries, and loss scaler)
               against the plain accumulation loop, on pre-built micro-batches;
  step + data  the same, each side also producing its micro-batches: bigbatch through its
               loader (``batches_by_step``), the hand loop by indexing the tensors directly.

    python benchmarks/overhead.py [--rounds 15] [--steps 10]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import platform
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from bigbatch.batching import make_plan
from bigbatch.config import load_config
from bigbatch.data.pipeline.loader import batches_by_step
from bigbatch.data.pipeline.order import GlobalBatchOrder
from bigbatch.engine.events import EventStorage
from bigbatch.engine.parts import build_parts
from bigbatch.engine.transfer import to_device
from bigbatch.floor.distributed import Process
from bigbatch.largebatch.optim import build_optimizer, set_lr
from bigbatch.tasks import build_task


def hand_written_step(model, optimizer, micro_batches) -> torch.Tensor:
    """What one would write by hand: accumulate loss / S over the micro-batches, then step."""
    total = 0.0
    for images, labels in micro_batches:
        loss = F.cross_entropy(model(images), labels) / len(micro_batches)
        loss.backward()
        total += loss.detach()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps per side per round")
    args = parser.parse_args()

    cfg = load_config("digits")
    task = build_task(cfg)
    torch.manual_seed(0)
    model = task.build_model(cfg)
    subdivisions = cfg.subdivisions
    device = torch.device("cpu")
    order = GlobalBatchOrder(len(task.train_set), cfg.batch, cfg.seed)
    def pick(step: int) -> list:
        """The hand loop's data: index the in-memory tensors with the same order."""
        data = task.train_set
        return [(data.images[m], data.labels[m]) for m in order.micro_batches(step, 0, 1, subdivisions)]

    batches = [pick(step) for step in range(args.steps)]
    hand_model = copy.deepcopy(model)
    hand_opt = build_optimizer(cfg.optim, hand_model)

    plan = make_plan(cfg, 1, len(task.train_set))
    task.build_model = lambda cfg: copy.deepcopy(model)  # the same initial weights on both sides
    parts = build_parts(cfg, task, plan, Process(device=device), EventStorage())
    ours_step, lr_at = parts.step, parts.lr_at

    def ours(micro_batches: list) -> None:
        # What the loop does per step with the digits recipe: the LR from the schedule, the training step.
        set_lr(ours_step.optimizer, lr_at(10))
        ours_step(10, to_device(micro_batches, device))

    def hand(micro_batches: list) -> None:
        for group in hand_opt.param_groups:
            group["lr"] = 0.1
        hand_written_step(hand_model, hand_opt, micro_batches)

    # Endless streams for "step + data": bigbatch's loader, and direct indexing.
    ours_stream = batches_by_step(task.train_set, order, 0, 10**9, 0, 1, subdivisions)
    hand_stream = (pick(step) for step in itertools.count())

    comparisons: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "step": (lambda: [ours(b) for b in batches], lambda: [hand(b) for b in batches]),
        "step + data": (
            lambda: [ours(next(ours_stream)) for _ in range(args.steps)],
            lambda: [hand(next(hand_stream)) for _ in range(args.steps)],
        ),
    }
    for ours_fn, hand_fn in comparisons.values():  # warm up allocator and kernels on both sides
        ours_fn()
        hand_fn()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads, "
          f"torch {torch.__version__}, python {platform.python_version()}")
    print(f"model: small_cnn (digits recipe), batch {cfg.batch}, subdivisions {subdivisions}, "
          f"micro-batch {cfg.batch // subdivisions}; {args.rounds} rounds x {args.steps} steps per side")
    print(f"{'comparison':12s} {'bigbatch s/step':>16s} {'hand s/step':>12s} {'median ratio':>13s} "
          f"{'min':>6s} {'max':>6s}")
    for name, (ours_fn, hand_fn) in comparisons.items():
        ratios, ours_times, hand_times = [], [], []
        for r in range(args.rounds):
            order_of_sides = [("ours", ours_fn), ("hand", hand_fn)]
            if r % 2:
                order_of_sides.reverse()
            seconds = {}
            for side, fn in order_of_sides:
                start = time.perf_counter()
                fn()
                seconds[side] = (time.perf_counter() - start) / args.steps
            ours_times.append(seconds["ours"])
            hand_times.append(seconds["hand"])
            ratios.append(seconds["ours"] / seconds["hand"])
        print(f"{name:12s} {statistics.median(ours_times):16.4f} {statistics.median(hand_times):12.4f} "
              f"{statistics.median(ratios):13.3f} {min(ratios):6.3f} {max(ratios):6.3f}")


if __name__ == "__main__":
    main()
