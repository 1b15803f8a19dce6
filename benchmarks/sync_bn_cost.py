"""The cost of cross-device BatchNorm: a DDP training step with ``norm.sync=bigbatch`` against ``norm.sync=none``.

Two real processes (Gloo on the CPU, one thread each) train torchvision's ResNet-18 on 64 px inputs, a
micro-batch of 8 images per process, one micro-batch per step (forward, backward with DDP's gradient
all-reduce, SGD step). Both variants start from the same weights and see the same images. Rounds alternate
which variant goes first; each round times ``--steps`` steps of each, and the per-round ratio
(bigbatch / none) is taken; the median is reported, with the spread.

Collectives are counted on one extra step of each variant: every ``torch.distributed.all_reduce`` call (the
BatchNorm layers' own) and every DDP gradient bucket (through a communication hook), with their bytes.

    python benchmarks/sync_bn_cost.py [--rounds 9] [--steps 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import socket
import statistics
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
import torchvision
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from bigbatch.recipe.sync_bn import convert_batchnorm

WORLD = 2
MICRO = 8
SIZE = 64


def _batches(rank: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1000 + rank)
    return [(torch.randn(MICRO, 3, SIZE, SIZE, generator=gen), torch.randint(0, 10, (MICRO,), generator=gen))
            for _ in range(count)]


def _step(model, optimizer, batch) -> None:
    images, labels = batch
    F.cross_entropy(model(images), labels).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _count_one_step(model, optimizer, batch) -> dict[str, int]:
    """Collectives and bytes of one step: the BatchNorm layers' all-reduces and DDP's gradient buckets."""
    counts = {"bn_calls": 0, "bn_bytes": 0, "ddp_buckets": 0, "ddp_bytes": 0}
    original = dist.all_reduce
    in_hook = False

    def counting_all_reduce(tensor, *args, **kwargs):
        if not in_hook:  # DDP's own all-reduce goes through the hook below
            counts["bn_calls"] += 1
            counts["bn_bytes"] += tensor.numel() * tensor.element_size()
        return original(tensor, *args, **kwargs)

    def counting_hook(state, bucket):
        nonlocal in_hook
        counts["ddp_buckets"] += 1
        counts["ddp_bytes"] += bucket.buffer().numel() * bucket.buffer().element_size()
        in_hook = True
        try:
            return allreduce_hook(state, bucket)
        finally:
            in_hook = False

    model.register_comm_hook(None, counting_hook)
    dist.all_reduce = counting_all_reduce
    try:
        _step(model, optimizer, batch)
    finally:
        dist.all_reduce = original
    return counts


def _worker(rank: int, port: int, rounds: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    base = torchvision.models.resnet18(num_classes=10)
    variants = {"none": base, "bigbatch": convert_batchnorm(copy.deepcopy(base))}
    models = {name: DistributedDataParallel(m) for name, m in variants.items()}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for name, m in models.items()}
    batches = _batches(rank, steps)
    for name in models:  # warm-up
        _step(models[name], optimizers[name], batches[0])
    times = {name: [] for name in models}
    for r in range(rounds):
        order = list(models) if r % 2 == 0 else list(reversed(models))
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            for batch in batches:
                _step(models[name], optimizers[name], batch)
            times[name].append((time.perf_counter() - start) / steps)
    counts = {name: _count_one_step(models[name], optimizers[name], batches[0]) for name in models}
    if rank == 0:
        torch.save({"times": times, "counts": counts,
                    "bn_layers": sum(isinstance(m, torch.nn.BatchNorm2d) for m in base.modules()),
                    "parameters": sum(p.numel() for p in base.parameters())}, out)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.start_processes(_worker, args=(_free_port(), args.rounds, args.steps, out), nprocs=WORLD,
                           start_method="spawn")
        result = torch.load(out)
    times, counts = result["times"], result["counts"]
    ratios = [b / n for b, n in zip(times["bigbatch"], times["none"], strict=True)]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"{WORLD} Gloo processes x 1 thread; ResNet-18, {SIZE} px, micro-batch {MICRO} per process")
    print(f"rounds {args.rounds} x {args.steps} steps per variant, alternating\n")
    print("| norm.sync | median step (ms) | BN all-reduces / step | BN bytes / step | DDP buckets / step "
          "| DDP bytes / step |")
    print("|---|---|---|---|---|---|")
    for name in ("none", "bigbatch"):
        c = counts[name]
        print(f"| {name} | {1000 * statistics.median(times[name]):.1f} | {c['bn_calls']} | {c['bn_bytes']:,} "
              f"| {c['ddp_buckets']} | {c['ddp_bytes']:,} |")
    print(f"\nratio bigbatch / none: median {statistics.median(ratios):.3f} "
          f"(rounds: min {min(ratios):.3f}, max {max(ratios):.3f}); {result['bn_layers']} BatchNorm layers, "
          f"{result['parameters']:,} parameters")


if __name__ == "__main__":
    main()
