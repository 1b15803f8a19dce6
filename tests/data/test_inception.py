"""The Inception preprocessing (bigbatch.data.transforms.inception) against TensorFlow's definitions.

Oracles: values computed by hand from the formulas, Python's ``colorsys`` for the HSV ops, and a few outputs of
TensorFlow 2.21 itself (``tf.compat.v1`` CPU kernels, recorded once; TensorFlow is not a test dependency).
"""

from __future__ import annotations

import colorsys

import numpy as np
import PIL.Image
import pytest
import torch
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as TF

from bigbatch.data.transforms.inception import (
    DistortColor,
    DistortColorFast,
    DistortedBoundingBoxCrop,
    InceptionEval,
    InceptionTrain,
)
from bigbatch.data.transforms.standard import IMAGENET_MEAN, IMAGENET_STD, standard_eval, standard_train
from bigbatch.data.transforms.tf1_ops import (
    RESIZE_METHODS,
    adjust_brightness,
    adjust_contrast,
    adjust_hue,
    adjust_saturation,
    central_crop_box,
    tf1_resize,
    tf1_resize_bilinear,
)

pytestmark = pytest.mark.fast


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def seeded(seed: int, fn, *args):
    """``fn(*args)`` drawing from torch's global RNG seeded with ``seed`` (restored after)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return fn(*args)


def synthetic_uint8(height: int = 37, width: int = 53) -> torch.Tensor:
    """uint8 CHW image, pixel (y, x, c) = (7 y + 13 x + 50 c) mod 256."""
    y = torch.arange(height)[:, None, None]
    x = torch.arange(width)[None, :, None]
    c = torch.arange(3)[None, None, :]
    return ((7 * y + 13 * x + 50 * c) % 256).to(torch.uint8).permute(2, 0, 1).contiguous()


def random_image(seed: int = 0, height: int = 4, width: int = 5) -> torch.Tensor:
    return torch.rand(3, height, width, generator=gen(seed))


# ------------------------------------------------------------------------------------------------- resizing


def test_tf1_bilinear_hand_computed() -> None:
    # 2x3 -> 3x2. Rows: src y = 0, 2/3, 4/3 (upper row index clamped to 1); columns: src x = 0, 1.5.
    image = torch.tensor([[[0.0, 3.0, 6.0], [6.0, 9.0, 12.0]]])
    expected = torch.tensor([[[0.0, 4.5], [4.0, 8.5], [6.0, 10.5]]])
    torch.testing.assert_close(tf1_resize_bilinear(image, (3, 2)), expected)
    # NCHW: each image alike
    batch = torch.stack([image, 2 * image])
    torch.testing.assert_close(tf1_resize_bilinear(batch, (3, 2)), torch.stack([expected, 2 * expected]))


def test_tf1_bilinear_upsampling_repeats_the_last_pixel_unlike_half_pixel() -> None:
    # 1x2 -> 1x4: src x = 0, 0.5, 1, 1.5 -> [a, (a+b)/2, b, b]; the half-pixel mapping gives [a, a+(b-a)/4, ...]
    image = torch.tensor([[[0.0, 4.0]]])
    out = tf1_resize_bilinear(image, (1, 4))
    torch.testing.assert_close(out, torch.tensor([[[0.0, 2.0, 4.0, 4.0]]]))
    half_pixel = torch.nn.functional.interpolate(image[None], size=(1, 4), mode="bilinear", align_corners=False)[0]
    torch.testing.assert_close(half_pixel, torch.tensor([[[0.0, 1.0, 3.0, 4.0]]]))


def test_tf1_resize_other_methods_hand_computed() -> None:
    # area 4 -> 3: output cells span [0, 4/3), [4/3, 8/3), [8/3, 4): overlap-weighted means
    torch.testing.assert_close(
        tf1_resize(torch.tensor([[[0.0, 2.0, 4.0, 6.0]]]), (1, 3), "area"), torch.tensor([[[0.5, 3.0, 5.5]]])
    )
    # bicubic 4 -> 8 (src x = dst / 2): Keys A = -0.75 at distances 1.5, 0.5, 0.5, 1.5 weighs
    # -0.09375, 0.59375, 0.59375, -0.09375; taps outside the image repeat the edge pixel
    expected = torch.tensor([[[0.0, 0.40625, 1.0, 1.5, 2.0, 2.59375, 3.0, 3.09375]]])
    torch.testing.assert_close(tf1_resize(torch.tensor([[[0.0, 1.0, 2.0, 3.0]]]), (1, 8), "bicubic"), expected)
    # nearest 5 -> 2: floor(dst * 5 / 2) = 0, 2
    torch.testing.assert_close(
        tf1_resize(torch.arange(5.0).view(1, 1, 5), (1, 2), "nearest"), torch.tensor([[[0.0, 2.0]]])
    )


# tf.compat.v1.image.resize_images(x, size, method) in TensorFlow 2.21 (CPU) on x[i, j] = ((3 i + 5 j) mod 7) / 6,
# a 4x5 single-channel image
TF_RESIZE = {
    ((3, 7), "bilinear"): [
        [0.0, 0.59523809, 0.69047618, 0.45238099, 0.2142857, 0.64285731, 1.0],
        [0.66666669, 0.42857146, 0.52380955, 0.73015869, 0.49206346, 0.47619048, 0.5],
        [0.55555552, 0.31746027, 0.41269842, 0.61904764, 0.38095236, 0.36507937, 0.38888884],
    ],
    ((3, 7), "nearest"): [
        [0.0, 0.0, 0.83333331, 0.5, 0.5, 0.16666667, 1.0],
        [0.5, 0.5, 0.16666667, 1.0, 1.0, 0.66666669, 0.33333334],
        [1.0, 1.0, 0.66666669, 0.33333334, 0.33333334, 0.0, 0.83333331],
    ],
    ((3, 7), "bicubic"): [
        [0.0, 0.64954501, 0.80703872, 0.42265773, 0.13704056, 0.62376612, 1.0911344],
        [0.74976945, 0.35105184, 0.48763883, 0.820117, 0.53449988, 0.44039848, 0.45004249],
        [0.57071191, 0.28154045, 0.3973721, 0.62917399, 0.34355694, 0.33652854, 0.41479096],
    ],
    ((3, 7), "area"): [
        [0.12500001, 0.45000002, 0.65833324, 0.625, 0.35833338, 0.50833309, 0.83333349],
        [0.75, 0.55000001, 0.46666655, 0.66666669, 0.40000001, 0.4333331, 0.58333343],
        [0.49999994, 0.29999992, 0.27499989, 0.70833331, 0.44166669, 0.35833311, 0.33333334],
    ],
    ((6, 3), "bilinear"): [
        [0.0, 0.6111111, 0.44444436],
        [0.33333334, 0.68518519, 0.51851851],
        [0.66666669, 0.62962961, 0.46296296],
        [1.0, 0.44444448, 0.2777777],
        [0.55555552, 0.51851851, 0.35185185],
        [0.33333334, 0.55555552, 0.38888893],
    ],
    ((6, 3), "nearest"): [
        [0.0, 0.83333331, 0.16666667],
        [0.0, 0.83333331, 0.16666667],
        [0.5, 0.16666667, 0.66666669],
        [1.0, 0.66666669, 0.0],
        [1.0, 0.66666669, 0.0],
        [0.33333334, 0.0, 0.5],
    ],
    ((6, 3), "bicubic"): [
        [0.0, 0.68808621, 0.39168149],
        [0.28721339, 0.76829267, 0.51625586],
        [0.74976945, 0.66243559, 0.43794185],
        [1.0, 0.45669973, 0.22501482],
        [0.57071191, 0.53133279, 0.29964787],
        [0.25925934, 0.60461909, 0.37293419],
    ],
    ((6, 3), "area"): [
        [0.33333331, 0.5, 0.66666669],
        [0.34999999, 0.63333338, 0.56666666],
        [0.36666662, 0.76666659, 0.46666664],
        [0.86666673, 0.33333337, 0.5],
        [0.53333324, 0.46666676, 0.40000001],
        [0.19999996, 0.59999979, 0.29999995],
    ],
}


@pytest.mark.parametrize("size, method", list(TF_RESIZE))
def test_tf1_resize_matches_tensorflow(size: tuple[int, int], method: str) -> None:
    image = torch.tensor([[[((3 * i + 5 * j) % 7) / 6.0 for j in range(5)] for i in range(4)]])
    out = tf1_resize(image, size, method)
    torch.testing.assert_close(out, torch.tensor([TF_RESIZE[size, method]]), atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------ the crop


def sample_boxes(crop: DistortedBoundingBoxCrop, height: int, width: int, n: int, seed: int) -> np.ndarray:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return np.array([crop.sample_box(height, width) for _ in range(n)])


def test_boxes_area_at_least_min_object_covered_and_aspect_in_range() -> None:
    height, width = 240, 320
    boxes = sample_boxes(DistortedBoundingBoxCrop(), height, width, 2000, seed=0)
    top, left, h, w = boxes.T
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= height).all() and (left + w <= width).all()
    fraction = h * w / (height * width)
    # min_object_covered=0.1 with the whole image as the box: area >= 0.1 of the image, not area[0] = 0.05
    assert fraction.min() >= 0.1 - 1e-6
    assert fraction.min() < 0.12 and fraction.max() > 0.8  # the whole range [0.1, 1] is reached
    # width = lrint(height * r) with r in [3/4, 4/3]: |w - h r| <= 1/2
    assert (w >= 0.75 * h - 0.5).all() and (w <= 4 / 3 * h + 0.5).all()
    ratio = w / h
    assert ratio.min() < 0.77 and ratio.max() > 1.3
    # TF draws the offsets as Uniform(H - h), i.e. in [0, H - h - 1]: a shorter crop never touches the bottom
    assert (top[h < height] + h[h < height] <= height - 1).all()
    assert (left[w < width] + w[w < width] <= width - 1).all()


def test_min_object_covered_zero_leaves_the_area_range() -> None:
    crop = DistortedBoundingBoxCrop(min_object_covered=0.0)
    assert crop.effective_area == (0.05, 1.0)
    assert DistortedBoundingBoxCrop().effective_area == (0.1, 1.0)
    assert DistortedBoundingBoxCrop(area=(0.3, 1.0)).effective_area == (0.3, 1.0)
    boxes = sample_boxes(crop, 240, 320, 1000, seed=1)
    fraction = boxes[:, 2] * boxes[:, 3] / (240 * 320)
    assert fraction.min() >= 0.05 - 1e-6 and fraction.min() < 0.07


def test_whole_image_after_max_attempts() -> None:
    # 200x1: every aspect in [3/4, 4/3] needs a crop at least 2 wide for 5 % of the area -> all attempts fail
    assert {tuple(b) for b in sample_boxes(DistortedBoundingBoxCrop(), 200, 1, 50, seed=2)} == {(0, 0, 200, 1)}
    # aspect 3..4 cannot cover 90 % of a square
    crop = DistortedBoundingBoxCrop(area=(0.9, 1.0), aspect_ratio=(3.0, 4.0), max_attempts=5)
    assert {tuple(b) for b in sample_boxes(crop, 100, 100, 20, seed=3)} == {(0, 0, 100, 100)}


def test_ten_by_one_image_gives_one_pixel_boxes_above_the_last_row() -> None:
    # 10x1: every attempt yields a 1x1 crop (area 1/10 = min_object_covered exactly, accepted); its top is
    # Uniform(10 - 1), so 0..8
    boxes = sample_boxes(DistortedBoundingBoxCrop(), 10, 1, 300, seed=4)
    assert (boxes[:, 1:] == [0, 1, 1]).all()
    assert set(boxes[:, 0]) == set(range(9))


def test_boxes_are_deterministic_from_a_seeded_rng() -> None:
    crop = DistortedBoundingBoxCrop()
    a = sample_boxes(crop, 427, 640, 20, seed=5)
    np.testing.assert_array_equal(a, sample_boxes(crop, 427, 640, 20, seed=5))
    assert not np.array_equal(a, sample_boxes(crop, 427, 640, 20, seed=6))


def test_crop_transform_crops_tensors_pil_and_tv_tensors_alike() -> None:
    image = synthetic_uint8(60, 80)
    crop = DistortedBoundingBoxCrop()
    top, left, h, w = seeded(7, crop.sample_box, 60, 80)
    expected = image[:, top : top + h, left : left + w]
    torch.testing.assert_close(seeded(7, crop, image), expected)
    pil = PIL.Image.fromarray(image.permute(1, 2, 0).numpy())
    torch.testing.assert_close(TF.pil_to_tensor(seeded(7, crop, pil)), expected)
    boxes = tv_tensors.BoundingBoxes([[left, top, left + w, top + h]], format="XYXY", canvas_size=(60, 80))
    out_image, out_boxes = seeded(7, crop, tv_tensors.Image(image), boxes)
    assert isinstance(out_image, tv_tensors.Image)
    torch.testing.assert_close(out_image.as_subclass(torch.Tensor), expected)
    assert out_boxes.tolist() == [[0, 0, w, h]]


# ------------------------------------------------------------------------------------------------- colour


def ycbcr_offsets(br: float, cb: float, cr: float) -> np.ndarray:
    """RGB offsets of the TPU code's distort_color_fast."""
    return np.array([1.402 * cr + br, -0.344136 * cb - 0.714136 * cr + br, 1.772 * cb + br])


