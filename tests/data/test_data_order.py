"""The data order depends on the seed, the dataset size and the global batch only."""

from __future__ import annotations

import pytest
import torch

from bigbatch.data.pipeline.loader import TensorImages, batches_by_step, eval_batches
from bigbatch.data.pipeline.order import GlobalBatchOrder

pytestmark = pytest.mark.fast


def test_each_epoch_is_a_permutation_and_batches_straddle_epochs():
    order = GlobalBatchOrder(num_images=10, batch=4, seed=1)
    stream = torch.cat([order.global_batch(step) for step in range(5)])  # 20 images = 2 epochs
    assert sorted(stream[:10].tolist()) == list(range(10))
    assert sorted(stream[10:].tolist()) == list(range(10))
    assert not torch.equal(stream[:10], stream[10:]), "each epoch should have its own order"


def test_order_depends_on_seed_only_and_is_reproducible():
    a = GlobalBatchOrder(100, 16, seed=5)
    b = GlobalBatchOrder(100, 16, seed=5)
    c = GlobalBatchOrder(100, 16, seed=6)
    assert torch.equal(a.global_batch(9), b.global_batch(9))
    assert not torch.equal(a.global_batch(9), c.global_batch(9))
    # Asking for a late step first gives the same answer as walking there.
    fresh = GlobalBatchOrder(100, 16, seed=5)
    assert torch.equal(fresh.global_batch(30), a.global_batch(30))


def test_layouts_share_the_global_batch():
    order = GlobalBatchOrder(1000, 48, seed=0)
    for world, subdivisions in [(1, 1), (1, 4), (2, 3), (4, 2), (3, 16)]:
        pieces = [order.micro_batches(7, rank, world, subdivisions) for rank in range(world)]
        assert all(len(p) == subdivisions for p in pieces)
        assert all(len(m) == 48 // (world * subdivisions) for p in pieces for m in p)
        # Chunk j * world + rank: reading micro-batches step by step, rank by rank, gives the batch.
        flat = torch.cat([pieces[rank][j] for j in range(subdivisions) for rank in range(world)])
        assert torch.equal(flat, order.global_batch(7))


def test_loader_started_mid_run_continues_the_same_stream():
    data = TensorImages(torch.arange(50).float()[:, None], torch.arange(50))
    order = GlobalBatchOrder(50, 8, seed=2)
    whole = [step for step in batches_by_step(data, order, 0, 12, rank=0, world=1, subdivisions=2)]
    tail = [step for step in batches_by_step(data, order, 7, 12, rank=0, world=1, subdivisions=2)]
    assert len(whole) == 12 and len(tail) == 5
    for a, b in zip(whole[7:], tail, strict=True):
        for (xa, ya), (xb, yb) in zip(a, b, strict=True):
            assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_evaluation_sees_every_image_once_whatever_the_batch_and_world():
    data = TensorImages(torch.zeros(23, 1), torch.arange(23))
    for batch in (1, 5, 23, 100):
        for world in (1, 2, 3):
            seen = [label.item() for rank in range(world) for _, labels in eval_batches(data, batch, rank, world)
                    for label in labels]
            assert sorted(seen) == list(range(23))


class ThreadsSeen(TensorImages):
    """Records torch's thread count each time a batch is made; ``fail_at``: the batch whose making raises."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__(torch.zeros(12, 1), torch.arange(12))
        self.seen: list[int] = []
        self.fail_at = fail_at

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        self.seen.append(torch.get_num_threads())
        if len(self.seen) == self.fail_at:
            raise ValueError("an unreadable batch")
        return super().__getitems__(indices)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_without_workers_batches_are_made_with_one_thread_and_taken_with_the_processs(two_threads):
    data = ThreadsSeen()
    taken = [torch.get_num_threads() for _ in batches_by_step(data, GlobalBatchOrder(12, 4, seed=0), 0, 3, 0, 1, 2)]
    taken += [torch.get_num_threads() for _ in eval_batches(data, 4)]
    assert data.seen == [1] * 9 and taken == [2] * 6
    failing = ThreadsSeen(fail_at=2)
    with pytest.raises(ValueError, match="an unreadable batch"):
        list(batches_by_step(failing, GlobalBatchOrder(12, 4, seed=0), 0, 3, 0, 1, 2))
    assert failing.seen == [1, 1] and torch.get_num_threads() == 2  # the count is back after an error too
