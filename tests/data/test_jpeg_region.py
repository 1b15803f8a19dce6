"""The region-of-interest JPEG decode (``bigbatch/data/pipeline/jpeg.py``, ``csrc/jpeg_region.c``): a crop's region
decoded alone gives the whole decode's pixels (torchvision's ``decode_jpeg``, cropped) bit for bit, on every JPEG
layout it takes and crops at every edge; at a reduced DCT scale, PIL's ``draft`` decode's pixels; a file cut short fails
whatever the crop, as the whole decode does; layouts it does not take, and other images, are decoded whole."""

from __future__ import annotations

import io
import random
import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_jpeg

from bigbatch.data.formats.encoded_images import decode_crop
from bigbatch.data.pipeline import jpeg
from bigbatch.data.transforms.crops import InceptionTrainCrop, StandardTrainCrop

needs_extension = pytest.mark.skipif(not jpeg.available(), reason="the region decode extension is not built here")

LAYOUTS = {
    "4:4:4": {"subsampling": 0},
    "4:2:2": {"subsampling": 1},
    "4:2:0": {"subsampling": 2},
    "greyscale": {"mode": "L"},
    "progressive 4:2:0": {"subsampling": 2, "progressive": True},
    "progressive 4:2:2": {"subsampling": 1, "progressive": True},
    "restart markers 4:2:0": {"subsampling": 2, "restart_marker_blocks": 3},
    "optimised 4:4:4": {"subsampling": 0, "optimize": True},
}


def encoded(layout: dict, size: tuple[int, int] = (301, 213), photo: str = "china.jpg") -> bytearray:
    """A photograph cut to ``size`` (width, height: not a multiple of the 16-pixel iMCU, so the last ones are
    partial), encoded as ``layout`` says."""
    from sklearn.datasets import load_sample_image

    options = dict(layout)
    image = Image.fromarray(load_sample_image(photo)).crop((37, 29, 37 + size[0], 29 + size[1]))
    image = image.convert(options.pop("mode", "RGB"))
    out = io.BytesIO()
    image.save(out, "JPEG", quality=90, **options)
    return bytearray(out.getvalue())


def whole(data: bytearray) -> torch.Tensor:
    return decode_jpeg(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB)


def edge_crops(height: int, width: int, count: int, seed: int) -> list[tuple[int, int, int, int]]:
    """Crops touching every edge and corner, single rows, columns and pixels, the whole image, and random ones."""
    crops = [(0, 0, height, width), (0, 0, 1, 1), (height - 1, width - 1, 1, 1), (0, width - 1, height, 1),
             (height - 1, 0, 1, width), (0, 0, 17, 33), (height - 17, width - 33, 17, 33),
             (1, 1, height - 2, width - 2), (15, 15, 2, 2), (16, 16, 16, 16), (7, 8, 9, 10)]
    rng = random.Random(seed)
    for _ in range(count):
        top, left = rng.randrange(height), rng.randrange(width)
        crop = [top, left, rng.randint(1, height - top), rng.randint(1, width - left)]
        if rng.random() < 0.25:  # to the bottom or the right edge
            crop[2] = height - top
        if rng.random() < 0.25:
            crop[3] = width - left
        crops.append(tuple(crop))
    return crops


@needs_extension
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_region_is_the_whole_decode_cropped_bit_for_bit(layout):
    data = encoded(LAYOUTS[layout])
    reference = whole(data)
    height, width = reference.shape[1:]
    assert jpeg.region_size(data) == (height, width)
    for top, left, h, w in edge_crops(height, width, 60, seed=len(layout)):
        region = jpeg.decode_region(data, top, left, h, w)
        assert region.shape == (3, h, w) and region.dtype == torch.uint8
        assert torch.equal(region, reference[:, top:top + h, left:left + w]), (layout, top, left, h, w)