def test_fast_color_formula_on_a_constant_image() -> None:
    base = np.array([0.5, 0.45, 0.4])
    image = torch.tensor(base, dtype=torch.float32)[:, None, None].expand(3, 4, 5).contiguous()
    t = DistortColorFast()
    # known parameters
    out = t.apply(image, {"br": 0.1, "cb": -0.05, "cr": 0.08})
    np.testing.assert_allclose(
        out.numpy(), np.broadcast_to((base + ycbcr_offsets(0.1, -0.05, 0.08))[:, None, None], out.shape), atol=1e-6
    )
    # drawn parameters: recover (br, cb, cr) from the offsets by inverting the formula
    matrix = np.array([[1.0, 0.0, 1.402], [1.0, -0.344136, -0.714136], [1.0, 1.772, 0.0]])
    drawn = []
    for seed in range(200):
        out = seeded(seed, t, image)
        assert torch.equal(out, out[:, :1, :1].expand_as(out))  # per image, not per pixel
        drawn.append(np.linalg.solve(matrix, out[:, 0, 0].numpy().astype(np.float64) - base))
    drawn = np.array(drawn)
    bound = np.array([32 / 255, 0.1, 0.1])
    assert (np.abs(drawn) <= bound + 1e-5).all()
    assert (drawn.max(0) > 0.9 * bound).all() and (drawn.min(0) < -0.9 * bound).all()


