"""``model.unfreeze_at``: from that step the parameters a freeze held train as if they never had been frozen. Their
BatchNorm layers leave eval mode (without an evaluation in between to reset them), gradient clipping counts them,
(the resume across ``model.unfreeze_at``: tests/engine/test_start_weights.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from bigbatch.cli import main
from bigbatch.largebatch.freeze import FrozenGroup, set_frozen
from tests.helpers import weights

SMALL = ["batch=32", "subdivisions=1", "data.size=16", "model.width=8", "log.tensorboard=false",
         "memory.interval=60", "schedule.decay.kind=constant"]


def test_a_freeze_that_ended_puts_its_batchnorm_layers_back_in_train_mode():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Conv2d(4, 2, 1))
    group = FrozenGroup(("0.weight", "0.bias", "1.weight", "1.bias"), ("0", "1"), 2, "model.freeze: 2")
    model.train()
    assert set_frozen(model, [group], 0)  # the trained set changed
    assert not model[1].training and not model[1].weight.requires_grad
    assert not set_frozen(model, [group], 1)
    assert not model[1].training
    assert set_frozen(model, [group], 2)
    assert model[1].training and model[1].weight.requires_grad
    model[1].eval()
    set_frozen(model, [group], 3, norm_mode_set=True)  # left as norm.freeze_during_warmup's hook set it
    assert not model[1].training


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    out = tmp_path_factory.mktemp("unfreeze") / "source"
    assert main(["train", "digits", "--out", str(out), "--set", "steps=2", *SMALL]) == 0
    return out


def test_the_backbone_normalises_with_batch_statistics_again_after_unfreeze_at(source, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", "steps=4", "eval.every=4", "checkpoint.every=4",
                 f"model.weights={source}", "model.freeze=backbone", "model.unfreeze_at=2", *SMALL]) == 0
    before, after = weights(source), weights(out)
    for name in before:
        if name.startswith("features.") and name.endswith(("running_mean", "running_var")):
            assert not torch.equal(before[name], after[name]), name  # updated in steps 2 and 3


def test_clipping_counts_the_parameters_a_freeze_held_once_it_ends(source, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", "steps=4", "eval.every=4", "checkpoint.every=4",
                 f"model.weights={source}", "model.freeze=backbone", "model.unfreeze_at=1", "clip.max_norm=0.001",
                 "optim.weight_decay=0", *SMALL]) == 0
    before, after = weights(source), weights(out)
    # each step's SGD update is at most lr x |momentum buffer| <= 0.0125 x 0.001 x (1 + 0.9 + 0.81 + 0.729)
    moved = max((after[name] - before[name]).abs().max().item() for name in before
                if name.startswith("features.") and after[name].is_floating_point()
                and not name.endswith(("running_mean", "running_var")))
    assert 0 < moved < 1e-4

