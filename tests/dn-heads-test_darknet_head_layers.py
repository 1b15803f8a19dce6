"""[reorg], [reorg3d], [region], [detection]: each against a numpy transcription of Darknet's C loop (reorg_cpu in
blas.c, forward_region_layer in AlexeyAB's region_layer.c, forward_detection_layer), and the stock cfgs using them
built."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bigbatch.darknet.layers.heads import Detection, DetectionOutput, Region, region_output
from bigbatch.darknet.layers.reorg import DarknetReorg, Reorg, Reorg3d
from bigbatch.darknet.network import load_network
from bigbatch.darknet.spec import Shape

STOCK = Path(__file__).parent / "data" / "darknet" / "stock"


def reorg_cpu(x: np.ndarray, w: int, h: int, c: int, batch: int, stride: int, forward: int) -> np.ndarray:
    """blas.c's reorg_cpu, loop for loop."""
    out = np.full(x.size, np.nan, dtype=x.dtype)
    out_c = c // (stride * stride)
    for b in range(batch):
        for k in range(c):
            for j in range(h):
                for i in range(w):
                    in_index = i + w * (j + h * (k + c * b))
                    c2 = k % out_c
                    offset = k // out_c
                    w2 = i * stride + offset % stride
                    h2 = j * stride + offset // stride
                    out_index = w2 + w * stride * (h2 + h * stride * (c2 + out_c * b))
                    if forward:
                        out[out_index] = x[in_index]
                    else:
                        out[in_index] = x[out_index]
    return out


def spec(cls, **kw):
    return cls(index=1, section=cls.kind, line=1, **kw)


