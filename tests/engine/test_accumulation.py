"""Subdivisions change memory, not the gradient: (batch 64, subdivisions 1, 4, 64) give the
gradient of the mean loss over the whole batch, computed here directly as the oracle."""

from __future__ import annotations

import copy

import pytest
import torch

from bigbatch.config import ModelConfig
from bigbatch.data.formats.digits import load_digits_split
from bigbatch.data.pipeline.loader import batches_by_step
from bigbatch.data.pipeline.order import GlobalBatchOrder
from bigbatch.engine.step import attempt_step
from bigbatch.models import build_classifier
from bigbatch.tasks.classification import ClassificationTask

CROSS_ENTROPY = ClassificationTask(train_set=None, val_set=None, num_classes=10).loss
"""The classification task's loss: the mean cross-entropy of a micro-batch (no label smoothing)."""

BATCH = 64


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the gradients it was asked to apply."""

    def step(self, closure=None):
        self.seen = [p.grad.detach().clone() for group in self.param_groups for p in group["params"]]
        return super().step(closure)


@pytest.fixture(scope="module")
def train_set():
    return load_digits_split(16)[0]


def make_model(norm: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_classifier(ModelConfig(name="small_cnn", norm=norm, width=8), num_classes=10)


def run(model, train_set, subdivisions: int, steps: int) -> list[list[torch.Tensor]]:
    model = copy.deepcopy(model)
    optimizer = RecordingSGD(model.parameters(), lr=0.05, momentum=0.9)
    order = GlobalBatchOrder(len(train_set), BATCH, seed=3)
    grads = []
    for micro_batches in batches_by_step(train_set, order, 0, steps, rank=0, world=1, subdivisions=subdivisions):
        assert len(micro_batches) == subdivisions
        assert all(len(labels) == BATCH // subdivisions for _, labels in micro_batches)
        attempt_step(model, optimizer, micro_batches, CROSS_ENTROPY)
        grads.append(optimizer.seen)
    return grads, [p.detach().clone() for p in model.parameters()]


def assert_close(actual: list[torch.Tensor], expected: list[torch.Tensor], rtol: float) -> None:
    flat_a = torch.cat([a.flatten() for a in actual]).double()
    flat_e = torch.cat([e.flatten() for e in expected]).double()
    relative = (flat_a - flat_e).norm() / flat_e.norm()
    assert relative < rtol, f"relative difference {relative:.3g}"
    torch.testing.assert_close(flat_a, flat_e, rtol=rtol, atol=rtol * flat_e.abs().max().item())


@pytest.mark.parametrize("norm", ["none", "group"])
def test_gradient_is_the_whole_batch_gradient_for_any_subdivisions(train_set, norm):
    model = make_model(norm)
    images, labels = train_set.__getitems__(GlobalBatchOrder(len(train_set), BATCH, seed=3).global_batch(0).tolist())
    oracle = copy.deepcopy(model)
    CROSS_ENTROPY(oracle, (images, labels)).backward()
    expected = [p.grad for p in oracle.parameters()]
    for subdivisions in (1, 4, 64):
        grads, _ = run(model, train_set, subdivisions, steps=1)
        assert_close(grads[0], expected, rtol=1e-5)


@pytest.mark.parametrize("norm", ["none", "group"])
def test_weights_after_five_steps_agree_across_subdivisions(train_set, norm):
    model = make_model(norm)
    _, reference = run(model, train_set, 1, steps=5)
    initial = [p.detach() for p in model.parameters()]
    moved = [not torch.equal(a, b) for a, b in zip(reference, initial, strict=True)]
    assert any(moved), "training did not move the weights"
    for subdivisions in (4, 64):
        _, weights = run(model, train_set, subdivisions, steps=5)
        assert_close(weights, reference, rtol=1e-5)