def test_fast_color_clips_to_unit_range() -> None:
    t = DistortColorFast()
    bright = t.apply(torch.full((3, 2, 2), 0.98), {"br": 0.1, "cb": 0.1, "cr": 0.1})
    dark = t.apply(torch.full((3, 2, 2), 0.02), {"br": -0.1, "cb": -0.1, "cr": -0.1})
    assert bright.max() == 1.0 and dark.min() == 0.0 and bright.min() >= 0 and dark.max() <= 1


def hsv_oracle(image: torch.Tensor, hue_shift: float = 0.0, saturation: float = 1.0) -> np.ndarray:
    """Per pixel with colorsys: hue + shift (mod 1), saturation * factor clipped to [0, 1]."""
    x = image.permute(1, 2, 0).numpy().astype(np.float64)
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            h, s, v = colorsys.rgb_to_hsv(*x[i, j])
            out[i, j] = colorsys.hsv_to_rgb((h + hue_shift) % 1.0, min(1.0, max(0.0, s * saturation)), v)
    return out.transpose(2, 0, 1)


def contrast_oracle(image: torch.Tensor, factor: float) -> np.ndarray:
    x = image.numpy().astype(np.float64)
    mean = x.reshape(3, -1).mean(1)[:, None, None]
    return (x - mean) * factor + mean


