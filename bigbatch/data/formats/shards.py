"""Image classification from tar shards (``data.name: shards``, ``data.path: DIR``), as ``bigbatch pack`` writes them.

    bigbatch pack /data/imagenet --out /data/imagenet-shards --shard-size 256MB
    bigbatch train inception-v3-tpu --set data.name=shards data.path=/data/imagenet-shards

``DIR`` holds ``train-000000.tar, ...``, ``val-000000.tar, ...`` (the WebDataset layout: ``KEY.jpg`` or ``KEY.png``
and ``KEY.cls`` per sample) and ``index.json`` (the classes, and where each sample's bytes lie in its shard;
``data/formats/pack.py`` describes it). Images are decoded as ``folder`` decodes them (crop first,
``data.preprocessing``, each sample's augmentation drawn from its own seed) and a bad image is reported and replaced the
same way (by the next sample of the set); ``data.strict: true`` decodes every image once before training and stops at
the first bad one.

How the training data is read, as the Inception TPU code's input pipeline does (``parallel_interleave`` over the
files, then a shuffle buffer), for each process (rank ``r`` of ``W``) and each epoch ``e``:

1. the training shards are put in a random order drawn from ``(seed, e)``; rank ``r`` takes shards ``r, r + W,
   r + 2W, ...`` of that order (so each process reads only its own share of the files: at least one shard per
   process is needed);
2. it reads ``CYCLE_LENGTH`` (4) of its shards at once, one sample from each in turn (round-robin, each shard's
   samples in their stored order); when one ends, the next shard of its share takes its place;
3. the samples pass through a shuffle buffer of ``BUFFER`` (256) samples: the buffer is filled, then each next sample
   is one picked at random from it (an RNG drawn from ``(seed, e, r)``) and its place taken by the next sample read.

Rank ``r``'s stream is its epoch 0, then its epoch 1, and so on, without end; optimizer step ``k`` takes samples
``[k * b, (k + 1) * b)`` of it (``b = batch / W``), cut into ``subdivisions`` equal micro-batches. Shards differ in
size, so one process's epoch may end a few samples before another's: each simply goes on into its next epoch, and
every process always has its ``b`` samples.

What is guaranteed:

- **Every image once per epoch**: over its epoch ``e``, rank ``r`` reads each image of its shards exactly once, and
  the ranks' shares of epoch ``e`` together are the whole training set (an epoch of a process is its share).
- **The order is a pure function of (seed, epoch, world size)** (and the packed set): not of the number of
  DataLoader workers, nor of ``subdivisions``.
- **Resume is exact**: the reader's position (which shards, where in them) and the shuffle buffer's contents are
  recomputed from the step (nothing is read to do so: the order is simulated over the sample ids of
  ``index.json``), so they are part of the training state by construction, and a resumed run is bit-identical to one
  never stopped.

What is **not** promised: the same training whatever the number of processes. The order depends on the world size
(each process reads its own shards), so 8 processes and 1 process with 8 times the subdivisions see the images in
different batches. ``data.name: folder`` promises that (its order is one global order, cut among the processes);
choose it when a run must not depend on its layout.

Reading: each sample's bytes are read at its offset in its shard (``os.pread``; open files are kept per process, at
most ``OPEN_FILES``, and opened anew in a DataLoader worker after the fork). A process reads its ``CYCLE_LENGTH``
current shards front to back, so the reads are nearly sequential.
"""

from __future__ import annotations

import bisect
import heapq
import io
import os
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from PIL import Image

from bigbatch.config.data_keys import DATASET_KEYS, detection_keys_unset
from bigbatch.data.formats.counts import train_images_given
from bigbatch.data.formats.encoded_images import (
    DECODE_ERRORS,
    CropFirst,
    EncodedImages,
    image_input,
    preprocessing,
)
from bigbatch.data.formats.pack import INDEX
from bigbatch.data.formats.shard_index import SplitIndex, read_index
from bigbatch.data.pipeline.files import open_regular
from bigbatch.data.pipeline.images import decode_bytes, error_reason
from bigbatch.data.pipeline.order import Batches, batches_of
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.errors import UserError
from bigbatch.registry import DATASETS

