"""``data.thread``: at 0 workers the next step is made on a thread while this one trains (``data/loader.py``,
``made_ahead``). The items come in order, at most one made ahead, an error in the thread is raised at its item, a
stopped consumer stops the thread; image-folder batches are the same with and without it, and so is a whole run
with dropout (the thread leaves the training's RNG alone)."""

from __future__ import annotations

import threading

import pytest
import torch

from bigbatch.data import loader
from bigbatch.data.crops import InceptionTrainCrop, StandardTrainCrop
from bigbatch.data.folder import FolderImages
from bigbatch.data.loader import TensorImages, batches_by_step, made_ahead
from bigbatch.data.order import GlobalBatchOrder
from bigbatch.data.problems import DataIssues
from tests.helpers import run_main, weights, write_photo_folder


def counted(n: int, made: list[int], fail_at: int | None = None):
    for i in range(n):
        if i == fail_at:
            raise ValueError(f"bad item {i}")
        made.append(i)
        yield i


def data_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "bigbatch-data"]


def test_items_come_in_order_with_at_most_one_made_ahead():
    made: list[int] = []
    received = []
    for item in made_ahead(counted(30, made)):
        assert len(made) <= item + 2  # this item and at most the next
        received.append(item)
    assert received == list(range(30)) and not data_threads()


def test_an_error_in_the_thread_is_raised_at_its_item():
    received = []
    with pytest.raises(ValueError, match="bad item 3"):
        for item in made_ahead(counted(10, [], fail_at=3)):
            received.append(item)
    assert received == [0, 1, 2] and not data_threads()


def test_a_consumer_that_stops_early_stops_the_thread():
    made: list[int] = []
    items = made_ahead(counted(1000, made))
    assert [next(items), next(items)] == [0, 1]
    items.close()
    assert not data_threads() and len(made) <= 4


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    return write_photo_folder(tmp_path_factory.mktemp("thread") / "set")


def folder_steps(photos, preprocess, thread: bool) -> list[list[tuple]]:
    samples = [(str(p), n % 3) for n, p in enumerate(sorted((photos / "train").rglob("*.jpg")))]
    dataset = FolderImages(samples, preprocess, DataIssues())
    order = GlobalBatchOrder(len(samples), 8, seed=2)
    keys = lambda step, indices: [(index, 7919 * step + index) for index in indices]  # noqa: E731
    return list(batches_by_step(dataset, order, 0, 5, 0, 1, 2, 0, keys, thread=thread))


@pytest.mark.parametrize("preprocess", [InceptionTrainCrop(40), StandardTrainCrop(40)], ids=["inception", "standard"])
def test_image_folder_steps_are_the_same_made_on_the_thread(photos, preprocess, monkeypatch):
    threaded = []
    monkeypatch.setattr(loader, "made_ahead", lambda items: threaded.append(1) or made_ahead(items))
    torch.manual_seed(5)
    on_thread = folder_steps(photos, preprocess, thread=True)
    after = torch.rand(3)
    assert threaded == [1]
    torch.manual_seed(5)
    in_line = folder_steps(photos, preprocess, thread=False)
    assert torch.equal(after, torch.rand(3))  # the global RNG was not drawn from either way
    assert threaded == [1]
    for ours, theirs in zip(on_thread, in_line, strict=True):
        for (images, labels, _), (their_images, their_labels, _) in zip(ours, theirs, strict=True):
            assert torch.equal(images, their_images) and torch.equal(labels, their_labels)


def test_a_dataset_that_draws_from_the_global_rng_is_not_made_on_a_thread(monkeypatch):
    threaded = []
    monkeypatch.setattr(loader, "made_ahead", lambda items: threaded.append(1) or made_ahead(items))
    dataset = TensorImages(torch.randn(16, 3, 4, 4), torch.arange(16))
    steps = list(batches_by_step(dataset, GlobalBatchOrder(16, 8, seed=0), 0, 3, 0, 1, 2, 0, thread=True))
    assert len(steps) == 3 and threaded == []


def test_a_run_with_dropout_trains_the_same_weights_with_and_without_the_thread(tmp_path, photos):
    settings = ["data.name=folder", f"data.path={photos}", "batch=8", "subdivisions=2", "steps=4", "data.size=32",
                "eval.every=2", "checkpoint.every=4", "log.tensorboard=false", "model.width=4",
                "schedule.warmup=[]", "model.dropout=0.3", "data.preprocessing=standard",
                "data.standard.color_jitter=0.3"]
    runs = {}
    for thread in ("true", "false"):
        out = tmp_path / thread
        result = run_main("train", "digits", "--out", str(out), "--set", *settings, f"data.thread={thread}")
        assert result.returncode == 0, result.stderr
        runs[thread] = out
    ours, theirs = weights(runs["true"]), weights(runs["false"])
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)  # bit for bit
