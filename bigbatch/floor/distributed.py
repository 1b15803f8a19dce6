"""Process-group setup from torchrun's environment; one process per device.

torchrun sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without them this is a single
process of world size 1. Only rank 0 writes logs, metrics and checkpoints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Process:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_size_from_env() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank_from_env() -> int:
    return int(os.environ.get("RANK", "0"))


def setup() -> Process:
    """Join the process group torchrun describes (NCCL on CUDA, Gloo on CPU), if any."""
    world = world_size_from_env()
    rank = rank_from_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        store = store_of_this_attempt(world)
        if store is None:
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)
    return Process(rank=rank, world=world, local_rank=local_rank, device=device)


def store_of_this_attempt(world: int) -> dist.Store | None:
    """The key-value store for the process group, fresh for each torchrun restart; None: torch's default.

    Under torchrun the workers share the agent's TCP store, and that store outlives a restart: the restarted
    workers would find the dead workers' Gloo/NCCL addresses under the same keys and may connect to them
    ("Connection refused"). torch 2.14 keys nothing by attempt (see pytorch/pytorch#135712), so on a single
    node, where ``TORCHELASTIC_RESTART_COUNT`` is the same for every worker, each attempt gets its own key
    prefix. Across nodes the count is per agent and may differ, so there torch's default stays and
    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (docs/distributed.md) gives each restart a new store instead.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or os.environ.get("GROUP_WORLD_SIZE", "1") != "1":
        return None
    agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                is_master=False, timeout=dist.default_pg_timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"bigbatch/attempt_{attempt}", agent_store)


def global_means(means: Mapping[str, torch.Tensor], count: int) -> dict[str, float]:
    """Each value's mean over the items of every process, from this process's ``means`` over its ``count`` items:
    ``sum_p count_p mean_p / sum_p count_p`` (with equal counts, the mean over the processes of their means).

    One packed float64 all-reduce of ``(count, count * mean, ...)`` on the values' device (NCCL reduces device
    tensors; Gloo either) and one host transfer; without a process group, the means themselves. A collective: every
    process calls it at the same points, with the same keys in the same order."""
    if not means:
        return {}
    values = list(means.values())
    device = values[0].device
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return dict(zip(means, torch.stack([v.detach().to(torch.float64) for v in values]).tolist(), strict=True))
    weight = torch.tensor(float(count), dtype=torch.float64, device=device)
    packed = torch.stack([weight, *(v.detach().to(device=device, dtype=torch.float64) * weight for v in values)])
    dist.all_reduce(packed)
    total, *sums = packed.tolist()
    return {name: value / total for name, value in zip(means, sums, strict=True)}


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