def brightness_oracle(image: torch.Tensor, delta: float) -> np.ndarray:
    return image.numpy().astype(np.float64) + delta


@pytest.mark.parametrize("factor", [0.0, 0.5, 1.3, 2.0])
def test_adjust_saturation_is_hsv_saturation(factor: float) -> None:
    image = random_image(10)
    image[:, 0, 0] = 0.4  # a grey pixel
    np.testing.assert_allclose(
        adjust_saturation(image, factor).numpy(), hsv_oracle(image, saturation=factor), atol=1e-5
    )


@pytest.mark.parametrize("delta", [-0.2, 0.07, 0.2, 0.5])
def test_adjust_hue_rotates_hsv_hue(delta: float) -> None:
    image = random_image(11)
    image[:, 1, 1] = 0.7
    np.testing.assert_allclose(adjust_hue(image, delta).numpy(), hsv_oracle(image, hue_shift=delta), atol=1e-5)


def test_adjust_contrast_uses_one_mean_per_channel() -> None:
    image = random_image(12)
    for factor in (0.5, 1.5):
        np.testing.assert_allclose(adjust_contrast(image, factor).numpy(), contrast_oracle(image, factor), atol=1e-6)
    # torchvision's adjust_contrast blends with one greyscale mean instead: not TF's
    assert not torch.allclose(TF.adjust_contrast(image, 1.5), adjust_contrast(image, 1.5), atol=1e-3)
    np.testing.assert_allclose(adjust_brightness(image, 0.1).numpy(), brightness_oracle(image, 0.1), atol=1e-7)


