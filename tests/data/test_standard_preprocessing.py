"""``data.preprocessing: standard`` with the keys of ``data.standard`` (timm's ``train.py`` flags): the crop follows
torchvision's ``RandomResizedCrop`` at the given scale and ratio, the rest torchvision's v2 ops; evaluation timm's
``crop_pct`` rule; a bad value is one line naming the key."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from bigbatch.config import load_config
from bigbatch.data.formats.encoded_images import decode_crop
from bigbatch.data.pipeline.order import sample_rng
from bigbatch.data.transforms.crops import StandardAugment, StandardEvalCrop, StandardTrainCrop
from bigbatch.data.transforms.standard import IMAGENET_MEAN, IMAGENET_STD
from bigbatch.errors import UserError

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def photo_png(tmp_path_factory) -> str:
    """A real photograph's 150 x 200 crop, losslessly stored (decoded whole: no JPEG reduction)."""
    from sklearn.datasets import load_sample_image

    path = tmp_path_factory.mktemp("standard") / "china.png"
    Image.fromarray(load_sample_image("china.jpg")[100:250, 200:400]).save(path)
    return str(path)


def normalised(image: torch.Tensor) -> torch.Tensor:
    return v2.Normalize(IMAGENET_MEAN, IMAGENET_STD)(v2.ToDtype(torch.float32, scale=True)(image))


def test_a_whole_image_crop_is_torchvisions_resize_and_flip(photo_png):
    """scale [1, 1] at the image's own aspect: the crop is the whole image; then a bilinear antialiased resize,
    a flip (hflip 1), ImageNet's normalisation, as a torchvision v2 pipeline computes them."""
    from torchvision.io import decode_image

    augment = StandardAugment(scale=[1.0, 1.0], ratio=[200 / 150, 200 / 150], hflip=1.0)
    out = decode_crop(photo_png, StandardTrainCrop(48, augment))
    image = decode_image(photo_png)
    expected = normalised(v2.RandomHorizontalFlip(1.0)(v2.Resize([48, 48], antialias=True)(image)))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    unflipped = decode_crop(photo_png, StandardTrainCrop(48, augment.model_copy(update={"hflip": 0.0})))
    torch.testing.assert_close(unflipped, expected.flip(-1), rtol=0, atol=0)


def test_crops_follow_the_scale_and_ratio():
    """Over 2,000 draws the crop's area fraction is uniform in scale and its aspect log-uniform in ratio (the
    rule of torchvision's and timm's RandomResizedCrop), up to rounding to whole pixels."""
    crop = StandardTrainCrop(32, StandardAugment(scale=[0.25, 0.5], ratio=[0.8, 1.25]))
    areas, aspects = [], []
    with sample_rng(0):
        for _ in range(2000):
            top, left, h, w = crop.box(400, 400)
            assert 0 <= top <= 400 - h and 0 <= left <= 400 - w
            areas.append(h * w / 400**2)
            aspects.append(math.log(w / h))
    areas_t, aspects_t = torch.tensor(areas), torch.tensor(aspects)
    assert areas_t.min() > 0.24 and areas_t.max() < 0.51
    assert abs(areas_t.mean().item() - 0.375) < 0.01  # uniform in [0.25, 0.5]
    assert aspects_t.min() > math.log(0.8) - 0.02 and aspects_t.max() < math.log(1.25) + 0.02
    assert abs(aspects_t.mean().item()) < 0.01  # log-uniform, symmetric about 1


def test_colour_jitter_and_random_interpolation(photo_png):
    """color_jitter > 0 changes the pixels; ``random`` interpolation resizes each image bilinearly or bicubically,
    both over enough draws."""
    whole = dict(scale=[1.0, 1.0], ratio=[200 / 150, 200 / 150], hflip=0.0)
    plain = decode_crop(photo_png, StandardTrainCrop(48, StandardAugment(**whole)))
    with sample_rng(1):
        jittered = decode_crop(photo_png, StandardTrainCrop(48, StandardAugment(**whole, color_jitter=0.4)))
    assert not torch.equal(plain, jittered)
    bicubic = decode_crop(photo_png, StandardTrainCrop(48, StandardAugment(**whole, interpolation="bicubic")))
    assert not torch.equal(plain, bicubic)
    random_crop = StandardTrainCrop(48, StandardAugment(**whole, interpolation="random"))
    seen = set()
    for seed in range(12):
        with sample_rng(seed):
            out = decode_crop(photo_png, random_crop)
        seen.add("bilinear" if torch.equal(out, plain) else "bicubic" if torch.equal(out, bicubic) else "other")
    assert seen == {"bilinear", "bicubic"}


@pytest.mark.parametrize("crop_pct", [0.875, 0.9, 0.95, 1.0])
def test_evaluation_resizes_as_timm_does(photo_png, crop_pct):
    """The shorter side goes to timm's scale size for crop_pct (its eval transform's Resize), the centre is kept."""
    from timm.data import create_transform

    timm_resize = create_transform((3, 64, 64), is_training=False, crop_pct=crop_pct).transforms[0]
    size = timm_resize.size if isinstance(timm_resize.size, int) else timm_resize.size[0]
    crop = StandardEvalCrop(64, crop_pct)
    assert crop.resized == size
    assert decode_crop(photo_png, crop).shape == (3, 64, 64)


def test_the_keys_are_checked_naming_the_key():
    cfg = load_config("digits", ["data.name=folder", "data.path=x", "data.preprocessing=standard",
                                 "data.standard.scale=[0.1, 1]", "data.standard.color_jitter=0.4"])
    assert cfg.data.standard.scale == [0.1, 1.0] and cfg.data.standard.color_jitter == 0.4
    for setting, message in [("data.standard.scale=[0.5, 0.2]", r"^data\.standard\.scale: expected \[low, high\]"),
                             ("data.standard.scale=[0.5]", r"^data\.standard\.scale"),
                             ("data.standard.hflip=2", r"^data\.standard\.hflip"),
                             ("data.standard.interpolation=nearest", r"^data\.standard\.interpolation")]:
        with pytest.raises(UserError, match=message):
            load_config("digits", ["data.name=folder", "data.path=x", "data.preprocessing=standard", setting])