if TYPE_CHECKING:
    from bigbatch.config import DataConfig, RunConfig

CYCLE_LENGTH = 4
"""Shards a process reads at once (``cycle_length`` of ``parallel_interleave`` in Cloud TPU's Inception input
pipeline)."""
BUFFER = 256
"""Samples in a process's shuffle buffer."""
OPEN_FILES = 32
"""Open shard files kept per process (least recently used closed first)."""
EPOCHS_CACHED = 4
"""Per-epoch streams kept (a step spans at most a few epochs)."""


# ----------------------------------------------------------------------------- the order


def interleave(shards: Sequence[np.ndarray], cycle_length: int) -> np.ndarray:
    """The samples of ``shards`` read ``cycle_length`` shards at once, round-robin, one sample at a time: slot ``j``
    (``0 <= j < cycle_length``) starts with shard ``j``; in each round the slots give their next sample in slot order;
    a slot whose shard has ended takes the next shard not yet read (the slot that ended first, the lower slot on a tie)
    and gives its first sample in the next round; an empty slot is passed over. (tf.data's ``interleave`` with
    ``block_length=1``, non-sloppy.)"""
    if not shards:
        return np.empty(0, dtype=np.int64)
    rounds: list[tuple[int, int]] = []  # (the round at which the slot is free, slot), a heap
    keys = []
    for k, samples in enumerate(shards):
        if k < cycle_length:
            start, slot = 0, k
        else:
            start, slot = heapq.heappop(rounds)
        heapq.heappush(rounds, (start + len(samples), slot))
        keys.append((start + np.arange(len(samples), dtype=np.int64)) * cycle_length + slot)
    order = np.argsort(np.concatenate(keys), kind="stable")
    return np.concatenate(shards).astype(np.int64)[order]


def shuffle_buffer(stream: np.ndarray, buffer: int, rng: np.random.Generator) -> np.ndarray:
    """``stream`` through a shuffle buffer of ``buffer`` samples (tf.data's ``shuffle``): the buffer is filled with
    the first samples, then each output is the sample at a uniformly drawn place of the buffer, and that place takes
    the next sample of the stream; once the stream has ended, the buffer empties the same way."""
    n = len(stream)
    items = stream.tolist()
    held = items[:buffer]
    following = len(held)
    # The buffer holds min(buffer, n - k) samples when output k is drawn: all the draws at once.
    picks = rng.integers(0, np.minimum(len(held), n - np.arange(n))).tolist() if n else []
    out = [0] * n
    for k, j in enumerate(picks):
        out[k] = held[j]
        if following < n:
            held[j] = items[following]
            following += 1
        else:
            held[j] = held[-1]
            held.pop()
    return np.array(out, dtype=np.int64)