@needs_extension
@pytest.mark.parametrize("layout", ["4:4:4", "4:2:0", "greyscale", "progressive 4:2:2"])
@pytest.mark.parametrize("reduction", [2, 4, 8])
def test_a_reduced_region_is_pils_reduced_decode_cropped(layout, reduction):
    """At 1/2, 1/4, 1/8 (the fast path's DCT scaling) the region is PIL's ``draft`` decode at that scale, cropped."""
    data = encoded(LAYOUTS[layout], size=(640 - 37, 427 - 29))
    with Image.open(io.BytesIO(data)) as image:
        width, height = image.size
        image.draft("RGB", (width // reduction, height // reduction))
        reference = torch.from_numpy(np.array(image.convert("RGB"))).permute(2, 0, 1)
    assert reference.shape[1:] == (-(-height // reduction), -(-width // reduction))
    for top, left, h, w in edge_crops(*reference.shape[1:], 10, seed=reduction):
        assert torch.equal(jpeg.decode_region(data, top, left, h, w, reduction),
                           reference[:, top:top + h, left:left + w]), (layout, reduction, top, left, h, w)


@needs_extension
def test_a_file_cut_short_fails_whatever_the_crop_as_the_whole_decode_does():
    data = encoded(LAYOUTS["4:2:0"])
    height, width = whole(data).shape[1:]
    top_crop, bottom_crop = (0, 0, 16, 16), (height - 16, width - 16, 16, 16)
    for cut in (len(data) // 2, len(data) - 200, len(data) - 2, len(data) - 1):
        short = data[:cut]
        with pytest.raises(RuntimeError):
            whole(short)
        for crop in (top_crop, bottom_crop):
            with pytest.raises(ValueError, match="incomplete or truncated"):
                jpeg.decode_region(short, *crop)
    # Bytes after the end-of-image marker (some cameras pad files) are not a cut: both decode it.
    padded = data + bytearray(64)
    assert torch.equal(jpeg.decode_region(padded, *bottom_crop), whole(padded)[:, height - 16:, width - 16:])


@needs_extension
def test_bad_files_and_regions_are_value_errors():
    data = encoded(LAYOUTS["4:2:0"])
    height, width = jpeg.region_size(data)
    with pytest.raises(ValueError):
        jpeg.region_size(bytearray(b"\xff\xd8\xff\xe0" + bytes(40)))  # a JPEG start, then nothing readable
    for top, left, h, w in ((height, 0, 1, 1), (0, width, 1, 1), (0, 0, height + 1, 1), (0, 0, 1, width + 1),
                            (height - 1, 0, 2, 1), (0, 0, 0, 1)):
        with pytest.raises(ValueError, match="not inside"):
            jpeg.decode_region(data, top, left, h, w)
    with pytest.raises(ValueError, match="reduction 3"):
        jpeg.decode_region(data, 0, 0, 1, 1, 3)
    with pytest.raises(ValueError, match="not inside a JPEG"):
        jpeg.decode_region(data, 0, 0, 65535, 65535)
    assert jpeg.region_size(bytearray(b"\x89PNG\r\n\x1a\n" + bytes(40))) is None  # not a JPEG: decoded whole


@needs_extension
def test_more_pixels_than_pil_takes_is_refused_as_pil_refuses_it(monkeypatch):
    data = encoded(LAYOUTS["4:2:0"])
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(Image.DecompressionBombError):
        jpeg.region_size(data)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert jpeg.region_size(data) is not None


@needs_extension
def test_cmyk_is_decoded_whole_and_gives_the_same_sample(tmp_path):
    """A layout the region decode does not take (CMYK) falls back to torchvision's whole decode; a sample from a
    path and from its bytes is the same."""
    data = encoded({"mode": "CMYK"})
    assert jpeg.region_size(data) is None
    path = tmp_path / "cmyk.jpg"
    path.write_bytes(data)
    samples = []
    for source in (str(path), bytearray(data)):
        torch.manual_seed(3)
        samples.append(decode_crop(source, StandardTrainCrop(64)))
    assert torch.equal(*samples)


@needs_extension
@pytest.mark.parametrize("fast", [False, True])
def test_decode_crop_gives_the_sample_of_the_whole_decode(fast, monkeypatch):
    """A training sample is the same with the region decode and without it (the extension taken away): on the exact
    path bit for bit; on the fast path too, since the reduced region is PIL's reduced decode cropped."""
    data = encoded(LAYOUTS["4:2:0"], size=(640 - 37, 427 - 29))
    crops = {"inception": InceptionTrainCrop(96, fast=fast), "standard": StandardTrainCrop(96, fast=fast)}
    for name, crop in crops.items():
        samples = []
        for module in (jpeg._jpeg_region, None):
            monkeypatch.setattr(jpeg, "_jpeg_region", module)
            torch.manual_seed(11)
            samples.append(torch.stack([decode_crop(bytearray(data), crop) for _ in range(8)]))
        assert torch.equal(*samples), name


def test_the_extension_is_built_where_it_can_be():
    """Where a C compiler and libjpeg's header are at hand (as on the project's machines) the install built the
    extension: a failed build would otherwise only show as a skipped test file."""
    include = Path(sysconfig.get_paths()["include"])
    if not (Path("/usr/include/jpeglib.h").is_file() and shutil.which("cc") and (include / "Python.h").is_file()):
        pytest.skip("no C compiler, jpeglib.h or Python.h here")
    assert jpeg.available()


@needs_extension
def test_damaged_files_decode_or_raise_a_value_error():
    """Hostile input: 300 JPEGs with bytes changed, cut out or put in (of three layouts), each with crops at every
    scale: each decodes or raises ``ValueError``, never anything else and never a crash (a crash would take the
    test process down). A longer run of the same (4,000 files, 2026-12-04) found none either."""
    bases = [encoded(LAYOUTS[name], size=(160, 120)) for name in ("4:2:0", "progressive 4:2:2",
                                                                 "restart markers 4:2:0")]
    rng, decoded, refused = random.Random(0), 0, 0
    for _ in range(300):
        data = bytearray(rng.choice(bases))
        for _ in range(rng.randint(1, 8)):
            at, op = rng.randrange(len(data)), rng.random()
            if op < 0.6:
                data[at] = rng.randrange(256)
            elif op < 0.8:
                del data[at:at + rng.randint(1, 50)]
            else:
                data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 20)))
        try:
            size = jpeg.region_size(data)
            if size is None:
                continue
            for reduction in (1, 2, 4, 8):
                height, width = -(-size[0] // reduction), -(-size[1] // reduction)
                top, left = rng.randrange(height), rng.randrange(width)
                jpeg.decode_region(data, top, left, rng.randint(1, height - top), rng.randint(1, width - left),
                                   reduction)
            decoded += 1
        except ValueError:
            refused += 1
    assert decoded > 50 and refused > 50  # both kinds were exercised
