"""Process-group setup from torchrun's environment; one process per device.

torchrun sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without them this is a single
process of world size 1. Only rank 0 writes logs, metrics and checkpoints.
"""

from __future__ import annotations

import os
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
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return Process(rank=rank, world=world, local_rank=local_rank, device=device)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