class ShardOrder:
    """The data order of sharded training data (``DataOrder``); see the module's docstring for its definition.

    ``shard_sizes``: the samples of each training shard, in ``index.json``'s order; the samples of shard ``s`` are
    the dataset indices ``sum(shard_sizes[:s]) ...`` in stored order. Nothing is read: the order is computed from
    these counts alone."""

    def __init__(self, shard_sizes: Sequence[int], batch: int | Batches, seed: int, world: int,
                 cycle_length: int = CYCLE_LENGTH, buffer: int = BUFFER) -> None:
        self.batches = batches_of(batch)
        batch = self.batches.batch_at(0)
        if batch % world:
            raise ValueError(f"batch {batch} is not a multiple of the world size {world}")
        if len(shard_sizes) < world:
            raise UserError(f"data.path: {len(shard_sizes)} training shard(s) for {world} processes: each process "
                            f"reads shards of its own; pack with a smaller --shard-size so that there are at least "
                            f"{world}")
        self.sizes = np.asarray(shard_sizes, dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        self.batch, self.seed, self.world = batch, seed, world
        self.cycle_length, self.buffer = cycle_length, buffer
        self._streams: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._ends: dict[int, list[int]] = {}  # rank -> where each of its epochs ends in its stream

    def shards_of(self, epoch: int, rank: int) -> np.ndarray:
        """The shards rank ``rank`` reads in epoch ``epoch``, in the order it opens them."""
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.sizes))[rank :: self.world]

    def epoch_length(self, epoch: int, rank: int) -> int:
        return int(self.sizes[self.shards_of(epoch, rank)].sum())

    def stream(self, epoch: int, rank: int) -> np.ndarray:
        """Rank ``rank``'s samples (dataset indices) of epoch ``epoch``, in the order it reads them."""
        key = (epoch, rank)
        if key in self._streams:
            self._streams.move_to_end(key)
            return self._streams[key]
        shards = [np.arange(self.starts[s], self.starts[s] + self.sizes[s]) for s in self.shards_of(epoch, rank)]
        mixed = interleave(shards, self.cycle_length)
        result = shuffle_buffer(mixed, self.buffer, np.random.default_rng([self.seed, epoch, rank]))
        self._streams[key] = result
        if len(self._streams) > EPOCHS_CACHED:
            self._streams.popitem(last=False)
        return result

    def _locate(self, rank: int, position: int) -> tuple[int, int]:
        """``(epoch, offset in it)`` of place ``position`` of rank ``rank``'s endless stream."""
        ends = self._ends.setdefault(rank, [])
        while not ends or ends[-1] <= position:
            ends.append((ends[-1] if ends else 0) + self.epoch_length(len(ends), rank))
        epoch = bisect.bisect_right(ends, position)
        return epoch, position - (ends[epoch - 1] if epoch else 0)

    def samples(self, rank: int, start: int, count: int) -> torch.Tensor:
        """Places ``start .. start + count - 1`` of rank ``rank``'s stream (its epochs one after the other)."""
        parts = []
        while count > 0:
            epoch, offset = self._locate(rank, start)
            piece = self.stream(epoch, rank)[offset : offset + count]
            parts.append(piece)
            start, count = start + len(piece), count - len(piece)
        return torch.from_numpy(np.concatenate(parts)) if parts else torch.empty(0, dtype=torch.int64)

    def micro_batches(self, step: int, rank: int, world: int, subdivisions: int) -> list[torch.Tensor]:
        """Rank ``rank``'s ``b = batch / world`` samples of step ``step``, in ``subdivisions`` equal pieces: the
        next ``b`` of its stream (under a batch schedule, from ``images_before(step) / world`` on)."""
        if world != self.world:
            raise ValueError(f"this order is for {self.world} processes, asked for {world}")
        start, share = self.batches.images_before(step) // world, self.batches.batch_at(step) // world
        return list(self.samples(rank, start, share).chunk(subdivisions))


# ----------------------------------------------------------------------------- the dataset


class ShardImages(EncodedImages):
    """The samples of one split of the shards: each image's bytes read at its offset in its shard (keys, samples,
    bad images and ``collate``: ``EncodedImages``)."""

    def __init__(self, index: SplitIndex, preprocess: CropFirst, issues: DataIssues, scored: bool = False) -> None:
        super().__init__(preprocess, issues, shard_set_name(index), scored)
        self.index = index
        self._files: OrderedDict[int, io.FileIO] = OrderedDict()  # shard -> its open file, this process's
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker opens its own files
        return {**self.__dict__, "_files": OrderedDict(), "_pid": None}

    def read(self, index: int) -> bytearray:
        """The image file's bytes of sample ``index``, read at its offset in its shard."""
        if self._pid != os.getpid():  # a forked DataLoader worker opens its own (the parent's stay open there)
            self._files, self._pid = OrderedDict(), os.getpid()
        shard = int(self.index.shard[index])
        file = self._files.get(shard)
        if file is None:
            file = self._files[shard] = open_regular(self.index.paths[shard], limit=2**63 - 1)  # sizes: the index
            if len(self._files) > OPEN_FILES:
                self._files.popitem(last=False)[1].close()
        else:
            self._files.move_to_end(shard)
        size, offset = int(self.index.size[index]), int(self.index.offset[index])
        data = bytearray(size)  # writable: torchvision decodes from it without a copy
        got = os.preadv(file.fileno(), [data], offset)
        if got != size:
            raise OSError(f"the shard ends {size - got} bytes before the image does")
        return data

    def where(self, index: int) -> str:
        """``SHARD:KEY.ext`` of sample ``index``, for messages."""
        return f"{self.index.paths[int(self.index.shard[index])]}:{self.index.member[index].decode()}"

    def source(self, index: int) -> bytearray:
        return self.read(index)

    def label(self, index: int) -> int:
        return int(self.index.label[index])

    def origin(self, index: int) -> str:
        return f"; packed from {self.index.source[index].decode(errors='replace')}"

    def inspect_shard(self, shard: int) -> list[tuple[int, str]]:
        """``(index, problem)`` of each sample of ``shard`` that does not decode whole (``data.strict``); the shard
        is read front to back with a file of its own (one thread a shard)."""
        problems = []
        with open_regular(self.index.paths[shard], limit=2**63 - 1) as file:
            for index in np.flatnonzero(self.index.shard == shard).tolist():
                try:
                    file.seek(int(self.index.offset[index]))
                    data = bytearray(file.read(int(self.index.size[index])))
                    if len(data) != self.index.size[index]:
                        raise OSError("the shard ends before the image does")
                    with Image.open(io.BytesIO(data)):
                        pass
                    decode_bytes(data)
                except DECODE_ERRORS as error:
                    problems.append((index, f"unreadable image ({error_reason(error)}{self.origin(index)})"))
        return problems


