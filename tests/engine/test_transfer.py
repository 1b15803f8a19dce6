"""The input pipeline's transfer stage (engine/transfer.py): nothing copied on the CPU; on CUDA, micro-batches
copied one ahead on a side stream arrive intact, in order, and again on a re-run."""

from __future__ import annotations

import pytest
import torch

from bigbatch.engine.transfer import DeviceFeed, to_device
from bigbatch.floor.tensors import tensors_in

pytestmark = pytest.mark.fast


def test_on_the_cpu_the_micro_batches_are_used_where_they_are():
    micro_batches = [(torch.ones(2, 3), torch.tensor([0, 1])), (torch.zeros(2, 3), torch.tensor([1, 0]))]
    assert DeviceFeed(torch.device("cpu"))(micro_batches) is micro_batches
    assert to_device(micro_batches, torch.device("cpu")) is micro_batches


def test_tensors_in_a_nested_batch():
    a, b, c = torch.zeros(1), torch.ones(1), torch.full((1,), 2.0)
    found = list(tensors_in((a, [b, {"boxes": c, "name": "x"}], 3)))
    assert [t.item() for t in found] == [0.0, 1.0, 2.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the side-stream copy is CUDA's)")
def test_cuda_micro_batches_arrive_intact_one_ahead():
    device = torch.device("cuda")
    host = [(torch.randn(64, 3, 32, 32).pin_memory(), torch.arange(64).pin_memory(), {"id": torch.tensor([i])})
            for i in range(4)]
    fed = DeviceFeed(device)(host)
    assert len(fed) == 4
    for _ in range(2):  # a re-run copies again
        seen = 0
        for i, (images, labels, extra) in enumerate(fed):
            assert images.device.type == "cuda" and extra["id"].device.type == "cuda"
            result = (images * 2).sum()  # compute on the current stream reads the copy
            assert torch.allclose(result.cpu(), (host[i][0] * 2).sum(), rtol=1e-4)
            assert torch.equal(labels.cpu(), host[i][1]) and extra["id"].item() == i
            seen += 1
        assert seen == 4
