"""DDP with accumulation, in two real Gloo processes: one gradient synchronisation per optimizer step, and
evaluation sharded across ranks with every validation image counted once.

The trainer's own ``attempt_step`` runs under a ``DistributedDataParallel`` whose communication hook counts
the all-reduces it is asked for (one per gradient bucket per synchronisation; the bucket is made large enough
to hold every gradient, so one synchronisation = one call).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from bigbatch.data.pipeline.loader import TensorImages
from bigbatch.engine.step import attempt_step
from bigbatch.tasks.classification import ClassificationTask
from tests.helpers import join_gloo, run_spawned

WORLD = 2
SUBDIVISIONS = 4
MICRO = 3  # images per micro-batch per process
STEPS = 3
VAL_IMAGES = 37  # not a multiple of the world or the eval batch


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))


def _global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    n = WORLD * SUBDIVISIONS * MICRO
    return torch.randn(n, 3, 6, 6, generator=gen), torch.randint(0, 5, (n,), generator=gen)


def _micro_batches(step: int, rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The rule of ``GlobalBatchOrder``: chunk ``j * world + rank`` is micro-batch j of ``rank``."""
    images, labels = _global_batch(step)
    chunks = list(zip(images.chunk(world * SUBDIVISIONS), labels.chunk(world * SUBDIVISIONS), strict=True))
    return [chunks[j * world + rank] for j in range(SUBDIVISIONS)]


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def _val_set() -> TensorImages:
    gen = torch.Generator().manual_seed(99)
    return TensorImages(torch.randn(VAL_IMAGES, 3, 6, 6, generator=gen), torch.randint(0, 5, (VAL_IMAGES,),
                                                                                       generator=gen))


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    join_gloo(rank, WORLD, port)
    try:
        model = DistributedDataParallel(_model(), bucket_cap_mb=64)
        calls = {"n": 0}

        def counting_hook(state, bucket):
            calls["n"] += 1
            return allreduce_hook(state, bucket)

        model.register_comm_hook(None, counting_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        syncs_per_step = []
        for step in range(STEPS):
            before = calls["n"]
            attempt_step(model, optimizer, _micro_batches(step, rank, WORLD), _loss)
            syncs_per_step.append(calls["n"] - before)

        # The same accumulation without no_sync, to show that the hook sees every backward it is asked for.
        before = calls["n"]
        for batch in _micro_batches(0, rank, WORLD):
            _loss(model, batch).backward()
        syncs_without_no_sync = calls["n"] - before

        task = ClassificationTask(_val_set(), _val_set(), num_classes=5)
        sharded = task.evaluate(model.module, batch_size=4, rank=rank, world=WORLD)
        torch.save({"syncs_per_step": syncs_per_step, "syncs_without_no_sync": syncs_without_no_sync,
                    "weights": {k: v.clone() for k, v in model.module.state_dict().items()},
                    "evaluation": sharded}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_spawned(_worker, WORLD, tmp_path_factory.mktemp("gradient_sync"))


def test_one_gradient_synchronisation_per_optimizer_step(results):
    for rank, result in enumerate(results):
        assert result["syncs_per_step"] == [1] * STEPS, f"rank {rank}: {SUBDIVISIONS} micro-batches per step"
        assert result["syncs_without_no_sync"] == SUBDIVISIONS, "the hook counts every synchronising backward"


def test_accumulated_ddp_steps_equal_one_process_on_the_whole_batch(results):
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(STEPS):
        images, labels = _global_batch(step)
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    for rank, result in enumerate(results):
        for key, value in model.state_dict().items():
            torch.testing.assert_close(result["weights"][key], value, rtol=0, atol=1e-5, msg=f"rank {rank}: {key}")


def test_sharded_evaluation_counts_every_image_once(results):
    model = _model()
    task = ClassificationTask(_val_set(), _val_set(), num_classes=5)
    weights = results[0]["weights"]
    model.load_state_dict(weights)
    whole = task.evaluate(model, batch_size=4)
    for result in results:
        sharded = result["evaluation"]
        assert sharded["images"] == VAL_IMAGES
        for key in ("top1", "top5", "loss"):
            assert sharded[key] == pytest.approx(whole[key], rel=1e-6, abs=1e-9), key