# slim's distort_color, read from research/slim/preprocessing/inception_preprocessing.py
SLIM_ORDERINGS = {
    0: ["brightness", "saturation", "hue", "contrast"],
    1: ["saturation", "brightness", "contrast", "hue"],
    2: ["contrast", "hue", "brightness", "saturation"],
    3: ["hue", "saturation", "contrast", "brightness"],
}
SLIM_FAST_ORDERINGS = {0: ["brightness", "saturation"], 1: ["saturation", "brightness"]}
RANGES = {"brightness": (-32 / 255, 32 / 255), "saturation": (0.5, 1.5), "hue": (-0.2, 0.2), "contrast": (0.5, 1.5)}


def oracle_op(name: str, image: torch.Tensor, value: float) -> torch.Tensor:
    if name == "brightness":
        out = brightness_oracle(image, value)
    elif name == "saturation":
        out = hsv_oracle(image, saturation=value)
    elif name == "hue":
        out = hsv_oracle(image, hue_shift=value)
    else:
        out = contrast_oracle(image, value)
    return torch.from_numpy(out).float()


@pytest.mark.parametrize("fast_mode", [False, True])
@pytest.mark.parametrize("ordering", [0, 1, 2, 3])
def test_distort_color_orderings(ordering: int, fast_mode: bool) -> None:
    t = DistortColor(ordering, fast_mode=fast_mode)
    params = seeded(20 + ordering, t.draw_params)
    expected_names = SLIM_FAST_ORDERINGS[min(ordering, 1)] if fast_mode else SLIM_ORDERINGS[ordering]
    assert [name for name, _ in params["ops"]] == expected_names
    for name, value in params["ops"]:
        low, high = RANGES[name]
        assert low <= value < high
    image = random_image(30, 6, 7) * 0.8 + 0.1
    expected = image
    for name, value in params["ops"]:  # no clipping between the ops, once at the end
        expected = oracle_op(name, expected, value)
    np.testing.assert_allclose(t.apply(image, params).numpy(), expected.clamp(0, 1).numpy(), atol=1e-5)
    # the transform draws the same parameters from the same RNG state
    torch.testing.assert_close(seeded(20 + ordering, t, image), t.apply(image, params))


def test_distort_color_random_ordering_draws_all_four() -> None:
    t = DistortColor(None)
    assert {seeded(seed, t.draw_params)["ordering"] for seed in range(40)} == {0, 1, 2, 3}


# -------------------------------------------------------------------------------------------- central crop


def test_central_crop_integer_rounding() -> None:
    # start = int((n - 0.875 n) / 2), size = n - 2 start; sizes as tf.image.central_crop gives them (TF 2.21)
    tf_sizes = {1: 1, 2: 2, 3: 3, 7: 7, 8: 8, 299: 263, 333: 293, 375: 329, 427: 375, 500: 438, 640: 560, 1001: 877}
    for n, size in tf_sizes.items():
        assert central_crop_box(n, n)[2:] == (size, size)
    # odd sizes: 375 -> start 23 (23.4375 truncated), 329 kept, not round(375 * 0.875) = 328
    assert InceptionEval().crop_box(375, 333) == (23, 20, 329, 293)
    assert InceptionEval().crop_box(427, 640) == (26, 40, 375, 560)


# --------------------------------------------------------------------------------------------- pipelines


@pytest.fixture(scope="module")
def photo() -> torch.Tensor:
    from sklearn.datasets import load_sample_image

    return torch.from_numpy(load_sample_image("china.jpg").copy()).permute(2, 0, 1).contiguous()


