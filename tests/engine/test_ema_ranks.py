"""The weight EMA under DDP is evaluated as rank 0's on every rank (``engine/run.py``'s ``Run.evaluate``,
``largebatch/ema.py``'s ``share_buffers``): without ``norm.sync`` each rank's BatchNorm running statistics are its own,
and each rank's EMA averages them, so the sharded evaluation would score W different models while only rank 0's is
saved (timm's ``train.py`` broadcasts the EMA's BN statistics from rank 0 before it evaluates, ``distribute_bn``).

In two real Gloo processes: after ``Run.evaluate`` the EMA on both ranks is equal, bit for bit, and its metrics are
those of rank 0's EMA (what the checkpoint holds: the closed form over rank 0's weights, computed apart) evaluated in
one process; under torchrun (slow), the EMA's loss logged in the run equals ``bigbatch eval``'s of the checkpoint."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from bigbatch.config import load_config
from bigbatch.data.pipeline.loader import TensorImages
from bigbatch.engine.run import Run
from bigbatch.floor.distributed import Process
from bigbatch.largebatch.ema import WeightEMA
from bigbatch.tasks.classification import ClassificationTask
from tests.helpers import COMMON, join_gloo, run_main, run_spawned, torchrun

WORLD = 2
STEPS = 4
DECAY = 0.5
VAL_IMAGES = 37  # not a multiple of the world or the eval batch


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=0.5), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 4 * 4, 5))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s images of step ``step``: of another scale on each rank, so the ranks' BN statistics differ."""
    gen = torch.Generator().manual_seed(100 * step + rank)
    return (1 + rank) * torch.randn(8, 3, 6, 6, generator=gen) + rank, torch.randint(0, 5, (8,), generator=gen)


def _task() -> ClassificationTask:
    gen = torch.Generator().manual_seed(99)
    val = TensorImages(2 * torch.randn(VAL_IMAGES, 3, 6, 6, generator=gen), torch.randint(0, 5, (VAL_IMAGES,),
                                                                                          generator=gen))
    return ClassificationTask(val, val, num_classes=5)


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    join_gloo(rank, WORLD, port)
    try:
        bare = _model()
        ema = WeightEMA(bare, DECAY)
        model = DistributedDataParallel(bare)  # rank 0's buffers broadcast at each forward, then each rank's own
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        own = {k: v.double().clone() for k, v in bare.state_dict().items()}  # this rank's own average
        for step in range(STEPS):
            images, labels = _batch(step, rank)
            optimizer.zero_grad()
            F.cross_entropy(model(images), labels).backward()
            optimizer.step()
            ema.update(bare)  # as engine/step.py: after each applied step, on the bare model
            for key, value in bare.state_dict().items():  # own = d own + (1 - d) w, floats; counters copied
                own[key] = DECAY * own[key] + (1 - DECAY) * value.double() if value.is_floating_point() \
                    else value.double().clone()
        saved = {k: v.clone() for k, v in ema.module.state_dict().items()}  # rank 0's: what a checkpoint holds
        raw = {k: v.clone() for k, v in bare.state_dict().items()}
        # the run's evaluation (its sharded evaluation of the EMA and of the raw weights), with what it reads of a Run
        run = SimpleNamespace(cfg=load_config("digits", ["ema.decay=0.5", "eval.batch=4"]), task=_task(),
                              proc=Process(rank=rank, world=WORLD), state=SimpleNamespace(ema=ema), model=model)
        metrics, raw_metrics = Run.evaluate(run)
        torch.save({"saved": saved, "own": own, "raw": raw, "evaluated": ema.module.state_dict(), "metrics": metrics,
                    "raw_metrics": raw_metrics}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_every_rank_evaluates_rank_0_s_ema(tmp_path):
    rank0, rank1 = run_spawned(_worker, WORLD, tmp_path)
    stats = [k for k in rank0["raw"] if k.endswith(("running_mean", "running_var"))]
    assert stats and all(not torch.equal(rank0["saved"][k], rank1["saved"][k]) for k in stats), \
        "the ranks' own EMAs of their BN statistics should differ before the evaluation (else this shows nothing)"
    for key, value in rank0["saved"].items():  # rank 0's EMA is its own average: the closed form
        torch.testing.assert_close(value.double(), rank0["own"][key], rtol=0, atol=1e-6, msg=key)
    for key, value in rank0["saved"].items():  # evaluated: rank 0's EMA on both ranks, bit for bit
        assert torch.equal(rank0["evaluated"][key], value) and torch.equal(rank1["evaluated"][key], value), key
    # the metrics logged are rank 0's EMA's (and rank 0's raw weights') over the whole set, in one process
    task = _task()
    for weights, logged in ((rank0["saved"], "metrics"), (rank0["raw"], "raw_metrics")):
        model = _model()
        model.load_state_dict(weights)
        whole = task.evaluate(model, batch_size=4)
        for result in (rank0, rank1):
            assert result[logged]["images"] == VAL_IMAGES
            for key in ("top1", "top5", "loss"):  # the sharded sums in another order: test_gradient_sync's rel
                assert result[logged][key] == pytest.approx(whole[key], rel=1e-6, abs=1e-9), (logged, key)


@pytest.mark.slow
def test_the_ema_loss_logged_under_torchrun_is_bigbatch_eval_s_of_the_checkpoint(tmp_path):
    """BatchNorm without ``norm.sync``, 2 processes of 4 micro-batches of 8: the EMA's validation loss in
    ``metrics.jsonl`` equals the one ``bigbatch eval`` computes from ``last.pt`` in one process, but for the order of
    the float sums (each rank sums its shard); before, 4.8e-5 of the loss apart."""
    out = tmp_path / "run"
    result = torchrun(out, "model.norm=batch", "subdivisions=4", "ema.decay=0.5", "steps=6", "eval.every=6",
                      "checkpoint.every=6", common=[c for c in COMMON if not c.startswith("steps=")])
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    logged = [r for r in records if r.get("split") == "val" and r.get("step") == 6]
    assert len(logged) == 1, records
    evaluated = run_main("eval", str(out / "checkpoints" / "last.pt"))
    assert evaluated.returncode == 0, evaluated.stderr
    assert "weights  EMA" in evaluated.stdout
    checked = json.loads((out / "eval-last.json").read_text())
    assert checked["images"] == logged[0]["images"]
    assert checked["top1"] == logged[0]["top1"] and checked["top5"] == logged[0]["top5"]
    assert logged[0]["loss"] == pytest.approx(checked["loss"], rel=1e-6, abs=0)  # test_gradient_sync's rel
