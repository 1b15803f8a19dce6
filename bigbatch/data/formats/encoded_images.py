"""What the folder and shard formats share: a sample decoded crop first, the dataset of encoded images that both are,
the preprocessing ``data.preprocessing`` chooses, and the ``data`` keys both add.

A sample is decoded crop first (``CropFirst``): the crop box is chosen from the size in the file's header, then the
image decoded, cropped, resized and augmented. A JPEG has only the crop's region decoded (``data/pipeline/jpeg.py``:
the whole decode's pixels, bit for bit). With ``data.decode: fast`` it is decoded at the smallest DCT scale (1/1,
1/2, 1/4, 1/8; libjpeg's scaled decoding) that still gives the crop at least the output's size, and the Inception
resize runs on the uint8 pixels; ``exact`` (the default) keeps the full-resolution pixels and the preprocessing's own
arithmetic. ``docs/data.md`` states how far the two differ.

A sample's augmentation is drawn from its own seed (``data/pipeline/order.py``'s ``sample_seed``: run seed, step,
index), so an image gets the same crop whatever the devices, subdivisions, workers or a resume. A file that cannot be
decoded is reported once, with its path and the reason, and the next readable image of the set stands in for it; a
set none of whose images can be decoded is one error naming the set.

At 0 workers, in a process with several torch threads, a batch's samples are spread over that many threads
(``EncodedImages._threaded_rest``) where the preprocessing can make its draws ahead of its work
(``planned_finish``: the Inception and standard crops): one thread makes every draw in the samples' order, the
others decode and finish; the same values as one by one.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import mmap
from abc import ABC, abstractmethod
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info
from torchvision.io import ImageReadMode, decode_image

from bigbatch.data.pipeline import jpeg
from bigbatch.data.pipeline.batch_slabs import shared_batch_tensor
from bigbatch.data.pipeline.files import read_regular
from bigbatch.data.pipeline.images import error_reason
from bigbatch.data.pipeline.loader import batch_threads
from bigbatch.data.pipeline.order import sample_rng
from bigbatch.data.pipeline.problems import DataIssues, none_readable

if TYPE_CHECKING:
    from bigbatch.config import DataConfig, RunConfig

JPEG_SCALES = (8, 4, 2, 1)
"""The reductions libjpeg decodes at directly (1/8, 1/4, 1/2, 1/1 of each side), largest first."""


# ----------------------------------------------------------------------------- crop first, then decode


class CropFirst(Protocol):
    """A preprocessing that chooses its crop from the image's size alone, then finishes on the cropped pixels."""

    fast: bool
    """``data.decode: fast``: a JPEG may be decoded at a reduced DCT scale, and the finish may resize
    approximately (``docs/data.md``, "Exact and fast decoding"); ``False``: the full decode, the exact arithmetic."""

    def box(self, height: int, width: int) -> tuple[int, int, int, int]:
        """``(top, left, h, w)`` of the crop in the full image (may draw from torch's RNG)."""

    def needed(self, box_height: int, box_width: int) -> tuple[int, int]:
        """The smallest ``(h, w)`` the crop may be decoded at without losing what the output keeps."""

    def finish(self, crop: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The uint8 CHW crop -> the float CHW sample (resize, flip, colour, normalise), written into ``out`` when
        given (the sample's slot in its batch)."""


def jpeg_reduction(box_height: int, box_width: int, needed: tuple[int, int]) -> int:
    """The largest of libjpeg's reductions (8, 4, 2, 1) that leaves the crop at least ``needed`` pixels; 1 when the
    crop is smaller than that already (it is then enlarged)."""
    return next((r for r in JPEG_SCALES if box_height / r >= needed[0] and box_width / r >= needed[1]), 1)


def reduced_box(box: tuple[int, int, int, int], height: int, width: int, reduced_height: int, reduced_width: int
                ) -> tuple[int, int, int, int]:
    """The crop ``box`` (``top, left, h, w`` in the ``height x width`` image) in the image libjpeg decodes at a
    reduced DCT scale (``reduced_height x reduced_width``: each side divided by the reduction, rounded up), each edge
    rounded to the nearest reduced pixel (at most half of one off)."""
    top, left, h, w = box
    ry, rx = height / reduced_height, width / reduced_width  # the reduction, or nearly (the sides are rounded up)
    reduced_top, reduced_left = min(round(top / ry), reduced_height - 1), min(round(left / rx), reduced_width - 1)
    return (reduced_top, reduced_left, max(1, min(round((top + h) / ry), reduced_height) - reduced_top),
            max(1, min(round((left + w) / rx), reduced_width) - reduced_left))


def region_box(preprocess: CropFirst, height: int, width: int) -> tuple[tuple[int, int, int, int], int]:
    """The crop box ``preprocess`` draws for a ``height x width`` JPEG the region decode takes, and the reduction it
    is decoded at (on the fast path the largest the crop allows: ``jpeg_reduction``), the box in the reduced image."""
    box = preprocess.box(height, width)
    reduction = jpeg_reduction(box[2], box[3], preprocess.needed(box[2], box[3])) if preprocess.fast else 1
    if reduction > 1:
        box = reduced_box(box, height, width, -(-height // reduction), -(-width // reduction))
    return box, reduction


def decode_crop(source: str | bytearray, preprocess: CropFirst, out: torch.Tensor | None = None) -> torch.Tensor:
    """Decode the crop ``preprocess`` chooses from an image file (a path, or its bytes: a shard's member), and
    finish it (``preprocess.finish``). With ``out`` the sample is written there.

    A JPEG the region decode takes (``data/pipeline/jpeg.py``: most of them, where the extension was built) has only its
    crop's region decoded, the same pixels as the whole decode; on the fast path (``preprocess.fast``) at the
    smallest DCT scale the crop allows (``jpeg_reduction``). Any other image has its header read with PIL, then is
    decoded whole: on the fast path a JPEG by PIL at that DCT scale (``draft``), otherwise by torchvision
    (libjpeg-turbo, libpng: about twice as fast as PIL with its conversion, and straight into a CHW tensor), and
    cropped by slicing."""
    data = read_regular(source) if isinstance(source, str) else source
    size = jpeg.region_size(data)
    if size is not None:
        box, reduction = region_box(preprocess, *size)
        return preprocess.finish(jpeg.decode_region(data, *box, reduction), out)
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        top, left, h, w = box = preprocess.box(height, width)
        reduce = preprocess.fast and image.format == "JPEG"
        reduction = jpeg_reduction(h, w, preprocess.needed(h, w)) if reduce else 1
        if reduction > 1:
            # PIL's draft takes the largest scale 1/s with s <= min(width // w', height // h'): ask for width // r.
            image.draft("RGB", (max(1, width // reduction), max(1, height // reduction)))
            rgb = image.convert("RGB")
    if reduction == 1:
        pixels = decode_image(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB)
        return preprocess.finish(pixels[:, top:top + h, left:left + w], out)
    top, left, h, w = reduced_box(box, height, width, rgb.size[1], rgb.size[0])
    pixels = torch.from_numpy(np.array(rgb.crop((left, top, left + w, top + h)))).permute(2, 0, 1)
    return preprocess.finish(pixels.contiguous(), out)


class CropFirstInput:
    """One image through a format's evaluation preprocessing (``bigbatch predict``): a file read as the evaluation
    reads it (:func:`decode_crop`), or pixels already decoded (a video frame, an array) cropped and finished."""

    def __init__(self, preprocess: CropFirst) -> None:
        self.preprocess = preprocess

    def from_file(self, path: str) -> tuple[torch.Tensor, tuple[int, int]]:
        """(the float CHW sample, the image's ``(height, width)``); a file that cannot be read or decoded raises one
        of :data:`DECODE_ERRORS`."""
        data = read_regular(path)
        size = jpeg.region_size(data)
        if size is None:
            with Image.open(io.BytesIO(data)) as image:
                size = (image.size[1], image.size[0])
        return decode_crop(data, self.preprocess), size

    def from_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        top, left, h, w = self.preprocess.box(*pixels.shape[1:])
        return self.preprocess.finish(pixels[:, top:top + h, left:left + w].contiguous())


# ----------------------------------------------------------------------------- the dataset


HUGE_PAGE_BATCH_BYTES = 32 << 20
"""From this size a batch in the training process is memory of its own in 2 MiB pages (``huge_page_tensor``).
glibc's ``malloc`` gives any block of at least 32 MiB (its largest dynamic mmap threshold on 64-bit) fresh pages
from the kernel each time, and writing a batch into 4 KiB fresh pages costs a fault each: 0.37 ms an image for 32
images at 299 px (8,400 faults a batch), against 0.08 ms in huge pages and 0.03 ms in reused memory
(``docs/benchmarks.md``). A smaller batch is reused heap memory after the first few."""


def huge_page_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor over an anonymous memory map the kernel is asked to back with transparent huge pages
    (``MADV_HUGEPAGE``: where THP is ``madvise`` or ``always``, as on most Linux systems; elsewhere it is ordinary
    memory). The map is freed with the tensor's last view."""
    nbytes = math.prod(shape) * dtype.itemsize
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pages.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(pages, dtype=dtype).view(shape)


def batch_tensor(size: int, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised ``(size, *like.shape)`` tensor of ``like``'s dtype; in a DataLoader worker in shared memory
    (what torch's ``default_collate`` does there; in the loader's batch slabs where it has them), so the batch
    crosses to the training process without a copy; in the training process, from ``HUGE_PAGE_BATCH_BYTES``, in
    huge pages."""
    shape = (size, *like.shape)
    if get_worker_info() is None:
        large = math.prod(shape) * like.dtype.itemsize >= HUGE_PAGE_BATCH_BYTES
        if large and hasattr(mmap, "MADV_HUGEPAGE"):
            return huge_page_tensor(shape, like.dtype)
        return torch.empty(shape, dtype=like.dtype)
    return shared_batch_tensor(shape, like.dtype)


_SAMPLE_THREADS: dict[int, ThreadPoolExecutor] = {}


def sample_threads(count: int) -> ThreadPoolExecutor:
    """The process's ``count`` threads for a batch's samples (made once), each with one torch thread."""
    pool = _SAMPLE_THREADS.get(count)
    if pool is None:
        pool = _SAMPLE_THREADS[count] = ThreadPoolExecutor(count, "bigbatch-samples", initializer=torch.set_num_threads,
                                                          initargs=(1,))
    return pool


Batch = tuple[torch.Tensor, torch.Tensor, list[tuple[str, str]]]
"""``(images, labels, problems)``: a collated batch of ``EncodedImages``."""

STAND_IN = -100
"""The label of an image that stands in for an unreadable one in a validation set (``EncodedImages.scored``): torch's
``cross_entropy`` ignores it by default, and ``ClassificationTask.evaluate`` leaves it out."""

DECODE_ERRORS = (OSError, ValueError, SyntaxError, RuntimeError, Image.DecompressionBombError)
"""What PIL and torchvision raise for a file that is not a readable image."""


class EncodedImages(Dataset, ABC):
    """Encoded images with labels, decoded through a ``CropFirst`` preprocessing; a subclass says where sample
    ``i``'s bytes are (``source``), its ``label`` and how to name it in a message (``where``, ``origin``).

    A key is an index or ``(index, sample_seed)``; with a seed the preprocessing draws from torch's RNG seeded
    with it, in a forked RNG (the global one is left as it was). A sample is ``(image, label, problems)``,
    ``problems`` being the ``(where, message)`` of each unreadable image it stands in for (a DataLoader worker's
    findings reach the training process through it, ``DataIssues.absorb``). An unreadable image is reported once
    and replaced by the next readable one (wrapping around)."""

    augments = True
    """Keys carry a per-sample seed (``ClassificationTask.sample_keys``)."""

    def __init__(self, preprocess: CropFirst, issues: DataIssues, name: str = "the set", scored: bool = False) -> None:
        """``scored``: a validation set, whose stand-ins carry the label :data:`STAND_IN` instead of their own, so
        that the evaluation leaves them out (each image is scored once, an unreadable one not at all); a training
        set's stand-ins train with their own labels."""
        self.preprocess, self.issues, self.scored = preprocess, issues, scored
        self.name = name  # the set in a message: "the training set /data/train"
        self._unreadable: set[int] = set()
        self._first_unreadable: tuple[str, str] | None = None  # (where, problem) of the first image found unreadable

    @abstractmethod
    def source(self, index: int) -> str | bytearray:
        """The encoded image: a file's path, or its bytes."""

    @abstractmethod
    def label(self, index: int) -> int:
        """The image's class."""

    @abstractmethod
    def where(self, index: int) -> str:
        """The image's name in a message (a path)."""

    def origin(self, index: int) -> str:
        """More about where the image came from, for a message ("" when ``where`` says it all)."""
        return ""

    def __getitem__(self, key: int | tuple[int, int], out: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, int, list[tuple[str, str]]]:
        index, seed = key if isinstance(key, tuple) else (key, None)
        return self._sample(int(index), out, seed)

    def __getitems__(self, keys: Sequence[int | tuple[int, int]]) -> Batch:
        """A batch, collated as :meth:`collate` collates one (the same values): each sample is finished straight
        into its slot of one batch tensor (in shared memory in a DataLoader worker, as torch's own collate puts
        it), instead of into a tensor of its own that a stack then copies; the first sample gives the shape.

        Made at 0 workers with several torch threads in the process (``loader.batch_threads``), the samples after
        the first are spread over that many threads (:meth:`_threaded_rest`): the same values."""
        images: torch.Tensor | None = None
        labels, problems = [], []
        threads = batch_threads() if hasattr(self.preprocess, "planned_finish") else 1
        for n, key in enumerate(keys):
            if n == 1 and threads > 1 and get_worker_info() is None:
                self._threaded_rest(keys, images, labels, problems, threads)
                break
            image, label, found = self.__getitem__(key, None if images is None else images[n])
            if images is None:
                images = batch_tensor(len(keys), image)
                images[0].copy_(image)
            labels.append(label)
            problems += found
        if images is None:
            raise ValueError("an empty batch")
        return images, torch.tensor(labels), problems

    def _threaded_rest(self, keys: Sequence[int | tuple[int, int]], images: torch.Tensor, labels: list[int],
                       problems: list[tuple[str, str]], threads: int) -> None:
        """Samples 1, 2, ... of a batch into ``images``, their labels and problems appended, over ``threads`` threads.

        This thread makes every random draw, in the samples' order, as one by one (each sample's crop box, then its
        finish's: ``CropFirst.planned_finish``); the threads do the work, which draws nothing: the region decode and
        the finish, each with one torch thread. A sample that is not a JPEG the region decode takes, or whose decode
        fails, is made again here one by one (from its seed: the same draws), as the whole batch would be."""
        plans = [self._plan(key) for key in keys[1:]]

        def work(n: int) -> bool:
            plan = plans[n - 1]
            if plan is None:
                return False
            data, box, reduction, finish = plan
            try:
                finish(jpeg.decode_region(data, *box, reduction), images[n])
            except DECODE_ERRORS:
                return False
            return True

        done = list(sample_threads(threads).map(work, range(1, len(keys))))
        for n, made in enumerate(done, start=1):
            if made:
                labels.append(self.label(self._index(keys[n])))
                continue
            _, label, found = self.__getitem__(keys[n], images[n])
            labels.append(label)
            problems += found

    @staticmethod
    def _index(key: int | tuple[int, int]) -> int:
        return int(key[0] if isinstance(key, tuple) else key)

    def _plan(self, key: int | tuple[int, int]) -> tuple[bytearray, tuple[int, int, int, int], int, Any] | None:
        """``(bytes, box, reduction, finish)`` of a sample, its draws made; None where it is made one by one."""
        index, seed = key if isinstance(key, tuple) else (key, None)
        index = int(index)
        if index in self._unreadable:
            return None
        with sample_rng(seed) if seed is not None else contextlib.nullcontext():
            try:
                source = self.source(index)
                data = read_regular(source) if isinstance(source, str) else source
                size = jpeg.region_size(data)
            except DECODE_ERRORS:
                return None
            if size is None:
                return None
            box, reduction = region_box(self.preprocess, *size)
            return data, box, reduction, self.preprocess.planned_finish()

    def _sample(self, index: int, out: torch.Tensor | None = None, seed: int | None = None
                ) -> tuple[torch.Tensor, int, list[tuple[str, str]]]:
        """The image at ``index``, or the next readable one (wrapping around); the unreadable ones passed over are
        reported once it is found. None readable: one error naming the set (``problems.none_readable``).

        With a ``seed``, each image tried draws its crop from the seed afresh (``sample_rng``): a stand-in's draws do
        not depend on whether this process had already found the unreadable image (and skipped it without a draw)
        or tried it now (a draw, then the failed decode), so a resumed run, or another number of workers, each
        with its own record of unreadable images, makes the same sample."""
        count, found = len(self), []
        for i in itertools.chain(range(index, count), range(index)):
            if i in self._unreadable:
                continue
            try:
                with sample_rng(seed) if seed is not None else contextlib.nullcontext():
                    image = decode_crop(self.source(i), self.preprocess, out)
            except DECODE_ERRORS as error:
                problem = f"unreadable image ({error_reason(error)}{self.origin(i)})"
            else:
                self.issues.replaced(found)
                return image, STAND_IN if self.scored and i != index else self.label(i), found
            self._unreadable.add(i)
            self._first_unreadable = self._first_unreadable or (self.where(i), problem)
            found.append((self.where(i), f"{problem}; the next readable sample is used instead"))
        raise none_readable(self.name, count, *(self._first_unreadable or ("-", "no image")))

    @staticmethod
    def collate(batch: Batch | Sequence[tuple[torch.Tensor, int, list[tuple[str, str]]]]) -> Batch:
        """``(images, labels, problems)``: a task reads images and labels, and counts the problems. A batch from
        :meth:`__getitems__` is that already; a list of samples is stacked."""
        if isinstance(batch, tuple):
            return batch
        return (torch.stack([image for image, _, _ in batch]), torch.tensor([label for _, label, _ in batch]),
                [problem for _, _, problems in batch for problem in problems])


@dataclass
class Preprocessing:
    """The training and evaluation ``CropFirst`` of ``data.preprocessing`` at ``data.size``."""

    train: CropFirst
    eval: CropFirst


def preprocessing(data: DataConfig) -> Preprocessing:
    from bigbatch.data.transforms import crops

    fast = data.decode == "fast"
    if data.preprocessing == "inception":
        return Preprocessing(crops.InceptionTrainCrop(data.size, fast), crops.InceptionEvalCrop(data.size, fast))
    if data.preprocessing == "darknet":
        from bigbatch.data.transforms.darknet_augment import DarknetEvalCrop, DarknetTrainCrop

        return Preprocessing(DarknetTrainCrop(data.size, data.darknet, fast), DarknetEvalCrop(data.size, fast))
    return Preprocessing(crops.StandardTrainCrop(data.size, data.standard, fast),
                         crops.StandardEvalCrop(data.size, data.standard.crop_pct, fast))


def image_input(cfg: RunConfig) -> CropFirstInput:
    """``DATASETS``' ``image_input`` for ``folder`` and ``shards``: their evaluation preprocessing."""
    return CropFirstInput(preprocessing(cfg.data).eval)


