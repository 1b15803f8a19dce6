"""Process-group setup from torchrun's environment; one process per device.

torchrun sets ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``; without them this is a single
process of world size 1. Only rank 0 writes logs, metrics and checkpoints.
"""

from __future__ import annotations

import os
import secrets
import time
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
        store = store_of_this_attempt(world, rank)
        if store is None:
            dist.init_process_group(backend=backend)
        else:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world)
    return Process(rank=rank, world=world, local_rank=local_rank, device=device)


def store_of_this_attempt(world: int, rank: int) -> dist.Store | None:
    """The key-value store for the process group, fresh for each torchrun restart; None: torch's default.

    Under torchrun the workers share the agent's TCP store (``TORCHELASTIC_USE_AGENT_STORE``), and that store
    outlives a restart: the restarted workers would find the dead workers' Gloo/NCCL addresses under the same keys
    and connect to them ("Connection refused"; torch 2.14 keys nothing by attempt, pytorch/pytorch#135712). So each
    attempt's group gets keys of its own, under a name its workers agree on (:func:`agree_on_attempt`).

    ``TORCHELASTIC_RESTART_COUNT`` cannot be that name: each agent keeps its own count, and an agent whose workers
    were healthy restarts them without counting (when another machine's worker failed), so two machines' counts
    differ after a restart. With ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` torchrun gives the workers a new store in
    every round; there torch's default is used.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                                is_master=False, timeout=dist.default_pg_timeout)
    attempt = agree_on_attempt(agent_store, rank, world)
    return dist.PrefixStore(f"bigbatch/attempt/{attempt}", agent_store)


def agree_on_attempt(store: dist.Store, rank: int, world: int, poll_s: float = 0.05) -> str:
    """A name for this attempt of the group, the same on its ``world`` workers and new in every attempt, agreed through
    ``store``, which may hold the keys of any number of earlier attempts (each of whose workers is gone).

    Rank 0 makes the name (random). Every other rank puts a random token of its own under ``bigbatch/hello/<rank>``
    and waits for ``bigbatch/welcome/<its token>``: a key no earlier process can have written, so what it reads there
    is this attempt's name. Rank 0 reads the hello keys over and over, which at first may hold the tokens of an
    earlier attempt's processes, welcomes every token it has not welcomed yet, and is done once ``world - 1``
    processes have said, under the new name, that they have it. A token of a dead process is welcomed for nothing.
    Every rank waits at most the store's timeout (torch's process-group timeout, 30 minutes), as a collective does.
    """
    token = secrets.token_hex(16)
    if world == 1:
        return token
    if rank != 0:
        store.set(f"bigbatch/hello/{rank}", token)
        welcome = f"bigbatch/welcome/{token}"
        store.wait([welcome])
        attempt = store.get(welcome).decode()
        store.add(f"bigbatch/attempt/{attempt}/joined", 1)
        return attempt
    hellos = [f"bigbatch/hello/{r}" for r in range(1, world)]
    store.wait(hellos)  # every rank's hello is there: this attempt's or an earlier one's
    welcomed: set[bytes] = set()
    deadline = time.monotonic() + store.timeout.total_seconds()
    while True:
        for seen in store.multi_get(hellos):
            if seen not in welcomed:
                store.set(f"bigbatch/welcome/{seen.decode()}", token)
                welcomed.add(seen)
        if store.add(f"bigbatch/attempt/{token}/joined", 0) == world - 1:
            return token
        if time.monotonic() > deadline:
            joined = store.add(f"bigbatch/attempt/{token}/joined", 0)
            raise RuntimeError(f"process group: {joined} of the {world - 1} other ranks joined rank 0 within "
                               f"{store.timeout.total_seconds():g} s")
        time.sleep(poll_s)


def group_store() -> dist.Store:
    """The key-value store of the default process group (its rendezvous: this attempt's, :func:`store_of_this_attempt`,
    or torch's), shared by its ranks: for what one rank hands the others after a wait no collective should take
    (``engine/planner.py``: rank 0's ``subdivisions: auto``). torch keeps it with the group; it has no public
    accessor for it (``_get_default_store``, unchanged since torch 1.x)."""
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


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
