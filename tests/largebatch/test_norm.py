"""BatchNorm running statistics: momentum conversions against their closed forms, and ``per_step`` pooling
against the statistics of the whole batch computed directly (the first conv's output on all 64 images)."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from bigbatch.batching import BatchPlan
from bigbatch.config import NormConfig
from bigbatch.engine.step import attempt_step
from bigbatch.largebatch.norm import (
    PerStepRunningStats,
    bn_momentum,
    configure_batchnorm,
    momentum_from_half_life,
    momentum_per_update,
    updates_per_step,
)
from bigbatch.models.small_cnn import SmallCNN
from bigbatch.tasks.classification import ClassificationTask

pytestmark = pytest.mark.fast

CROSS_ENTROPY = ClassificationTask(train_set=None, val_set=None, num_classes=10).loss
"""The classification task's loss: the mean cross-entropy of a micro-batch (no label smoothing)."""

BATCH = 64


def plan(subdivisions: int, world: int = 1, batch: int = BATCH) -> BatchPlan:
    return BatchPlan(batch=batch, world=world, subdivisions=subdivisions, steps=1, train_images=1000)


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    images = torch.randn(BATCH, 3, 16, 16, generator=g) * 2 + 0.5
    labels = torch.randint(0, 10, (BATCH,), generator=g)
    return images, labels


def make_model() -> SmallCNN:
    torch.manual_seed(0)
    return SmallCNN(10, width=8, norm="batch")


def bn_buffers(model: nn.Module) -> list[torch.Tensor]:
    return [b.detach().clone() for m in model.modules() if isinstance(m, nn.BatchNorm2d)
            for b in (m.running_mean, m.running_var)]


