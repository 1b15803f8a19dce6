"""``data.preprocessing: darknet``'s evaluation crop (``DarknetEvalCrop``) keeps the pixels Darknet's
``validate_classifier_single`` keeps: ``resize_min`` then ``crop_image(resized, (resized.w - net.w)/2, (resized.h -
net.h)/2, ...)``, C's integer division (truncated), on real image files."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image

from bigbatch.data.formats.encoded_images import decode_crop
from bigbatch.data.transforms.darknet_augment import DarknetEvalCrop

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("width", "height"), [(303, 224), (224, 303), (225, 224), (227, 224)])
def test_the_centre_is_at_darknets_truncated_offset(tmp_path, width, height):
    """A lossless image whose red is the column and green the row (the shorter side is already 224, so the resize
    keeps the pixels): the first column (row) kept is ``(W - 224) // 2``, 39 for 303, where rounding keeps 40."""
    columns = np.broadcast_to(np.arange(width) % 256, (height, width))
    rows = np.broadcast_to((np.arange(height) % 256)[:, None], (height, width))
    pixels = np.stack([columns, rows, np.zeros_like(columns)], axis=-1).astype(np.uint8)
    path = tmp_path / "index.png"
    Image.fromarray(pixels).save(path)

    image = decode_crop(str(path), DarknetEvalCrop(224))
    assert image.shape == (3, 224, 224)
    index = (image * 255).round().to(torch.int64)
    left, top = (width - 224) // 2, (height - 224) // 2
    assert index[0, 0, 0] == left and index[1, 0, 0] == top
    assert torch.equal(index[:2], torch.from_numpy(pixels[top:top + 224, left:left + 224, :2]).permute(2, 0, 1))


def test_a_jpeg_keeps_darknets_window_of_its_decoded_pixels(tmp_path):
    """A real JPEG of 163 x 64 at size 64: the window from column (163 - 64) // 2 = 49 of the whole decode (rounding
    would start at 50)."""
    pixels = np.random.default_rng(0).integers(0, 256, (64, 163, 3), dtype=np.uint8)
    path = tmp_path / "a.jpg"
    Image.fromarray(pixels).save(path, quality=95)
    whole = decode_image(torch.from_numpy(np.fromfile(path, np.uint8)), mode=ImageReadMode.RGB)

    image = decode_crop(str(path), DarknetEvalCrop(64))
    assert torch.equal((image * 255).round().to(torch.uint8), whole[:, :, 49:113])
