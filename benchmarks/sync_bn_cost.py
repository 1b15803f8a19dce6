"""The cost of cross-device BatchNorm: a DDP training step with ``norm.sync=bigbatch`` against ``norm.sync=none``.

Two real processes (Gloo on the CPU, one thread each) train torchvision's ResNet-18 on 64 px inputs, a
micro-batch of 8 images per process, one micro-batch per step (forward, backward with DDP's gradient
all-reduce, SGD step). Three variants start from the same weights and see the same images: plain BatchNorm
(``none``); ``bigbatch``, whose BatchNorm sums go through the shared-memory all-reduce of one machine (what
``norm.sync=bigbatch`` does here); and ``bigbatch-gloo``, the same layers with their sums sent through Gloo's
all-reduce instead (what it does across machines). Rounds rotate which variant goes first; each round times
``--steps`` steps of each, and the per-round ratio to ``none`` is taken; the median is reported, with the
spread.

Collectives are counted on one extra step of each variant: every BatchNorm sum (``torch.distributed
.all_reduce`` calls and shared-memory sums) and every DDP gradient bucket (through a communication hook),
with their bytes.

    python benchmarks/sync_bn_cost.py [--rounds 21] [--steps 5]
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

from bigbatch.floor import host_all_reduce
from bigbatch.floor.host_all_reduce import HostAllReduce
from bigbatch.largebatch.sync_bn import convert_batchnorm

WORLD = 2
MICRO = 8
SIZE = 64
VARIANTS = ("none", "bigbatch", "bigbatch-gloo")


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
    """Collectives and bytes of one step: the BatchNorm layers' sums and DDP's gradient buckets."""
    counts = {"bn_calls": 0, "bn_bytes": 0, "ddp_buckets": 0, "ddp_bytes": 0}
    original, original_sum = dist.all_reduce, HostAllReduce.sum_
    in_hook = False

    def counting_sum(channel, tensor):
        counts["bn_calls"] += 1
        counts["bn_bytes"] += tensor.numel() * tensor.element_size()
        return original_sum(channel, tensor)

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
    dist.all_reduce, HostAllReduce.sum_ = counting_all_reduce, counting_sum
    try:
        _step(model, optimizer, batch)
    finally:
        dist.all_reduce, HostAllReduce.sum_ = original, original_sum
    return counts


def _worker(rank: int, port: int, rounds: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    base = torchvision.models.resnet18(num_classes=10)
    gloo_only = dist.new_group(backend="gloo")
    host_all_reduce.use_torch_distributed(gloo_only)
    variants = {"none": base, "bigbatch": convert_batchnorm(copy.deepcopy(base)),
                "bigbatch-gloo": convert_batchnorm(copy.deepcopy(base), gloo_only)}
    models = {name: DistributedDataParallel(m) for name, m in variants.items()}
    optimizers = {name: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for name, m in models.items()}
    batches = _batches(rank, steps)
    for name in models:  # warm-up
        _step(models[name], optimizers[name], batches[0])
    times = {name: [] for name in models}
    for r in range(rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            for batch in batches:
                _step(models[name], optimizers[name], batch)
            times[name].append((time.perf_counter() - start) / steps)
    counts = {name: _count_one_step(models[name], optimizers[name], batches[0]) for name in models}
    if rank == 0:
        torch.save({"times": times, "counts": counts, "shared_memory": host_all_reduce.channel_for() is not None,
                    "bn_layers": sum(isinstance(m, torch.nn.BatchNorm2d) for m in base.modules()),
                    "parameters": sum(p.numel() for p in base.parameters())}, out)
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.pt")
        mp.start_processes(_worker, args=(_free_port(), args.rounds, args.steps, out), nprocs=WORLD,
                           start_method="spawn")
        result = torch.load(out)
    times, counts = result["times"], result["counts"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}; "
          f"{WORLD} Gloo processes x 1 thread; ResNet-18, {SIZE} px, micro-batch {MICRO} per process")
    print(f"rounds {args.rounds} x {args.steps} steps per variant, rotating which goes first; bigbatch's sums "
          f"through {'shared memory' if result['shared_memory'] else 'Gloo (no shared memory here)'}\n")
    print("| variant | median step (ms) | ratio to none: median (min-max) | BN sums / step | BN bytes / step "
          "| DDP buckets / step | DDP bytes / step |")
    print("|---|---|---|---|---|---|---|")
    for name in VARIANTS:
        c = counts[name]
        ratios = [t / n for t, n in zip(times[name], times["none"], strict=True)]
        print(f"| {name} | {1000 * statistics.median(times[name]):.1f} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) | {c['bn_calls']} | {c['bn_bytes']:,} | {c['ddp_buckets']} "
              f"| {c['ddp_bytes']:,} |")
    print(f"\n{result['bn_layers']} BatchNorm layers, {result['parameters']:,} parameters")


if __name__ == "__main__":
    main()
