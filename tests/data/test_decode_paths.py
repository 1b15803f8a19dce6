"""``data.decode``: ``exact`` is TF's arithmetic on the whole decoded image, bit for bit; ``fast`` (reduced DCT
decode, the resize on uint8 pixels) takes the same random draws and stays within the stated difference of it."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image
from torchvision.io import decode_image

from bigbatch.config import load_config
from bigbatch.data.formats.encoded_images import decode_crop, preprocessing
from bigbatch.data.transforms.crops import InceptionEvalCrop, InceptionTrainCrop
from bigbatch.data.transforms.inception import InceptionEval, InceptionTrain
from bigbatch.data.transforms.tf1_ops import fast_resize_bilinear
from bigbatch.errors import UserError

LIMITS = {False: (0.05, 0.75), True: (0.1, 1.5)}
"""docs/data.md's stated bounds on |fast - exact| (output scale [-1, 1]), the mean over a sample's values and the
largest, for samples decoded whole (False: only the resize differs) and decoded at a reduced DCT scale (True)."""


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> list[str]:
    """scikit-learn's two photographs (427 x 640) as JPEGs, as they are and enlarged 3x (1281 x 1920)."""
    from sklearn.datasets import load_sample_image

    root, paths = tmp_path_factory.mktemp("photos"), []
    for scale in (1, 3):
        for name in ("china.jpg", "flower.jpg"):
            photo = Image.fromarray(load_sample_image(name))
            photo = photo.resize((photo.width * scale, photo.height * scale), Image.Resampling.BICUBIC)
            path = root / f"{scale}-{name}"
            photo.save(path, quality=90)
            paths.append(str(path))
    return paths


def test_exact_is_the_inception_transform_on_the_whole_decoded_image(photos):
    for seed, path in enumerate(photos):
        torch.manual_seed(seed)
        ours = decode_crop(path, InceptionTrainCrop(299, fast=False))
        torch.manual_seed(seed)
        reference = InceptionTrain(299)(decode_image(path))
        assert torch.equal(ours, reference), path
        assert torch.equal(decode_crop(path, InceptionEvalCrop(299)), InceptionEval(299)(decode_image(path)))


def test_fast_takes_the_same_draws_and_stays_within_the_stated_difference(photos, monkeypatch):
    import bigbatch.data.formats.encoded_images as encoded

    original, reductions = encoded.jpeg_reduction, []
    monkeypatch.setattr(encoded, "jpeg_reduction", lambda *a: reductions.append(original(*a)) or reductions[-1])
    diffs: dict[bool, list[torch.Tensor]] = {False: [], True: []}
    for path in photos:
        for seed in range(6):
            outputs, after = [], []
            for fast in (False, True):
                torch.manual_seed(seed)
                reductions.clear()
                outputs.append(decode_crop(path, InceptionTrainCrop(299, fast=fast)))
                after.append(torch.rand(4))  # the generator's state after the sample
            exact, fast = outputs
            assert torch.equal(after[0], after[1])  # the same number of draws: the same box, flip and colours
            assert fast.shape == exact.shape == (3, 299, 299) and fast.dtype == torch.float32
            assert fast.is_contiguous()
            diffs[max(reductions) > 1].append((fast - exact).abs())
        reductions.clear()
        fast = decode_crop(path, InceptionEvalCrop(299, fast=True))
        diffs[max(reductions) > 1].append((fast - decode_crop(path, InceptionEvalCrop(299))).abs())
    assert diffs[False] and diffs[True]  # the photos give both kinds of sample
    for reduced, (mean_limit, max_limit) in LIMITS.items():
        means, largest = [d.mean().item() for d in diffs[reduced]], max(d.max().item() for d in diffs[reduced])
        assert max(means) < mean_limit and largest < max_limit, (reduced, max(means), largest)
        assert min(means) > 0  # the paths do differ: the fast path is not the exact one under another name


def test_the_fast_resize_follows_torchs_half_pixel_bilinear_and_flips_exactly():
    image = torch.randint(0, 256, (3, 37, 53), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    out = fast_resize_bilinear(image, (20, 31))
    reference = torch.nn.functional.interpolate(image[None].float(), size=(20, 31), mode="bilinear",
                                                align_corners=False)[0]
    assert out.dtype == torch.uint8 and out.shape == (3, 20, 31)
    assert (out.float() - reference).abs().max() <= 1.0  # uint8 rounding of the float result
    assert torch.equal(fast_resize_bilinear(image, (20, 31), flip=True), out.flip(-1))


def test_the_key_defaults_to_exact_and_reaches_the_preprocessing(tmp_path):
    cfg = load_config("digits", ["data.name=folder", f"data.path={tmp_path}"])
    assert cfg.data.decode == "exact"
    for name in ("inception", "standard", "darknet"):
        for decode, fast in (("exact", False), ("fast", True)):
            chosen = preprocessing(load_config("digits", ["data.name=folder", f"data.path={tmp_path}",
                                                          f"data.preprocessing={name}", f"data.decode={decode}"]).data)
            assert chosen.train.fast is fast and chosen.eval.fast is fast
    with pytest.raises(UserError, match="data.decode"):
        load_config("digits", ["data.name=folder", f"data.path={tmp_path}", "data.decode=quick"])


def test_fast_decodes_a_large_jpeg_reduced_and_exact_never_does(photos, monkeypatch):
    import bigbatch.data.formats.encoded_images as encoded

    large = photos[2]  # 1281 x 1920: a crop of a tenth of it still holds two 299 px outputs per side, often
    reductions = []
    original = encoded.jpeg_reduction
    monkeypatch.setattr(encoded, "jpeg_reduction", lambda *a: reductions.append(original(*a)) or reductions[-1])
    for seed in range(8):
        torch.manual_seed(seed)
        decode_crop(large, InceptionTrainCrop(299, fast=True))
    assert max(reductions) > 1
    reductions.clear()
    for seed in range(8):
        torch.manual_seed(seed)
        decode_crop(large, InceptionTrainCrop(299, fast=False))
    assert reductions == []  # never asked: the exact path decodes whole
    with Image.open(io.BytesIO(open(large, "rb").read())) as image:
        assert image.size == (1920, 1281)


@pytest.mark.parametrize("fast", [False, True])
def test_a_batch_written_in_place_equals_the_stacked_samples(photos, fast):
    from torch.utils.data import DataLoader

    from bigbatch.data.formats.encoded_images import EncodedImages
    from bigbatch.data.formats.folder import FolderImages
    from bigbatch.data.pipeline.problems import DataIssues

    dataset = FolderImages([(path, n) for n, path in enumerate(photos)], InceptionTrainCrop(64, fast=fast),
                           DataIssues())
    keys = [(n % len(photos), 1000 + n) for n in range(6)]
    stacked = EncodedImages.collate([dataset[key] for key in keys])
    for workers in (0, 1):
        loader = DataLoader(dataset, batch_sampler=[keys], num_workers=workers, collate_fn=dataset.collate)
        images, labels, problems = next(iter(loader))
        assert torch.equal(images, stacked[0]) and torch.equal(labels, stacked[1]) and problems == []
        assert images.is_contiguous() and images.shape == (6, 3, 64, 64)
