"""The C kernel of Darknet's HSV distortion (csrc/hsv.c) gives distort_hsv's torch result bit for bit."""

from __future__ import annotations

import pytest
import torch
from torchvision import tv_tensors

from bigbatch.data.transforms import det_transforms
from bigbatch.data.transforms.det_transforms import distort_colors, distort_hsv, train_transform

pytestmark = pytest.mark.skipif(det_transforms._hsv is None, reason="the C kernel was not built here")


def _torch_version(image: torch.Tensor, hue: float, saturation: float, exposure: float) -> torch.Tensor:
    if image.dtype == torch.uint8:
        image = image.to(torch.float32).mul_(1.0 / 255)  # v2.ToDtype(torch.float32, scale=True)
    return distort_hsv(image, hue, saturation, exposure)


def _images(seed: int) -> list[torch.Tensor]:
    """uint8 images with grey, black, white and saturated pixels and tied channels, their float32 version, and a
    float32 image of values no uint8 has."""
    generator = torch.Generator().manual_seed(seed)
    height, width = (int(v) for v in torch.randint(1, 48, (2,), generator=generator))
    pixels = torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=generator)
    pixels[:, : height // 3] = pixels[0, : height // 3]  # grey
    pixels[1, height // 3:] = pixels[0, height // 3:] if seed % 2 else pixels[2, height // 3:]  # ties
    pixels[:, :, : width // 4] = 0
    pixels[:, -1, -1] = 255
    pixels[:, 0, -1] = torch.tensor([255, 0, 0], dtype=torch.uint8)
    return [pixels, pixels.to(torch.float32) / 255, torch.rand(3, height, width, generator=generator)]


@pytest.mark.parametrize("seed", range(12))
def test_the_kernel_equals_the_torch_operations_bit_for_bit(seed: int):
    generator = torch.Generator().manual_seed(1000 + seed)
    hues = [float(torch.empty(()).uniform_(-0.5, 0.5, generator=generator)), 0.5, -0.5, 0.0, 1e-7]
    for image in _images(seed):
        for hue in hues:
            saturation = 1.0 if hue == 0.0 else float(torch.empty(()).uniform_(0.2, 3.0, generator=generator))
            exposure = float(torch.empty(()).uniform_(0.2, 3.0, generator=generator))
            expected = _torch_version(image, hue, saturation, exposure)
            got = distort_colors(image, hue, saturation, exposure)
            assert got.dtype == torch.float32 and got.shape == image.shape
            # the bits, not only the values: the kernel does the torch version's float operations in its order
            assert torch.equal(got.view(torch.int32), expected.view(torch.int32)), (seed, image.dtype, hue)


def test_what_the_kernel_does_not_take_goes_to_the_torch_operations():
    image = torch.rand(3, 9, 7)
    for hue in (0.6, -0.75):  # the kernel's remainder is exact for |hue| <= 0.5 only
        assert torch.equal(distort_colors(image, hue, 1.4, 0.9), distort_hsv(image, hue, 1.4, 0.9))
    double = image.double()
    assert distort_colors(double, 0.1, 1.4, 0.9).dtype == torch.float64
    strided = torch.rand(3, 9, 14)[:, :, ::2]  # not contiguous: copied first
    assert torch.equal(distort_colors(strided, 0.1, 1.4, 0.9), distort_hsv(strided, 0.1, 1.4, 0.9))


def test_the_kernel_refuses_buffers_of_the_wrong_size():
    kernel = det_transforms._hsv
    pixels, out = torch.zeros(3, 4, 5, dtype=torch.uint8), torch.empty(3, 4, 5)
    with pytest.raises(ValueError, match="holds 60 bytes"):
        kernel.distort(pixels.numpy(), out.numpy(), True, 4, 6, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="output holds"):
        kernel.distort(pixels.numpy(), torch.empty(3, 4, 4).numpy(), True, 4, 5, 0.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="hue"):
        kernel.distort(pixels.numpy(), out.numpy(), True, 4, 5, 0.7, 1.0, 1.0)


def test_a_detection_sample_is_the_same_with_and_without_the_kernel(monkeypatch: pytest.MonkeyPatch):
    """The training chain hands the colours the uint8 image (they make it float32 in their pass): the same sample, bit
    for bit and draw for draw, as the torch operations after v2.ToDtype."""
    generator = torch.Generator().manual_seed(0)
    image = tv_tensors.Image(torch.randint(0, 256, (3, 90, 120), dtype=torch.uint8, generator=generator))
    target = {"boxes": tv_tensors.BoundingBoxes(torch.tensor([[10.0, 12.0, 60.0, 70.0], [80.0, 5.0, 119.0, 40.0]]),
                                                format="XYXY", canvas_size=(90, 120)),
              "labels": torch.tensor([1, 2])}
    transform = train_transform("letterbox", 64, jitter=0.3, hue=0.1, saturation=1.5, exposure=1.5)

    def samples() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        out = []
        for seed in range(8):
            torch.manual_seed(seed)
            pixels, sample_target = transform(image, target)
            out.append((pixels.as_subclass(torch.Tensor), sample_target["boxes"].as_subclass(torch.Tensor),
                        torch.rand(())))  # the generator's state after the sample: the same draws were taken
        return out

    with_kernel = samples()
    monkeypatch.setattr(det_transforms, "_hsv", None)
    without = samples()
    for (pixels, boxes, after), (pixels_t, boxes_t, after_t) in zip(with_kernel, without, strict=True):
        assert pixels.dtype == torch.float32 and torch.equal(pixels, pixels_t)
        assert torch.equal(boxes, boxes_t) and torch.equal(after, after_t)