def test_eval_matches_tensorflow_preprocess_for_eval() -> None:
    # preprocess_for_eval(image, 11, 11) in TensorFlow 2.21 on the synthetic 37x53 image (crop 33x47)
    tf_pixels = {
        (0, 0): [-0.58431369, -0.19215679, 0.20000005],
        (5, 7): [-0.72691607, -0.33475924, 0.057397604],
        (10, 10): [-0.60427773, -0.21212083, 0.18003607],
        (3, 9): [-0.18502641, 0.20713043, 0.59928739],
    }
    out = InceptionEval(size=11)(synthetic_uint8())
    assert out.shape == (3, 11, 11) and out.dtype == torch.float32
    for (y, x), value in tf_pixels.items():
        torch.testing.assert_close(out[:, y, x], torch.tensor(value), atol=1e-6, rtol=0)


def test_eval_output_and_reduced_decode_path(photo: torch.Tensor) -> None:
    t = InceptionEval()
    out = t(photo)
    assert out.shape == (3, 299, 299) and out.dtype == torch.float32
    assert out.min() >= -1 and out.max() <= 1 and out.min() < -0.5 and out.max() > 0.5
    top, left, h, w = t.crop_box(*photo.shape[1:])
    torch.testing.assert_close(t.after_crop(photo[:, top : top + h, left : left + w]), out, atol=0, rtol=0)
    pil = PIL.Image.fromarray(photo.permute(1, 2, 0).numpy())
    torch.testing.assert_close(t(pil), out, atol=0, rtol=0)


@pytest.mark.parametrize("fast", [True, False])
def test_train_output_shape_range_and_determinism(photo: torch.Tensor, fast: bool) -> None:
    t = InceptionTrain(fast=fast)
    out = seeded(40, t, photo)
    assert out.shape == (3, 299, 299) and out.dtype == torch.float32
    assert out.min() >= -1 and out.max() <= 1 and out.std() > 0.1
    torch.testing.assert_close(seeded(40, t, photo), out, atol=0, rtol=0)
    assert not torch.equal(seeded(41, t, photo), out)
    # reduced-size decode: the box from the size alone, then everything after the crop, from the same RNG state
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(40)
        top, left, h, w = t.sample_box(*photo.shape[1:])
        torch.testing.assert_close(t.after_crop(photo[:, top : top + h, left : left + w]), out, atol=0, rtol=0)
    # PIL input and a label passed through
    pil = PIL.Image.fromarray(photo.permute(1, 2, 0).numpy())
    image, label = seeded(40, t, pil, 7)
    assert label == 7
    torch.testing.assert_close(image, out, atol=0, rtol=0)


def test_train_fast_uses_bilinear_and_slow_draws_all_four_methods() -> None:
    assert {seeded(s, InceptionTrain().draw_params)["method"] for s in range(10)} == {"bilinear"}
    assert {seeded(s, InceptionTrain(fast=False).draw_params)["method"] for s in range(60)} == set(RESIZE_METHODS)
    flips = [seeded(s, InceptionTrain().draw_params)["flip"] for s in range(200)]
    assert 60 < sum(flips) < 140


def test_train_composition_with_known_parameters() -> None:
    # crop -> TF1 bilinear -> flip -> fast colour -> (x - 0.5) * 2, with a fixed box and parameters
    image = synthetic_uint8(40, 50)
    t = InceptionTrain(size=16)
    params = {"box": (3, 4, 30, 40), "method": "bilinear", "flip": True, "color": {"br": 0.05, "cb": 0.0, "cr": 0.0}}
    out = t.transform(image, params)
    crop = image[:, 3:33, 4:44].float() / 255
    expected = ((tf1_resize_bilinear(crop, 16).flip(-1) + 0.05).clamp(0, 1) - 0.5) * 2
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------------- standard


def test_standard_recipes() -> None:
    image = torch.full((3, 64, 80), 128, dtype=torch.uint8)
    out = standard_eval(32)(image)
    assert type(out) is torch.Tensor and out.shape == (3, 32, 32) and out.dtype == torch.float32
    expected = (128 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    torch.testing.assert_close(out[:, 5, 7], expected, atol=1e-5, rtol=0)
    torch.manual_seed(0)
    out = standard_train(24)(PIL.Image.fromarray(synthetic_uint8(64, 80).permute(1, 2, 0).numpy()))
    assert type(out) is torch.Tensor and out.shape == (3, 24, 24) and out.dtype == torch.float32
