"""Classification from a folder of real JPEGs (``data.name: folder``): timm and torchvision models train on it,
resume bit-identically, two processes take the images one process takes, bad files are reported or stop a
strict run, and a JPEG is decoded at reduced size only as far as the crop allows."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from bigbatch.config import load_config
from bigbatch.data.formats import encoded_images
from bigbatch.data.formats.encoded_images import decode_crop, huge_page_tensor, jpeg_reduction
from bigbatch.data.formats.folder import FolderImages, find_classes, list_samples
from bigbatch.data.pipeline import jpeg
from bigbatch.data.pipeline.problems import DataIssues
from bigbatch.data.transforms.crops import InceptionTrainCrop
from bigbatch.registry import HOOKS
from tests.helpers import StopAfter, assert_same_weights, run_main, torchrun, weights, write_photo_folder

TINY = ["batch=8", "subdivisions=2", "steps=4", "data.size=32", "eval.every=2", "checkpoint.every=2",
        "log.tensorboard=false", "model.width=4", "schedule.warmup=[]"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return write_photo_folder(tmp_path_factory.mktemp("photos") / "set")


def train(out: Path, data: Path, *settings: str):
    return run_main("train", "digits", "--out", str(out), "--set", "data.name=folder", f"data.path={data}", *TINY,
                    *settings)


def test_classes_and_files_are_listed_as_torchvision_imagefolder_lists_them(photos):
    from torchvision.datasets import ImageFolder

    reference = ImageFolder(str(photos / "train"), is_valid_file=lambda p: p.lower().endswith((".jpg", ".jpeg",
                                                                                               ".png")))
    classes = find_classes(photos / "train")
    assert classes == reference.classes == ["china", "flower", "upside_down"]
    assert list_samples(photos / "train", classes) == reference.samples


@pytest.mark.parametrize("model", ["timm/resnet10t", "resnet18"])
def test_a_timm_and_a_torchvision_model_train_on_the_folder(tmp_path, photos, model):
    result = train(tmp_path / "run", photos, f"model.name={model}")
    assert result.returncode == 0, result.stderr
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == 4 and "top1" in result.stdout


@pytest.mark.parametrize("preprocessing", ["inception", "standard"])
def test_an_interrupted_run_resumes_bit_identically(tmp_path, photos, preprocessing):
    settings = [f"data.preprocessing={preprocessing}", "model.dropout=0.2"]
    reference = train(tmp_path / "reference", photos, *settings)
    assert reference.returncode == 0, reference.stderr
    HOOKS.register("stop_after_3", lambda run: StopAfter(3))
    try:  # workers in the interrupted run: a sample's augmentation depends on its seed alone
        stopped = train(tmp_path / "stopped", photos, *settings, "data.workers=2")
    finally:
        HOOKS.unregister("stop_after_3")
    assert stopped.returncode == 130
    resumed = run_main("train", "--resume", str(tmp_path / "stopped"))
    assert resumed.returncode == 0, resumed.stderr
    expected, actual = weights(tmp_path / "reference"), weights(tmp_path / "stopped")
    assert all(torch.equal(expected[k], actual[k]) for k in expected)


def test_two_processes_take_the_images_one_process_takes(tmp_path, photos):
    settings = ["data.name=folder", f"data.path={photos}", "model.norm=group", "batch=16"]
    single = run_main("train", "digits", "--out", str(tmp_path / "one"), "--set", "batch=64", "steps=3",
                      "data.size=16", "model.width=8", "log.tensorboard=false", "eval.batch=50", "schedule.warmup=[]",
                      *settings, "subdivisions=4")
    assert single.returncode == 0, single.stderr
    multi = torchrun(tmp_path / "two", *settings, "subdivisions=2")
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert_same_weights(weights(tmp_path / "one"), weights(tmp_path / "two"), atol=1e-5)


@pytest.fixture
def damaged(tmp_path, photos) -> tuple[Path, list[Path]]:
    root = tmp_path / "damaged"
    shutil.copytree(photos, root)
    truncated = root / "train" / "china" / "000.jpg"
    truncated.write_bytes(truncated.read_bytes()[:300])
    not_an_image = root / "train" / "flower" / "notes.jpg"
    not_an_image.write_text("not an image\n")
    garbled = root / "train" / "china" / "001.jpg"  # 20 bytes of 0xFF mid-scan: libjpeg warns, then fails
    data = bytearray(garbled.read_bytes())
    data[len(data) // 2:len(data) // 2 + 20] = b"\xff" * 20
    garbled.write_bytes(bytes(data))
    return root, [truncated, not_an_image, garbled]


def test_bad_files_are_reported_once_and_replaced(tmp_path, damaged):
    root, bad = damaged
    result = train(tmp_path / "run", root, "steps=6")
    assert result.returncode == 0, result.stderr
    for path in bad:
        assert result.stderr.count(f"warning: {path}: unreadable image") == 1, result.stderr
    assert "BytesIO" not in result.stderr  # PIL's in-memory file is not named: the file is
    assert "data: 3 problems in 3 files: 3 images replaced" in result.stdout


def test_a_strict_run_stops_at_the_first_bad_file_naming_it(tmp_path, damaged):
    """One line: libjpeg's own warnings ("Corrupt JPEG data: ...", which torchvision's decoder prints on stderr)
    do not print above it."""
    root, bad = damaged
    result = train(tmp_path / "run", root, "data.strict=true")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: data: {bad[0]}: "), result.stderr
    if jpeg.available():  # the region decode, silent; without it torchvision decodes, and libjpeg warns
        assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.skipif(not jpeg.available(), reason="the region decode (the C extension) was not built")
def test_decoding_a_garbled_jpeg_prints_nothing_of_libjpegs_own(damaged, capfd):
    from torchvision.io import decode_image

    from bigbatch.data.pipeline.images import decode_rgb

    garbled = str(damaged[1][2])
    with pytest.raises(RuntimeError):
        decode_image(garbled)
    assert "Corrupt JPEG data" in capfd.readouterr().err  # the file makes libjpeg warn, as torchvision calls it
    with pytest.raises(RuntimeError, match="premature end of data segment|truncated"):
        decode_rgb(garbled)
    assert capfd.readouterr().err == ""
    good = str(damaged[0] / "train" / "china" / "002.jpg")
    assert torch.equal(decode_rgb(good), decode_image(good))


class Box:
    """A preprocessing that crops a fixed box and keeps it (``CropFirst``)."""

    def __init__(self, box, needed, fast: bool = True) -> None:
        self._box, self._needed, self.fast = box, needed, fast

    def box(self, height, width):
        return self._box

    def needed(self, box_height, box_width):
        return self._needed

    def finish(self, crop, out=None):
        return crop if out is None else out.copy_(crop)


def test_a_jpeg_is_decoded_at_reduced_size_only_as_far_as_the_crop_allows(photos):
    path = str(photos / "train" / "china" / "001.jpg")
    with Image.open(path) as image:
        width, height = image.size
    full = decode_crop(path, Box((0, 0, height, width), (height, width)))
    assert full.shape == (3, height, width) and full.dtype == torch.uint8
    assert jpeg_reduction(height, width, (height // 4, width // 4)) == 4
    reduced = decode_crop(path, Box((0, 0, height, width), (height // 4, width // 4)))
    assert reduced.shape == (3, -(-height // 4), -(-width // 4))  # libjpeg's 1/4 scale rounds the sides up
    # The reduced decode is the full image's 4x4 block means, up to the DCT's own rounding.
    blocks = full[:, : height // 4 * 4, : width // 4 * 4].float()
    means = torch.nn.functional.avg_pool2d(blocks[None], 4)[0]
    assert (reduced[:, : height // 4, : width // 4].float() - means).abs().mean() < 3.0
    assert jpeg_reduction(height, width, (height, width)) == 1  # a crop as large as the output: full decode
    exact = decode_crop(path, Box((0, 0, height, width), (height // 4, width // 4), fast=False))
    assert torch.equal(exact, full)  # data.decode: exact never reduces


def test_the_recipe_trains_inception_v3_with_its_auxiliary_head_on_a_folder(tmp_path):
    cfg = load_config("inception-v3-tpu", [f"data.path={tmp_path}"])
    assert (cfg.data.name, cfg.data.size, cfg.model.aux_logits, cfg.loss.label_smoothing) == ("folder", 299, True, 0.1)
    assert (cfg.optim.weight_decay, cfg.optim.no_decay_norm_bias) == (4e-5, True)
    result = run_main("show", "inception-v3-tpu")  # planning needs no data (data.train_images); training does
    assert result.returncode == 0 and "epochs          170.00 (of 1281167 training images)" in result.stdout, \
        result.stderr
    small = run_main("show", "inception-v3-tpu", "--set", f"data.path={tmp_path}", "data.size=224")
    assert small.returncode == 2
    assert small.stderr.startswith("error: data.size: inception_v3 with model.aux_logits needs images of at least "
                                   "299 px"), small.stderr


def test_the_recipe_command_trains_on_a_folder(tmp_path):
    """``bigbatch train inception-v3-tpu --set data.path=DIR``, cut to two steps of 4 images at 299 px."""
    data = write_photo_folder(tmp_path / "set", train=2, val=1)
    result = run_main("train", "inception-v3-tpu", "--out", str(tmp_path / "run"), "--set", f"data.path={data}",
                      "batch=4", "subdivisions=2", "steps=2", "eval.every=2", "checkpoint.every=2", "eval.batch=4",
                      "log.tensorboard=false")
    assert result.returncode == 0, result.stderr
    assert torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)["step"] == 2


def test_the_loss_smooths_the_labels_of_the_main_and_the_auxiliary_logits():
    """L = CE_s(logits) + 0.4 CE_s(aux), CE_s(z, y) = -(1 - s) log p_y - (s / K) sum_k log p_k, s = 0.1."""
    from torchvision.models.inception import InceptionOutputs

    from bigbatch.tasks.classification import ClassificationTask

    logits, aux = torch.randn(2, 6, 5, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([0, 1, 2, 3, 4, 0])

    def smoothed(z: torch.Tensor) -> torch.Tensor:
        log_p = z.log_softmax(dim=1)
        return (-(0.9 * log_p[torch.arange(6), labels]) - 0.1 / 5 * log_p.sum(dim=1)).mean()

    task = ClassificationTask(None, None, 5, label_smoothing=0.1, aux_weight=0.4)
    loss = task.loss(lambda images: InceptionOutputs(logits, aux), (torch.zeros(6), labels))
    torch.testing.assert_close(loss, smoothed(logits) + 0.4 * smoothed(aux))
    torch.testing.assert_close(task.loss(lambda images: logits, (torch.zeros(6), labels)), smoothed(logits))


def test_data_bench_prints_images_per_second_per_number_of_workers(photos):
    from bigbatch.data.pipeline.bench import worker_counts

    assert worker_counts(16) == [0, 1, 2, 4, 8, 16] and worker_counts(6) == [0, 1, 2, 4, 6]
    assert worker_counts(2) == [0, 1, 2] and worker_counts(1) == [0, 1]
    result = run_main("data", "bench", "digits", "--set", "data.name=folder", f"data.path={photos}", "data.size=32",
                      "batch=8", "--images", "16")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    header = lines.index("workers   images/s  vs 0 workers")
    rows = [line.split() for line in lines[header + 1:]]
    assert [int(r[0]) for r in rows] == worker_counts(os.cpu_count() or 1)
    assert all(float(r[1]) > 0 for r in rows) and rows[0][2] == "1.00"


def test_a_batch_of_32_mib_or_more_is_in_huge_pages_and_holds_the_same_samples(photos, monkeypatch):
    """A training batch of at least ``HUGE_PAGE_BATCH_BYTES`` (40 Inception samples at 299 px: 43 MB) is written
    into a memory map of its own (transparent huge pages), and holds what the samples one by one are."""
    samples = list_samples(photos / "train", find_classes(photos / "train"))
    images = FolderImages(samples, InceptionTrainCrop(299, fast=True), DataIssues())
    keys = [(i % len(samples), 1000 + i) for i in range(40)]
    mapped = []
    monkeypatch.setattr(encoded_images, "huge_page_tensor", lambda *a: mapped.append(a) or huge_page_tensor(*a))
    batch, labels, problems = images.__getitems__(keys)
    assert mapped == [((40, 3, 299, 299), torch.float32)] and problems == []
    one_by_one = [images[key] for key in keys]
    assert torch.equal(batch, torch.stack([image for image, _, _ in one_by_one]))
    assert labels.tolist() == [label for _, label, _ in one_by_one]
    small, _, _ = images.__getitems__(keys[:4])  # 4.3 MB: ordinary (reused heap) memory
    assert len(mapped) == 1 and torch.equal(small, batch[:4])


def test_a_huge_page_tensor_is_memory_of_its_own_that_its_views_keep():
    tensor = huge_page_tensor((4, 3, 5), torch.float32)
    tensor.copy_(torch.arange(60, dtype=torch.float32).view(4, 3, 5))
    view = tensor[1:3]
    del tensor
    assert torch.equal(view.flatten(), torch.arange(15, 45, dtype=torch.float32))


@pytest.mark.parametrize("crop", ["fast", "exact", "eval", "standard", "standard-eval"])
def test_at_0_workers_a_batch_spread_over_threads_equals_one_made_one_by_one(tmp_path, monkeypatch, crop):
    """With several torch threads in the process, a batch made at 0 workers has its samples after the first decoded
    and finished in threads of its own (``sample_threads``): the same values, labels and problems as with one,
    a PNG and a truncated JPEG among them (made one by one, the truncated one replaced by the next)."""
    from bigbatch.config.data_keys import StandardAugment
    from bigbatch.data.pipeline.loader import batches_by_step
    from bigbatch.data.pipeline.order import GlobalBatchOrder
    from bigbatch.data.transforms.crops import InceptionEvalCrop, StandardEvalCrop, StandardTrainCrop

    photos = write_photo_folder(tmp_path / "set")
    paths = sorted(str(p) for p in (photos / "train").rglob("*") if p.is_file())
    data = Path(paths[5]).read_bytes()
    Path(paths[5]).write_bytes(data[:len(data) // 2])  # a JPEG cut short: its header reads, its decode fails
    samples = [(path, n % 3) for n, path in enumerate(paths)]
    assert any(p.endswith(".png") for p in paths)
    preprocess = {"fast": InceptionTrainCrop(64, fast=True), "exact": InceptionTrainCrop(64),
                  "eval": InceptionEvalCrop(64, fast=True),
                  "standard": StandardTrainCrop(64, StandardAugment(color_jitter=0.4, interpolation="random"), True),
                  "standard-eval": StandardEvalCrop(64, fast=True)}[crop]
    order = GlobalBatchOrder(len(samples), 8, seed=1)
    keys = lambda step, indices: [(index, 1000 * step + index) for index in indices]  # noqa: E731
    spread = []
    pools = encoded_images.sample_threads
    monkeypatch.setattr(encoded_images, "sample_threads", lambda count: spread.append(count) or pools(count))
    runs, before = {}, torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            dataset = FolderImages(samples, preprocess, DataIssues())
            runs[threads] = [b for step in batches_by_step(dataset, order, 0, 6, 0, 1, 1, 0, keys) for b in step]
    finally:
        torch.set_num_threads(before)
    assert spread == [2] * 6
    assert any(problems for _, _, problems in runs[1])
    for (images, labels, problems), (theirs, their_labels, their_problems) in zip(runs[1], runs[2], strict=True):
        assert torch.equal(images, theirs) and torch.equal(labels, their_labels) and problems == their_problems


def test_an_unreadable_validation_image_is_not_scored_and_its_stand_in_not_twice(tmp_path, photos):
    """A validation set scores each readable image once: the next readable image stands in for an unreadable one (a
    batch keeps its size) with the label ``STAND_IN``, and the evaluation leaves it out; the training set's stand-ins
    keep their own labels. It once scored the stand-in twice, with its own label, and said the full count."""
    from bigbatch.data.formats.encoded_images import STAND_IN
    from bigbatch.tasks.classification import ClassificationTask

    root = Path(shutil.copytree(photos, tmp_path / "set"))
    for split in ("train", "val"):
        bad = root / split / "china" / "001.jpg"
        bad.write_bytes(bad.read_bytes()[:300])
    cfg = load_config("digits", ["data.name=folder", f"data.path={root}", *TINY])
    task = ClassificationTask.from_config(cfg)
    val = task.val_set
    bad_index = next(i for i, (path, _) in enumerate(val.samples) if path.endswith("china/001.jpg"))
    assert val[bad_index][1] == STAND_IN and val[bad_index + 1][1] == val.samples[bad_index + 1][1]
    train_set = task.train_set
    bad_train = next(i for i, (path, _) in enumerate(train_set.samples) if path.endswith("china/001.jpg"))
    assert train_set[bad_train][1] == train_set.samples[bad_train + 1][1]

    class Constant(torch.nn.Module):  # says the stand-in's class for every image
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.zeros(3))

        def forward(self, x):
            return self.bias.expand(len(x), 3) + torch.nn.functional.one_hot(
                torch.full((len(x),), val.samples[bad_index + 1][1]), 3)

    metrics = task.evaluate(Constant(), batch_size=4)
    labels = [label for i, (_, label) in enumerate(val.samples) if i != bad_index]
    assert metrics["images"] == len(val.samples) - 1
    assert metrics["top1"] == pytest.approx(100 * labels.count(val.samples[bad_index + 1][1]) / len(labels))


@pytest.mark.parametrize("kind", ["truncated", "text"])
def test_a_stand_ins_crop_depends_on_its_key_alone_not_on_what_the_process_found_before(tmp_path, photos, kind):
    """The crop of the image standing in for an unreadable one is drawn from the sample's seed afresh: the same
    whether this process tries the unreadable image now (a draw, then a failed decode) or already knows it (no
    draw), so a resumed run, or a DataLoader worker with its own record, makes the same sample. It once drew the
    stand-in's crop from what the failed try had left of the RNG: resume was not bit-identical with a bad file."""
    good = sorted(str(p) for p in (photos / "train" / "china").glob("*.jpg"))[:2]
    bad = tmp_path / "bad.jpg"
    if kind == "truncated":  # the header reads (a crop is drawn), the body does not decode
        data = Path(good[0]).read_bytes()
        bad.write_bytes(data[:len(data) // 3])
    else:
        bad.write_text("not an image\n")
    samples = [(str(bad), 0), (good[0], 0), (good[1], 0)]

    def dataset() -> FolderImages:
        return FolderImages(samples, InceptionTrainCrop(48, fast=True), DataIssues())

    fresh = dataset()
    first = fresh[(0, 12345)][0]
    assert torch.equal(fresh[(0, 12345)][0], first)  # the bad image known now: no draw for it
    assert torch.equal(dataset()[(0, 12345)][0], first)  # another process (a resume, a worker)
    assert not torch.equal(fresh[(1, 999)][0], first)  # the control: another seed crops otherwise