@pytest.mark.fast
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("stride", [2, 3])
def test_reorg_is_reorg_cpu_on_the_input_sizes(reverse, stride):
    """[reorg] (pjreddie's forward_reorg_layer, AlexeyAB's forward_reorg_old_layer): reorg_cpu(input, l.w, l.h,
    l.c, batch, stride, reverse, output)."""
    b, c, h, w = 2, 2 * stride * stride, 2 * stride, 3 * stride
    x = np.arange(b * c * h * w, dtype=np.float32)
    layer = spec(Reorg, stride=stride, reverse=reverse)
    out = Shape(c // stride**2, h * stride, w * stride) if reverse else Shape(c * stride**2, h // stride, w // stride)
    got = DarknetReorg(layer, Shape(c, h, w), out)(torch.from_numpy(x).reshape(b, c, h, w))
    assert tuple(got.shape) == (b, out.channels, out.height, out.width)
    np.testing.assert_array_equal(got.reshape(-1).numpy(), reorg_cpu(x, w, h, c, b, stride, int(reverse)))


@pytest.mark.fast
@pytest.mark.parametrize("reverse", [False, True])
def test_reorg3d_is_reorg_cpu_on_the_output_sizes(reverse):
    """[reorg3d] (AlexeyAB's forward_reorg_layer): reorg_cpu(input, l.out_w, l.out_h, l.out_c, batch, stride,
    reverse, output); non-reverse is a space-to-depth of the input grid."""
    s, b = 2, 2
    c, h, w = (32, 2, 3) if reverse else (3, 4, 6)
    out = Shape(c // 4, h * 2, w * 2) if reverse else Shape(c * 4, h // 2, w // 2)
    x = np.arange(b * c * h * w, dtype=np.float32)
    got = DarknetReorg(spec(Reorg3d, stride=s, reverse=reverse), Shape(c, h, w), out)(
        torch.from_numpy(x).reshape(b, c, h, w))
    expected = reorg_cpu(x, out.width, out.height, out.channels, b, s, int(reverse))
    np.testing.assert_array_equal(got.reshape(-1).numpy(), expected)
    if not reverse:
        xi = x.reshape(b, c, h, w)
        g = got.numpy()
        assert g[1, (1 * 2 + 0) * c + 2, 1, 2] == xi[1, 2, 1 * 2 + 1, 2 * 2 + 0]


def softmax(v):
    e = np.exp(v - v.max())
    return e / e.sum()


@pytest.mark.fast
@pytest.mark.parametrize("use_softmax", [False, True])
def test_region_is_alexeyab_forward(use_softmax):
    """AlexeyAB's forward_region_layer (CPU, train=0): flatten(output, w*h, size*n, batch, 1), logistic at
    index + 4, softmax of classes at index + 5."""
    n, classes, h, w, b = 2, 3, 2, 3, 2
    size = classes + 5
    c = n * size
    rng = np.random.default_rng(0)
    x = rng.standard_normal(b * c * h * w).astype(np.float32)
    out = x.copy()
    for bb in range(b):  # flatten forward: swap[i2] = x[i1]
        row = out[bb * c * h * w:(bb + 1) * c * h * w].copy()
        swap = np.empty_like(row)
        for ch in range(c):
            for i in range(h * w):
                swap[i * c + ch] = row[ch * h * w + i]
        out[bb * c * h * w:(bb + 1) * c * h * w] = swap
    for bb in range(b):
        for i in range(h * w * n):
            index = size * i + bb * c * h * w
            out[index + 4] = 1 / (1 + np.exp(-out[index + 4]))
            if use_softmax:
                out[index + 5:index + 5 + classes] = softmax(out[index + 5:index + 5 + classes])
    layer = spec(Region, classes=classes, num=n, softmax=use_softmax)
    got = region_output(torch.from_numpy(x).reshape(b, c, h, w), layer)
    np.testing.assert_allclose(got.reshape(-1).numpy(), out, rtol=1e-6, atol=1e-7)


@pytest.mark.fast
def test_region_pjreddie_forward():
    """pjreddie's forward_region_layer (CPU): logistic on entries 0, 1 and coords of each anchor; softmax of the
    classes (stride w*h)."""
    n, classes, h, w = 2, 3, 2, 2
    size = classes + 5
    x = np.random.default_rng(1).standard_normal(n * size * h * w).astype(np.float32)
    out = x.copy().reshape(n, size, h * w)
    out[:, :2] = 1 / (1 + np.exp(-out[:, :2]))
    out[:, 4] = 1 / (1 + np.exp(-out[:, 4]))
    for a in range(n):
        for loc in range(h * w):
            out[a, 5:, loc] = softmax(x.reshape(n, size, h * w)[a, 5:, loc])
    layer = spec(Region, classes=classes, num=n, softmax=True)
    got = region_output(torch.from_numpy(x).reshape(1, n * size, h, w), layer, fork="pjreddie")
    np.testing.assert_allclose(got.reshape(-1).numpy(), out.reshape(-1), rtol=1e-6, atol=1e-7)


@pytest.mark.fast
def test_detection_softmax_over_each_location():
    side, classes, num, coords = 2, 3, 2, 4
    inputs = side * side * ((1 + coords) * num + classes)
    x = np.random.default_rng(2).standard_normal(inputs).astype(np.float32)
    out = x.copy()
    for i in range(side * side):
        out[i * classes:(i + 1) * classes] = softmax(out[i * classes:(i + 1) * classes])
    layer = spec(Detection, classes=classes, num=num, coords=coords, side=side, softmax=True)
    got = DetectionOutput(layer)(torch.from_numpy(x).reshape(1, inputs, 1, 1))
    np.testing.assert_allclose(got.reshape(-1).numpy(), out, rtol=1e-6, atol=1e-7)


STOCK_CFGS = ["alexeyab/yolov2.cfg", "pjreddie/yolov2.cfg", "alexeyab/yolov2-tiny.cfg", "pjreddie/yolov2-tiny-voc.cfg",
              "alexeyab/yolo-voc.2.0.cfg", "alexeyab/tiny-yolo-voc.cfg"]


@pytest.mark.parametrize("name", STOCK_CFGS)
def test_stock_cfgs_build_and_run(name):
    net = load_network(STOCK / name, width=64, height=64)
    with torch.no_grad():
        every = net.forward_layers(torch.rand(1, 3, 64, 64))
        outs = net(torch.rand(1, 3, 64, 64))
    assert len(every) == len(net.cfg.layers) and len(outs) == 1