def one_step(model: nn.Module, data, subdivisions: int, cfg: NormConfig):
    """One optimizer step through the trainer's ``attempt_step``; returns the BN running buffers after it and
    the inputs each BN layer saw during it (one tensor per layer, all micro-batches concatenated)."""
    model = copy.deepcopy(model)
    layers = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    inputs: list[list[torch.Tensor]] = [[] for _ in layers]
    for layer, seen in zip(layers, inputs, strict=True):
        layer.register_forward_pre_hook(lambda _, args, seen=seen: seen.append(args[0].detach().clone()))
    stats = configure_batchnorm(model, cfg, plan(subdivisions))
    images, labels = data
    micro_batches = list(zip(images.chunk(subdivisions), labels.chunk(subdivisions), strict=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    attempt_step(model, optimizer, micro_batches, CROSS_ENTROPY)
    if stats is not None:
        assert all(layer.num_batches_tracked.item() == 0 for layer in layers)  # nothing until the end of the step
        assert torch.equal(layers[0].running_mean, torch.zeros(8))
        stats.end_step()
        assert all(layer.num_batches_tracked.item() == 1 for layer in layers)
    return bn_buffers(model), [torch.cat(seen) for seen in inputs]


# --- momentum ---------------------------------------------------------------------------------------------


def test_momentum_per_update_closed_form():
    for m, n in [(0.1, 8), (0.0003, 8), (0.5, 3), (0.2, 1)]:
        m_update = momentum_per_update(m, n)
        assert m_update == pytest.approx(1 - (1 - m) ** (1 / n), rel=1e-12)
        assert (1 - m_update) ** n == pytest.approx(1 - m, rel=1e-12)
    # the Inception guide's numbers: alpha = 0.9997 on 8 GPUs <-> beta = alpha ** 8 = 0.9976 for one update
    assert 1 - momentum_per_update(1 - 0.9997 ** 8, 8) == pytest.approx(0.9997, rel=1e-12)
    assert 0.9997**8 == pytest.approx(0.9976, abs=1e-4)


def test_n_updates_equal_one_step_update():
    """N EMA updates with the per-update momentum decay the old value like one update with the per-step one."""
    m_step, n = 0.1, 8
    m = momentum_per_update(m_step, n)
    running, x = torch.tensor([5.0], dtype=torch.float64), torch.tensor([-2.0], dtype=torch.float64)
    for _ in range(n):
        running = (1 - m) * running + m * x
    assert running.item() == pytest.approx(((1 - m_step) * 5.0 + m_step * -2.0), rel=1e-12)


def test_half_life_closed_form():
    m = momentum_from_half_life(64, 640)
    assert m == pytest.approx(1 - 0.5 ** (64 / 640), rel=1e-12)
    assert (1 - m) ** 10 == pytest.approx(0.5, rel=1e-12)  # 10 updates of 64 images = one half-life


def test_bn_momentum_from_config():
    assert bn_momentum(NormConfig(), plan(8)) is None
    assert bn_momentum(NormConfig(momentum=0.1), plan(8)) == pytest.approx(1 - 0.9 ** (1 / 8), rel=1e-12)
    assert bn_momentum(NormConfig(momentum=0.1, running_stats="per_step"), plan(8)) == pytest.approx(0.1)
    # half-life: n = micro-batch (64 / (2 * 4) = 8) per update, or the device's share of the step (32)
    cfg = NormConfig(half_life_images=1000.0)
    assert bn_momentum(cfg, plan(4, world=2)) == pytest.approx(1 - 0.5 ** (8 / 1000), rel=1e-12)
    cfg = NormConfig(half_life_images=1000.0, running_stats="per_step")
    assert bn_momentum(cfg, plan(4, world=2)) == pytest.approx(1 - 0.5 ** (32 / 1000), rel=1e-12)


def test_configure_sets_every_batchnorm_kind():
    model = nn.Sequential(nn.BatchNorm1d(3), nn.BatchNorm2d(3), nn.BatchNorm3d(3), nn.SyncBatchNorm(3),
                          nn.GroupNorm(1, 3))
    assert configure_batchnorm(model, NormConfig(momentum=0.2), plan(4)) is None
    expected = 1 - 0.8 ** (1 / 4)
    assert [m.momentum for m in model[:4]] == pytest.approx([expected] * 4, rel=1e-12)
    unset = nn.BatchNorm2d(3, momentum=0.05)
    configure_batchnorm(unset, NormConfig(), plan(4))
    assert unset.momentum == 0.05


# --- one update per optimizer step --------------------------------------------------------------------------


def test_per_step_is_independent_of_subdivisions_and_matches_whole_batch(data):
    model = make_model()
    cfg = NormConfig(running_stats="per_step", momentum=0.2)
    (whole, _), (split, split_inputs) = one_step(model, data, 1, cfg), one_step(model, data, 8, cfg)
    # the first BN layer sees the same 64 inputs either way (conv of the images): same running statistics
    torch.testing.assert_close(whole[0], split[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(whole[1], split[1], rtol=0, atol=1e-6)

    # oracle: its input is the first conv's output on all 64 images (with the weights before the update)
    with torch.no_grad():
        y = model.features[0][0](data[0]).double()
    m = 0.2
    mean, var = y.mean(dim=(0, 2, 3)), y.var(dim=(0, 2, 3), unbiased=True)
    torch.testing.assert_close(split[0].double(), (1 - m) * 0.0 + m * mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(split[1].double(), (1 - m) * 1.0 + m * var, rtol=0, atol=1e-6)

    # deeper layers see inputs normalised per micro-batch, which do depend on subdivisions; each layer's
    # running statistics are still those of everything it saw in the step, pooled
    for k, seen in enumerate(split_inputs):
        seen = seen.double()
        mean, var = seen.mean(dim=(0, 2, 3)), seen.var(dim=(0, 2, 3), unbiased=True)
        torch.testing.assert_close(split[2 * k].double(), m * mean, rtol=0, atol=1e-6)
        torch.testing.assert_close(split[2 * k + 1].double(), (1 - m) + m * var, rtol=0, atol=1e-6)


def test_per_microbatch_depends_on_subdivisions(data):
    """PyTorch's default: the first layer's statistics (same inputs either way) move with subdivisions."""
    model = make_model()
    (whole, _), (split, _) = one_step(model, data, 1, NormConfig()), one_step(model, data, 8, NormConfig())
    assert (whole[0] - split[0]).abs().max() > 1e-2
    assert (whole[1] - split[1]).abs().max() > 1e-2


def test_training_output_unchanged_and_eval_uses_running_stats():
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(4)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5)
        plain.bias.uniform_(-1, 1)
    hooked = copy.deepcopy(plain)
    stats = PerStepRunningStats(hooked)
    x = torch.randn(2, 8, 4, 5, 5) * 3 + 1  # 2 micro-batches of 8
    for micro in x:
        a, b = micro.clone().requires_grad_(), micro.clone().requires_grad_()
        out_plain, out_hooked = plain(a), hooked(b)
        torch.testing.assert_close(out_hooked, out_plain, rtol=0, atol=1e-6)  # each micro-batch's own stats
        out_plain.square().sum().backward()
        out_hooked.square().sum().backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=0, atol=1e-5)
    assert torch.equal(hooked.running_mean, torch.zeros(4))  # nothing until the end of the step
    stats.end_step()

    flat = x.reshape(16, 4, 5, 5).double()
    expected_mean = 0.1 * flat.mean(dim=(0, 2, 3))
    expected_var = 0.9 + 0.1 * flat.var(dim=(0, 2, 3), unbiased=True)
    torch.testing.assert_close(hooked.running_mean.double(), expected_mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(hooked.running_var.double(), expected_var, rtol=0, atol=1e-6)

    hooked.eval()
    before = hooked.running_mean.clone()
    probe = torch.randn(3, 4, 5, 5)
    with torch.no_grad():
        out = hooked(probe)
        shape = (1, 4, 1, 1)
        expected = (probe - hooked.running_mean.view(shape)) / torch.sqrt(hooked.running_var.view(shape) + 1e-5)
        expected = expected * hooked.weight.view(shape) + hooked.bias.view(shape)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert torch.equal(hooked.running_mean, before)  # eval: no update


def test_cumulative_average_when_momentum_is_none():
    layer = nn.BatchNorm1d(3, momentum=None)
    stats = PerStepRunningStats(layer)
    steps = [torch.randn(12, 3) * (k + 1) + k for k in range(2)]
    for batch in steps:
        for micro in batch.chunk(3):
            layer(micro)
        stats.end_step()
    means = [b.double().mean(0) for b in steps]
    variances = [b.double().var(0, unbiased=True) for b in steps]
    assert layer.num_batches_tracked.item() == 2
    torch.testing.assert_close(layer.running_mean.double(), (means[0] + means[1]) / 2, rtol=0, atol=1e-6)
    torch.testing.assert_close(layer.running_var.double(), (variances[0] + variances[1]) / 2, rtol=0, atol=1e-6)


def test_layers_without_input_are_untouched_and_autocast_sums_in_float64():
    used, unused = nn.BatchNorm1d(3), nn.BatchNorm1d(3)
    stats = PerStepRunningStats(nn.ModuleList([used, unused]))
    x = torch.randn(16, 3).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        used(x[:8])
        used(x[8:])
    stats.end_step()
    torch.testing.assert_close(used.running_mean.double(), 0.1 * x.double().mean(0), rtol=0, atol=1e-6)
    torch.testing.assert_close(used.running_var.double(), 0.9 + 0.1 * x.double().var(0), rtol=0, atol=1e-6)
    assert unused.num_batches_tracked.item() == 0
    assert torch.equal(unused.running_mean, torch.zeros(3)) and torch.equal(unused.running_var, torch.ones(3))


def test_reduce_sees_packed_sums():
    layer = nn.BatchNorm1d(2)
    seen = []
    stats = PerStepRunningStats(layer, reduce=lambda t: seen.append(t.clone()) or t * 2)  # two equal "processes"
    x = torch.tensor([[1.0, 2.0], [3.0, 6.0]])
    layer(x)
    stats.end_step()
    torch.testing.assert_close(seen[0], torch.tensor([2.0, 4.0, 8.0, 10.0, 40.0], dtype=torch.float64))
    # pooled over 4 values [1, 3, 1, 3] and [2, 6, 2, 6]: mean 2 and 4, unbiased variance 4/3 and 16/3
    torch.testing.assert_close(layer.running_mean, torch.tensor([0.2, 0.4]))
    torch.testing.assert_close(layer.running_var, 0.9 + 0.1 * torch.tensor([4 / 3, 16 / 3]))


def test_remove_restores_torch_behaviour():
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(4)
    hooked = copy.deepcopy(plain)
    stats = PerStepRunningStats(hooked)
    stats.remove()
    assert not hooked._forward_pre_hooks and not hooked._forward_hooks and hooked.track_running_stats
    x = torch.randn(8, 4, 3, 3)
    plain(x)
    hooked(x)
    stats.end_step()  # nothing left to apply
    assert hooked.num_batches_tracked.item() == plain.num_batches_tracked.item() == 1
    torch.testing.assert_close(hooked.running_mean, plain.running_mean, rtol=0, atol=0)
    torch.testing.assert_close(hooked.running_var, plain.running_var, rtol=0, atol=0)
    expected = F.batch_norm(x, torch.zeros(4), torch.ones(4), training=True, momentum=0.1)
    torch.testing.assert_close(hooked(x), expected, rtol=0, atol=1e-6)
    assert math.isclose(hooked.momentum, 0.1)


@pytest.mark.parametrize("running_stats", ["per_microbatch", "per_step"])
def test_freeze_during_warmup_keeps_batchnorm_in_eval_mode_until_the_warmup_ends(tmp_path, running_stats):
    """MegDet's ``if iter < warmup_iters: bn.eval()``: running statistics untouched for the 3 warmup steps (while
    the scales and shifts learn), updated from the 4th step on."""
    from bigbatch.config import load_config
    from bigbatch.engine.trainer import train

    settings = ["batch=32", "subdivisions=2", "data.size=8", "model.width=4", "log.tensorboard=false",
                "eval.every=100", "checkpoint.every=1",
                "schedule.warmup=[{kind: linear, length: 3, start_factor: 0.1}]",
                "norm.freeze_during_warmup=true", f"norm.running_stats={running_stats}"]

    def weights(steps: int) -> dict[str, torch.Tensor]:
        out = tmp_path / f"{running_stats}-{steps}"
        train(load_config("digits", [*settings, f"steps={steps}"]), out)
        return torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]

    frozen, thawed = weights(3), weights(4)
    means = [k for k in frozen if k.endswith("running_mean")]
    assert means
    for key in means:
        assert torch.equal(frozen[key], torch.zeros_like(frozen[key])), key  # as initialised
        assert torch.equal(frozen[key.replace("mean", "var")], torch.ones_like(frozen[key])), key
        assert not torch.equal(thawed[key], frozen[key]), key  # the 4th step updates them
    scales = [k for k in frozen if k.replace("weight", "running_mean") in frozen and k.endswith("weight")]
    assert any(not torch.equal(frozen[k], torch.ones_like(frozen[k])) for k in scales)  # the scales learned


def test_warmup_steps_of_each_schedule_preset():
    from bigbatch.config import load_config
    from bigbatch.largebatch.schedule import warmup_steps

    plan = BatchPlan(batch=256, world=1, subdivisions=1, steps=5000, train_images=118287)
    megdet = load_config("megdet-r50-fpn")
    assert warmup_steps(megdet, plan) == 500
    two_phases = load_config("digits", ["schedule.warmup=[{kind: constant, length: 2 epochs, factor: 0.1}, "
                                        "{kind: linear, length: '1000 images'}]"])
    assert warmup_steps(two_phases, plan) == math.ceil(2 * 118287 / 256 + 1000 / 256)
    darknet = load_config("digits", ["schedule.preset=darknet", "schedule.darknet.burn_in=1000"])
    assert warmup_steps(darknet, plan) == 1000


def test_the_inception_recipe_decays_its_running_statistics_as_the_tpu_code_does():
    """The reference (tensorflow/tpu's inception_v3.py) updates each moving average once a step with decay 0.996
    (BATCH_NORM_DECAY); the recipe's 32 micro-batches update it 32 times, which together must decay by 0.996. Left to
    torchvision's own momentum (0.1 an update) they decayed by 0.9 ** 32 = 0.03 a step. Its dropout is TF-slim's
    inception_v3's, keep probability 0.8."""
    from bigbatch.batching import make_plan
    from bigbatch.config import load_config
    from bigbatch.models import build_model

    cfg = load_config("inception-v3-tpu", ["data.path=/data/imagenet"])
    run_plan = make_plan(cfg, 1, 1_281_167)
    per_update = bn_momentum(cfg.norm, run_plan)
    assert (1 - per_update) ** updates_per_step(cfg.norm, run_plan) == pytest.approx(0.996, rel=1e-12)
    model = build_model(cfg.model, 10, size=299)
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.2]