def shard_set_name(index: SplitIndex) -> str:
    """A split's shards in a message: ``the train shards in /data/shards (train-000000.tar .. train-000007.tar)``."""
    if not index.paths:
        return f"the {index.split} shards"
    first, last = Path(index.paths[0]), Path(index.paths[-1])
    names = first.name if first == last else f"{first.name} .. {last.name}"
    return f"the {index.split} shards in {first.parent} ({names})"


class TrainShards(ShardImages):
    """The training split: it brings its own data order (``data/pipeline/order.py``'s ``order_of``)."""

    def order(self, batch: int | Batches, seed: int, world: int) -> ShardOrder:
        return ShardOrder(self.index.shard_sizes, batch, seed, world)


# ----------------------------------------------------------------------------- the format


def load(cfg: RunConfig) -> tuple[TrainShards, ShardImages, list[str]]:
    """(train, val, class names: the index's); with ``data.strict`` every image is decoded once first. The index is
    checked whole before any shard is opened (``data/formats/shard_index.py``)."""
    _path_given(cfg.data)
    index = read_index(Path(cfg.data.path))
    issues = DataIssues(strict=cfg.data.strict)
    chosen = preprocessing(cfg.data)
    train = TrainShards(index.train, chosen.train, issues)
    val = ShardImages(index.val, chosen.eval, issues, scored=True)
    if cfg.data.strict:
        for dataset in (train, val):
            with ThreadPoolExecutor(max_workers=min(8, 2 * (os.cpu_count() or 1))) as pool:
                found = pool.map(dataset.inspect_shard, range(len(dataset.index.paths)))
                for index, problem in sorted(p for problems in found for p in problems):
                    issues.report(dataset.where(index), None, problem)
    return train, val, list(index.classes)


def train_images(cfg: RunConfig) -> int:
    """The training samples, from ``index.json``; ``data.train_images`` when the shards are not at hand (``show``,
    ``schedule``, ``scale``); neither: ``DataNotAtHand``."""
    data = cfg.data
    if data.path is None or not (Path(data.path) / INDEX).is_file():
        return train_images_given(None if data.path is None else Path(data.path), data)
    return len(read_index(Path(data.path)).train)


def _path_given(data: DataConfig) -> None:
    """Training and evaluation read the shards: ``data.path`` must be given, and be there (planning needs only the
    count)."""
    if data.path is None:
        raise UserError("data.path: missing; training and evaluation read the folder `bigbatch pack` wrote "
                        "(index.json and the tars)")
    if not Path(data.path).exists():
        raise UserError(f"data.path: {data.path} does not exist; expected the folder `bigbatch pack` wrote "
                        "(index.json and the tars)")


DATASETS.register("shards", load, task="classification", count=train_images, given=_path_given,
                  fields=DATASET_KEYS["shards"], image_input=image_input, check=detection_keys_unset)
