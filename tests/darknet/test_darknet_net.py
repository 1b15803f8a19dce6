"""Darknet networks from a .cfg (bigbatch.darknet) against independent oracles: the layer and parameter
counts and .weights sizes Darknet itself reports for yolov3 and yolov3-tiny (tests/fixtures/darknet/README.md), the
C formulas of Darknet's layers and activations transcribed element by element, and a small network written out by
hand in plain torch."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bigbatch.darknet import (
    DarknetNetwork,
    ignored_keys,
    layer_table,
    load_network,
    parameter_count,
    read_darknet_cfg,
    read_weights,
    weights_size,
    with_classes,
    write_weights,
)
from bigbatch.darknet.activations import ACTIVATIONS, activation
from bigbatch.darknet.layers.conv import ConvBlock
from bigbatch.darknet.shapes import Shape
from bigbatch.errors import UserError
from tests.helpers import DARKNET_DATA, SMALL, STOCK_CFGS, net_header

FLT_MAX = float(np.finfo(np.float32).max)


@pytest.fixture(scope="module")
def yolov3() -> DarknetNetwork:
    torch.manual_seed(0)
    return load_network(DARKNET_DATA / "yolov3.cfg", 416, 416)


def conv_blocks(network: DarknetNetwork) -> list[ConvBlock]:
    """The network's ``[convolutional]`` layers in order."""
    return [layer for layer in network.layers if isinstance(layer, ConvBlock)]


def write_cfg(tmp_path: Path, text: str, name: str = "net.cfg") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def build(tmp_path: Path, text: str, seed: int = 0) -> DarknetNetwork:
    torch.manual_seed(seed)
    return DarknetNetwork(read_darknet_cfg(write_cfg(tmp_path, text)))


def randomize_bn(network: torch.nn.Module, seed: int = 1) -> None:
    """Non-trivial BN scales, shifts and running statistics, so that eval-mode BN is really exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in network.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(torch.randn(m.weight.shape, generator=g))
                m.bias.copy_(torch.randn(m.bias.shape, generator=g))
                m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)


# ----------------------------------------------------------------------------- the reference networks


def test_yolov3_counts_shapes_and_table(yolov3):
    assert len(yolov3.layers) == 107
    assert parameter_count(yolov3) == 61_949_149
    with torch.no_grad():
        outputs = yolov3.eval()(torch.randn(1, 3, 416, 416))
    assert [tuple(o.shape) for o in outputs] == [(1, 255, 13, 13), (1, 255, 26, 26), (1, 255, 52, 52)]
    heads = yolov3.yolo_heads
    assert [h.index for h in heads] == [82, 94, 106]
    assert [h.stride for h in heads] == [(32.0, 32.0), (16.0, 16.0), (8.0, 8.0)]
    assert [h.grid for h in heads] == [(13, 13), (26, 26), (52, 52)]
    assert heads[0].anchors == ((116, 90), (156, 198), (373, 326))
    assert heads[2].anchors == ((10, 13), (16, 30), (33, 23))
    assert all(h.classes == 80 and h.spec.ignore_thresh == 0.7 and h.spec.random == 1 for h in heads)
    table = layer_table(yolov3).splitlines()
    assert len(table) == 1 + 107 + 1
    assert table[1].split()[:3] == ["0", "conv", "32"] and "416 x 416 x    3 ->  416 x 416 x   32" in table[1]
    assert table[1 + 86].split()[:4] == ["86", "route", "85", "61"] and table[1 + 86].endswith("26 x  26 x  768")
    assert "61,949,149 parameters" in table[-1] and "107 layers" in table[-1]
    assert "module" not in repr(yolov3.layers[0].conv) and dict(yolov3.named_modules())["layers.0.bn"].eps == 1e-5


def test_yolov3_weights_round_trip_bit_identical(yolov3, tmp_path):
    randomize_bn(yolov3)
    path = tmp_path / "yolov3.weights"
    write_weights(yolov3, path, seen=32_013_312)
    assert path.stat().st_size == weights_size(yolov3) == 248_007_048
    assert path.read_bytes()[:20] == struct.pack("<iiiQ", 0, 2, 5, 32_013_312)
    again = load_network(yolov3.cfg.path, 416, 416)
    assert read_weights(again, path) == 32_013_312
    assert_bit_identical(yolov3, again)
    assert [p.name for p in tmp_path.iterdir()] == ["yolov3.weights"]  # no temporary file left


def assert_bit_identical(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        if key.endswith("num_batches_tracked"):  # not in a .weights file
            continue
        assert torch.equal(sa[key].view(torch.int32), sb[key].view(torch.int32)), key


def test_yolov3_tiny_weights_size_round_trip_and_other_classes(tmp_path):
    torch.manual_seed(0)
    tiny = load_network(DARKNET_DATA / "yolov3-tiny.cfg")
    assert len(tiny.layers) == 24 and parameter_count(tiny) == 8_852_366
    running = sum(b.numel() for n, b in tiny.named_buffers() if "running" in n)  # buffers, not parameters
    assert running == 2 * sum(b.bn.num_features for b in conv_blocks(tiny) if b.bn is not None)
    randomize_bn(tiny)
    path = tmp_path / "tiny.weights"
    write_weights(tiny, path)
    assert path.stat().st_size == 35_434_956
    again = load_network(DARKNET_DATA / "yolov3-tiny.cfg")
    assert read_weights(again, path) == 0
    assert_bit_identical(tiny, again)
    with torch.no_grad():  # yolov3-tiny's stride-1 maxpool keeps 13 x 13; at 128 px, 4 x 4 and 8 x 8
        out = load_network(DARKNET_DATA / "yolov3-tiny.cfg", 128, 128).eval()(torch.randn(2, 3, 128, 128))
    assert [tuple(o.shape) for o in out] == [(2, 255, 4, 4), (2, 255, 8, 8)]
    three = load_network(DARKNET_DATA / "yolov3-tiny.cfg", 128, 128, classes=3)
    # the two 1x1 convolutions before a [yolo] (inputs 512 and 256, with bias) lose 255 - 3 * (3 + 5) filters each
    assert parameter_count(three) == 8_852_366 - (512 + 1) * (255 - 24) - (256 + 1) * (255 - 24)
    assert [h.classes for h in three.yolo_heads] == [3, 3]
    assert [tuple(o.shape) for o in three(torch.randn(1, 3, 128, 128))] == [(1, 24, 4, 4), (1, 24, 8, 8)]


def test_reference_cfgs_ignored_keys():
    for name in ("yolov3.cfg", "yolov3-tiny.cfg"):
        cfg = read_darknet_cfg(DARKNET_DATA / name)
        assert ignored_keys(cfg) == ["net:angle"]  # saturation, exposure and hue are Darknet's augmentation: used
        assert (cfg.net.saturation, cfg.net.exposure, cfg.net.hue, cfg.net.flip) == (1.5, 1.5, 0.1, True)


# ----------------------------------------------------------------------------- .weights layout and errors

def test_weights_file_layout_by_hand(tmp_path):
    """The bytes of a two-layer network, laid out by hand in Darknet's order from known values."""
    network = build(tmp_path, SMALL)
    first, second = conv_blocks(network)
    values = iter(range(1, 10_000))
    with torch.no_grad():
        for t in (first.conv.weight, first.bn.weight, first.bn.bias, first.bn.running_mean, first.bn.running_var,
                  second.conv.weight, second.conv.bias):
            t.copy_(torch.tensor([float(next(values)) for _ in range(t.numel())]).view(t.shape))
    path = tmp_path / "small.weights"
    write_weights(network, path, seen=7)
    expected = (struct.pack("<iiiQ", 0, 2, 5, 7)
                + np.concatenate([
                    first.bn.bias.detach().numpy(), first.bn.weight.detach().numpy(),  # biases, scales
                    first.bn.running_mean.numpy(), first.bn.running_var.numpy(),  # rolling mean, variance
                    first.conv.weight.detach().numpy().reshape(-1),  # 3 * 2 * 3 * 3, OIHW
                    second.conv.bias.detach().numpy(), second.conv.weight.detach().numpy().reshape(-1),
                ]).astype("<f4").tobytes())
    assert path.read_bytes() == expected
    assert len(expected) == 20 + 4 * (3 * 4 + 54 + 2 + 6) == weights_size(network)


def test_weights_with_a_32_bit_seen_are_read(tmp_path):
    network = build(tmp_path, SMALL)
    body = np.arange(3 * 4 + 54 + 2 + 6, dtype="<f4")
    path = tmp_path / "old.weights"
    path.write_bytes(struct.pack("<iiii", 0, 1, 0, 12345) + body.tobytes())  # major * 10 + minor < 2: int32 seen
    assert read_weights(network, path) == 12345
    first, second = conv_blocks(network)
    assert first.bn.bias.tolist() == [0, 1, 2] and second.conv.weight.view(-1).tolist() == [68, 69, 70, 71, 72, 73]


@pytest.mark.parametrize("cut, expected_in_message", [
    (4, "takes 316 ("),  # a float short
    (-8, "takes 316 ("),  # 8 bytes too many
    (316 - 8, "takes 316 ("),  # a truncated header
])
def test_malformed_weights_are_one_line_naming_the_file_and_both_sizes(tmp_path, cut, expected_in_message):
    network = build(tmp_path, SMALL)
    good = tmp_path / "good.weights"
    write_weights(network, good)
    assert good.stat().st_size == 316
    data = good.read_bytes()
    bad = tmp_path / "bad.weights"
    bad.write_bytes(data[:-cut] if cut > 0 else data + bytes(-cut))
    with pytest.raises(UserError) as e:
        read_weights(network, bad)
    message = str(e.value)
    assert "\n" not in message and message.startswith(f"{bad}: ")
    assert expected_in_message in message and message.startswith(f"{bad}: {bad.stat().st_size:,} bytes, but ")


def test_write_weights_refuses_an_existing_file_unless_asked(tmp_path):
    network = build(tmp_path, SMALL)
    path = tmp_path / "out.weights"
    path.write_bytes(b"precious")
    with pytest.raises(UserError, match="exists"):
        write_weights(network, path)
    assert path.read_bytes() == b"precious"
    write_weights(network, path, seen=3, overwrite=True)
    assert path.stat().st_size == 316 and read_weights(network, path) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.cfg", "out.weights"]


# ----------------------------------------------------------------------------- each layer against torch by hand


def test_conv_bn_leaky_in_eval_mode(tmp_path):
    network = build(tmp_path, SMALL)
    randomize_bn(network)
    block = network.layers[0].eval()
    x = torch.randn(2, 2, 5, 5)
    w, bn = block.conv.weight, block.bn
    y = F.conv2d(x, w, None, 1, 1)
    y = (y - bn.running_mean[:, None, None]) / torch.sqrt(bn.running_var[:, None, None] + 1e-5)
    y = y * bn.weight[:, None, None] + bn.bias[:, None, None]
    y = torch.where(y > 0, y, 0.1 * y)
    torch.testing.assert_close(block(x), y)
    assert block.conv.bias is None and bn.momentum == 0.01 and bn.eps == 1e-5


def test_conv_without_bn_groups_strides_dilation_and_pad_rules(tmp_path):
    text = net_header(11, 9, 4) + """
[convolutional]
filters=6
size=3
stride_x=2
stride_y=1
padding=2
pad=1
groups=2
activation=linear

[convolutional]
filters=3
size=3
padding=2
activation=relu

[convolutional]
filters=2
size=3
pad=1
dilation=2
activation=logistic
"""
    network = build(tmp_path, text)
    first, second, third = (network.layers[i] for i in range(3))
    assert network.cfg.layers[0].padding == 1  # parser.c: if(pad) padding = size/2: pad wins over padding
    assert network.cfg.layers[1].padding == 2 and network.cfg.layers[1].activation == "relu"
    with torch.no_grad():
        first.conv.bias.normal_()
    x = torch.randn(1, 4, 9, 11)
    y1 = F.conv2d(x, first.conv.weight, first.conv.bias, (1, 2), 1, 1, 2)
    torch.testing.assert_close(first(x), y1)
    assert tuple(y1.shape[1:]) == (6, 9, 6)  # out = (in + 2 * padding - size) // stride + 1
    y2 = torch.relu(F.conv2d(y1, second.conv.weight, second.conv.bias, 1, 2))
    torch.testing.assert_close(second(y1), y2)
    assert tuple(y2.shape[1:]) == (3, 11, 8)
    y3 = torch.sigmoid(F.conv2d(y2, third.conv.weight, third.conv.bias, 1, 2, 2))  # padding * dilation
    torch.testing.assert_close(third(y2), y3)
    assert [s[1] for s in network.shapes] == [tuple_shape(y) for y in (y1, y2, y3)]


def tuple_shape(y: torch.Tensor) -> Shape:
    return Shape(*y.shape[1:])


def test_darknet_initialisation(tmp_path):
    network = build(tmp_path, SMALL)
    first, second = conv_blocks(network)
    bound = math.sqrt(2 / (3 * 3 * 2))  # make_convolutional_layer: sqrt(2 / (size * size * c / groups))
    assert first.conv.weight.abs().max() <= bound and first.conv.weight.abs().max() > bound / 2
    assert torch.all(first.bn.weight == 1) and torch.all(first.bn.bias == 0)
    assert torch.all(second.conv.bias == 0) and second.conv.weight.abs().max() <= math.sqrt(2 / 3)


def darknet_maxpool(x: np.ndarray, size: int, stride_x: int, stride_y: int, padding: int) -> np.ndarray:
    """forward_maxpool_layer (maxpool_layer.c), loop by loop."""
    n, c, h, w = x.shape
    out_h, out_w = (h + padding - size) // stride_y + 1, (w + padding - size) // stride_x + 1
    offset = -(padding // 2)  # -l.pad / 2
    out = np.empty((n, c, out_h, out_w), dtype=np.float32)
    for i in range(out_h):
        for j in range(out_w):
            best = np.full((n, c), -FLT_MAX, dtype=np.float32)
            for a in range(size):
                for b in range(size):
                    cur_h, cur_w = offset + i * stride_y + a, offset + j * stride_x + b
                    if 0 <= cur_h < h and 0 <= cur_w < w:
                        best = np.maximum(best, x[:, :, cur_h, cur_w])
            out[:, :, i, j] = best
    return out


@pytest.mark.parametrize("h, w, keys", [
    (13, 13, "size=2\nstride=1"),  # yolov3-tiny's: 13 x 13 stays 13 x 13
    (7, 5, "size=2\nstride=2"),  # odd sizes: the last window reaches past the input
    (8, 8, "size=2\nstride=2"),
    (9, 6, "size=3\nstride=2"),  # padding 2: one cell each side
    (6, 7, "size=5\nstride=1"),  # padding 4: two each side
    (7, 7, "size=2\nstride=2\npadding=3"),  # one left and top, two right and bottom
    (5, 5, "size=3\nstride=1\npadding=0"),
    (5, 6, "size=2\nstride=1\npadding=5"),  # windows entirely outside the input: -FLT_MAX
    (9, 8, "size=3\nstride_x=2\nstride_y=3"),
])
def test_maxpool_against_darknets_loop(tmp_path, h, w, keys):
    network = build(tmp_path, net_header(w, h, 3) + f"\n[maxpool]\n{keys}\n")
    spec = network.cfg.layers[0]
    x = torch.randn(2, 3, h, w)
    expected = darknet_maxpool(x.numpy(), spec.size, spec.stride_x, spec.stride_y, spec.padding)
    got = network.layers[0](x)
    assert np.array_equal(got.numpy(), expected)
    assert network.shapes[0][1] == tuple_shape(got)


@pytest.mark.parametrize("stride, scale", [(2, 1.0), (3, 0.5)])
def test_upsample(tmp_path, stride, scale):
    network = build(tmp_path, net_header(3, 2, 2) + f"\n[upsample]\nstride={stride}\nscale={scale}\n")
    x = torch.randn(2, 2, 2, 3, requires_grad=True)
    y = network.layers[0](x)
    expected = torch.empty(2, 2, 2 * stride, 3 * stride)
    for i in range(2 * stride):
        for j in range(3 * stride):
            expected[:, :, i, j] = scale * x[:, :, i // stride, j // stride]  # upsample_cpu
    torch.testing.assert_close(y, expected)
    y.sum().backward()  # backward sums the gradient of each copy
    torch.testing.assert_close(x.grad, torch.full_like(x, scale * stride * stride))


SHORTCUT_ROUTE = net_header(4, 4, 2) + """
[convolutional]
filters=4
size=1
activation=linear

[convolutional]
filters=6
size=1
activation=linear

[convolutional]
filters=4
size=1
activation=linear

[shortcut]
from=-3
activation=leaky

[shortcut]
from=0, 2
alpha=0.5
beta=2
activation=linear

[route]
layers=1, -2, 0
groups=2
group_id=1

[route]
layers=-5
"""


def test_shortcut_and_route_with_groups(tmp_path):
    network = build(tmp_path, SHORTCUT_ROUTE).eval()
    x = torch.randn(2, 2, 4, 4)
    o0 = network.layers[0](x)
    o1 = network.layers[1](o0)
    o2 = network.layers[2](o1)
    o3 = F.leaky_relu(o2 + o0, 0.1)  # shortcut from -3 (layer 0)
    o4 = 0.5 * o3 + 2 * (o0 + o2)  # alpha * previous + beta * (layers 0 + 2)
    o5 = torch.cat([o1[:, 3:6], o3[:, 2:4], o0[:, 2:4]], dim=1)  # the second half of each source
    got = []

    def keep(module, inputs, output):
        got.append(output)

    handles = [layer.register_forward_hook(keep) for layer in network.layers]
    network(x)
    for handle in handles:
        handle.remove()
    torch.testing.assert_close(got[3], o3)
    torch.testing.assert_close(got[4], o4)
    torch.testing.assert_close(got[5], o5)
    assert got[6] is got[1]  # route -5 from layer 6: layer 1, as it is
    assert [s[1].channels for s in network.shapes] == [4, 6, 4, 4, 4, 6 // 2 + 4 // 2 + 4 // 2, 6]
    assert network.cfg.layers[5].sources == (1, 3, 0)


VALUES = [-25.0, -20.5, -5.0, -4.0, -3.5, -2.0, -1.5, -1.0, -0.5, -1e-3, 0.0, 1e-3, 0.5, 1.0, 1.5, 3.0, 4.0, 4.5,
          6.0, 7.0, 20.5, 25.0]


def _softplus(x: float) -> float:  # AlexeyAB's softplus_activate(x, 20)
    return x if x > 20 else (math.exp(x) if x < -20 else math.log(math.exp(x) + 1))


DARKNET_FORMULAS = {  # activations.h, element by element
    "linear": lambda x: x,
    "logistic": lambda x: 1 / (1 + math.exp(-x)),
    "loggy": lambda x: 2 / (1 + math.exp(-x)) - 1,
    "tanh": lambda x: (math.exp(2 * x) - 1) / (math.exp(2 * x) + 1),
    "relu": lambda x: x * (x > 0),
    "relu6": lambda x: min(max(x, 0.0), 6.0),
    "leaky": lambda x: x if x > 0 else 0.1 * x,
    "relie": lambda x: x if x > 0 else 0.01 * x,
    "ramp": lambda x: x * (x > 0) + 0.1 * x,
    "elu": lambda x: (x >= 0) * x + (x < 0) * (math.exp(x) - 1),
    "selu": lambda x: (x >= 0) * 1.0507 * x + (x < 0) * 1.0507 * 1.6732 * (math.exp(x) - 1),
    "gelu": lambda x: 0.5 * x * (1 + math.tanh(0.797885 * x + 0.035677 * x**3)),
    "swish": lambda x: x / (1 + math.exp(-x)),
    "mish": lambda x: x * math.tanh(_softplus(x)),
    "hard_mish": lambda x: x if x > 0 else (x * x / 2 + x if x > -2 else 0.0),
    "hardtan": lambda x: -1.0 if x < -1 else (1.0 if x > 1 else x),
    "lhtan": lambda x: 0.001 * x if x < 0 else (0.001 * (x - 1) + 1 if x > 1 else x),
    "plse": lambda x: 0.01 * (x + 4) if x < -4 else (0.01 * (x - 4) + 1 if x > 4 else 0.125 * x + 0.5),
}

DARKNET_GRADIENTS = {  # activations.h's *_gradient, computed from the output y
    "logistic": lambda y: (1 - y) * y,
    "loggy": lambda y: 2 * (1 - (y + 1) / 2) * ((y + 1) / 2),
    "tanh": lambda y: 1 - y * y,
    "relu": lambda y: float(y > 0),
    "relu6": lambda y: float(0 < y < 6),
    "leaky": lambda y: 1.0 if y > 0 else 0.1,
    "relie": lambda y: 1.0 if y > 0 else 0.01,
    "ramp": lambda y: (y > 0) + 0.1,
    "elu": lambda y: (y >= 0) + (y < 0) * (y + 1),
    "selu": lambda y: (y >= 0) * 1.0507 + (y < 0) * (y + 1.0507 * 1.6732),
    "hardtan": lambda y: float(-1 < y < 1),
    "lhtan": lambda y: 1.0 if 0 < y < 1 else 0.001,
    "plse": lambda y: 0.01 if (y < 0 or y > 1) else 0.125,
}


def test_every_activation_is_a_formula_of_darknet():
    assert set(ACTIVATIONS) == set(DARKNET_FORMULAS)
    assert set(DARKNET_GRADIENTS) <= set(ACTIVATIONS)


@pytest.mark.parametrize("name", sorted(DARKNET_FORMULAS))
def test_activation_against_darknets_formula(name):
    x = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    y = activation(name)(x)
    expected = torch.tensor([DARKNET_FORMULAS[name](v) for v in VALUES], dtype=torch.float64)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    if name in DARKNET_GRADIENTS:  # away from the kinks, autograd's gradient is Darknet's
        y.sum().backward()
        kinks = {-4.0, -2.0, -1.0, 0.0, 1.0, 4.0, 6.0}
        for v, g, out in zip(VALUES, x.grad.tolist(), y.tolist(), strict=True):
            if v not in kinks:
                assert g == pytest.approx(DARKNET_GRADIENTS[name](out), rel=1e-9, abs=1e-12), (v, out)


def test_activation_in_a_cfg(tmp_path):
    network = build(tmp_path, net_header(3, 3, 1) + "\n[convolutional]\nfilters=1\nsize=1\nactivation=hard_mish\n")
    assert network.cfg.layers[0].activation == "hard_mish"
    default = build(tmp_path, net_header(3, 3, 1) + "\n[convolutional]\nfilters=1\nsize=1\n")
    assert isinstance(default.layers[0].act, torch.nn.Sigmoid)  # Darknet's default: logistic


# ----------------------------------------------------------------------------- a small network, by hand

SMALL_NET = net_header(16, 16, 3) + """
[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=4
size=1
stride=1
pad=1
activation=mish

[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=swish

[shortcut]
from=-3
activation=linear

[maxpool]
size=2
stride=1

[route]
layers=-1
groups=2
group_id=1

[convolutional]
size=1
stride=1
pad=1
filters=21
activation=linear

[yolo]
mask=3,4,5
anchors=10,14, 23,27, 37,58, 81,82, 135,169, 344,319
classes=2
num=6

[route]
layers=4

[upsample]
stride=2

[route]
layers=-1, 0

[convolutional]
size=1
stride=1
pad=1
filters=21
activation=linear

[dropout]
probability=0.3

[yolo]
mask=0,1,2
anchors=10,14, 23,27, 37,58, 81,82, 135,169, 344,319
classes=2
num=6
"""


def test_small_network_against_plain_torch(tmp_path):
    network = build(tmp_path, SMALL_NET)
    randomize_bn(network)
    with torch.no_grad():
        for block in conv_blocks(network):
            if block.conv.bias is not None:
                block.conv.bias.normal_()
    network.eval()
    p = dict(network.named_parameters()) | dict(network.named_buffers())

    def cbl(x, i, k, act):
        y = F.conv2d(x, p[f"layers.{i}.conv.weight"], p.get(f"layers.{i}.conv.bias"), 1, k // 2)
        if f"layers.{i}.bn.weight" in p:
            y = F.batch_norm(y, p[f"layers.{i}.bn.running_mean"], p[f"layers.{i}.bn.running_var"],
                             p[f"layers.{i}.bn.weight"], p[f"layers.{i}.bn.bias"], False, 0.0, 1e-5)
        return act(y)

    x = torch.randn(2, 3, 16, 16)
    l0 = cbl(x, 0, 3, lambda y: F.leaky_relu(y, 0.1))
    l1 = F.max_pool2d(l0, 2, 2)
    l2 = cbl(l1, 2, 1, F.mish)
    l3 = cbl(l2, 3, 3, F.silu)
    l4 = l3 + l1
    l5 = F.max_pool2d(F.pad(l4, (0, 1, 0, 1), value=-FLT_MAX), 2, 1)
    l6 = l5[:, 4:]
    l7 = cbl(l6, 7, 1, lambda y: y)
    l10 = l4.repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    l11 = torch.cat([l10, l0], dim=1)
    l12 = cbl(l11, 12, 1, lambda y: y)
    first, second = network(x)
    torch.testing.assert_close(first, l7)
    torch.testing.assert_close(second, l12)
    assert tuple(first.shape) == (2, 21, 8, 8) and tuple(second.shape) == (2, 21, 16, 16)
    assert [h.stride for h in network.yolo_heads] == [(2.0, 2.0), (1.0, 1.0)]
    assert network.yolo_heads[1].anchors == ((10, 14), (23, 27), (37, 58))
    network.train()  # and it trains: every parameter gets a gradient
    loss = sum(o.square().mean() for o in network(x))
    loss.backward()
    assert all(q.grad is not None and torch.isfinite(q.grad).all() for q in network.parameters())


# ----------------------------------------------------------------------------- malformed cfgs

CONV = "\n[convolutional]\nfilters=4\nsize=3\npad=1\nactivation=leaky\n"
YOLO = ("\n[convolutional]\nfilters=14\nsize=1\nactivation=linear\n"
        "\n[yolo]\nmask=0,1\nanchors=1,2, 3,4\nclasses=2\nnum=2\n")


@pytest.mark.parametrize("body, marker, start", [
    (CONV + "\n[lstm]\noutput=4\n", "[lstm]", "[lstm]: a recurrent layer, which bigbatch does not build"),
    (CONV + "\n[foo]\n", "[foo]", "[foo]: unknown section"),
    (CONV.replace("size=3", "size=3x"), "size=3x", "[convolutional] size: expected an integer >= 1"),
    (CONV.replace("size=3", "size=0"), "size=0", "[convolutional] size: expected an integer >= 1"),
    (CONV.replace("size=3", "size=1.5"), "size=1.5", "[convolutional] size: expected an integer"),
    (CONV.replace("leaky", "sigmoid"), "activation=sigmoid", "[convolutional] activation: expected one of"),
    (CONV.replace("size=3", "size=3\nxnor=1"), "xnor=1", "[convolutional] xnor: '1' is not supported"),
    (CONV.replace("size=3", "size=3\ndontload=1"), "dontload=1", "[convolutional] dontload: '1' is not supported"),
    (CONV + "\n[route]\nlayers=-2\n", "layers=-2", "[route] layers: -2 is layer -1, not a layer before this one"),
    (CONV + "\n[route]\nlayers=1\n", "layers=1", "[route] layers: 1 is layer 1, not a layer before this one"),
    (CONV + "\n[route]\nlayers=0\ngroups=3\n", "groups=3", "[route] groups: 3 does not divide the 4 channels"),
    (CONV + "\n[route]\nlayers=0\ngroups=2\ngroup_id=2\n", "group_id=2", "[route] group_id: expected an integer"),
    (CONV + "\n[shortcut]\nfrom=-5\n", "from=-5", "[shortcut] from: -5 is layer -4"),
    (CONV + "\n[shortcut]\nfrom=-1\nweights_type=per_channel\n", "weights_type",
     "[shortcut] weights_type: 'per_channel' is not supported"),
    (CONV + "\n[maxpool]\nsize=3\nstride=1\npadding=0\n" + "\n[shortcut]\nfrom=-2\n", "from=-2",
     "[shortcut] from: layer 0 is    8 x   8 x    4, the previous layer    6 x   6 x    4: Darknet adds"),
    (CONV.replace("filters=4", "filters=6\ngroups=4"), "groups=4", "[convolutional] groups: 4 does not divide"),
    (YOLO.replace("anchors=1,2, 3,4", "anchors=1,2, 3,-4"), "anchors=1,2, 3,-4", "[yolo] anchors: expected a number"),
    (YOLO.replace("classes=2", "classes=3"), "[yolo]", "[yolo]: its input has 14 channels"),
    (YOLO.replace("num=2", "num=2\niou_loss=l1"), "iou_loss=l1", "[yolo] iou_loss: expected one of mse, iou, giou"),
    (YOLO + "\n[upsample]\nstride=2\n", "[upsample]", "[upsample]: reads the output of the [yolo] before it"),
    (YOLO + "\n[route]\nlayers=-1\n", "layers=-1", "[route] layers: layer 1 is a [yolo]"),
    (CONV.replace("pad=1", "padding=1\ndilation=2").replace("size=3", "size=5"), "dilation=2",
     "[convolutional] dilation: a dilated convolution needs padding"),
    ("\n[maxpool]\nsize=9\nstride=1\npadding=0\n", "size=9", "[maxpool] size: the window (9) is larger"),
    ("\n[upsample]\nstride=-2\n", "stride=-2", "[upsample] stride: expected an integer >= 1"),
    ("\n[dropout]\nprobability=1\n", "probability=1", "[dropout] probability: expected a number in [0, 1)"),
    ("", "[net]", "[net]: the cfg has no layers"),
    (CONV + "\n[network]\n", "[network]", "[network]: a second [net] section"),
    ("\n[conv\n" + CONV, "[conv", "malformed section header '[conv'"),
])
def test_malformed_cfg_is_one_line_naming_file_line_section_and_key(tmp_path, body, marker, start):
    text = net_header(8, 8, 3) + body
    path = write_cfg(tmp_path, text)
    with pytest.raises(UserError) as e:
        DarknetNetwork(read_darknet_cfg(path))
    message = str(e.value)
    lines = text.split("\n")
    line = next(n for n, content in enumerate(lines, start=1) if marker in content)
    assert "\n" not in message
    assert message.startswith(f"{path}:{line}: {start}"), message


def test_a_cfg_without_net_or_channels(tmp_path):
    with pytest.raises(UserError, match=r"net.cfg:2: a Darknet .cfg starts with a \[net\] section"):
        read_darknet_cfg(write_cfg(tmp_path, "\n" + CONV.lstrip()))
    cfg = read_darknet_cfg(write_cfg(tmp_path, "[net]\nwidth=8\nheight=8\n" + CONV))
    with pytest.raises(UserError, match=r"net.cfg:1: \[net\] channels: missing"):
        DarknetNetwork(cfg)
    cfg = read_darknet_cfg(write_cfg(tmp_path, "[net]\nchannels=3\n" + CONV))
    with pytest.raises(UserError, match=r"\[net\] width: missing"):
        DarknetNetwork(cfg)
    assert DarknetNetwork(cfg, width=8, height=6).shapes[0][1].height == 6
    with pytest.raises(UserError, match="cannot read"):
        read_darknet_cfg(tmp_path / "absent.cfg")


def test_ignored_keys_are_reported_once(tmp_path):
    text = (net_header(8, 8, 3) + "hue=.1\nmosaic=1\nlearning_rate=0.01\n"
            + CONV.replace("size=3", "size=3\nwait_stream=1") + CONV.replace("size=3", "size=3\nwait_stream=1")
            + "\n[maxpool]\nsize=2\nstride=2\nstream=1\n"
            + YOLO.replace("num=2", "num=2\nshow_details=0\nbeta_nms=0.5"))
    cfg = read_darknet_cfg(write_cfg(tmp_path, text))
    # mosaic is used: a detector's data.mosaic (tests/data/test_darknet_mosaic.py)
    assert ignored_keys(cfg) == ["convolutional:wait_stream", "maxpool:stream", "yolo:show_details"]
    yolo = cfg.yolo_layers[0]
    assert yolo.beta_nms == 0.5 and yolo.masked_anchors == ((1, 2), (3, 4)) and yolo.filters == 14


def test_cbn_turns_batch_norm_on_as_darknet_and_its_weights_hold_the_bn_values(tmp_path):
    """AlexeyAB's parse_convolutional: ``if (cbn) batch_normalize = 2;``: a ``cbn=1`` layer has BN, and its
    ``.weights`` values are biases, scales, rolling mean, rolling variance, weights (it was ignored: no BN, 916
    bytes where Darknet writes 1,012)."""
    conv = "\n[convolutional]\nfilters=8\nsize=3\npad=1\nactivation=leaky\n"
    cfg = read_darknet_cfg(write_cfg(tmp_path, net_header(6, 6, 3) + conv.replace("size=3", "size=3\ncbn=1")))
    assert cfg.layers[0].batch_normalize and ignored_keys(cfg) == []
    assert any("cbn: batch norm on" in warning and "plain batch norm" in warning for warning in cfg.warnings)
    network = DarknetNetwork(cfg)
    assert [name for name, _ in network.layers[0].darknet_tensors()] == [
        "biases", "scales", "rolling_mean", "rolling_variance", "weights"]
    assert weights_size(network) == 20 + 4 * (8 + 8 + 8 + 8 + 8 * 3 * 3 * 3) == 1012
    values = np.arange(4 * 8 + 216, dtype=np.float32) / 100 + 0.5  # Darknet's layout, written by hand
    path = tmp_path / "cbn.weights"
    path.write_bytes(struct.pack("<iiiQ", 0, 2, 5, 64) + values.tobytes())
    assert read_weights(network, path) == 64
    bn = network.layers[0].bn
    for tensor, start in ((bn.bias, 0), (bn.weight, 8), (bn.running_mean, 16), (bn.running_var, 24)):
        assert torch.equal(tensor.detach(), torch.from_numpy(values[start:start + 8]))
    assert torch.equal(network.layers[0].conv.weight.detach().flatten(), torch.from_numpy(values[32:]))
    assert network.layers[0].conv.bias is None
    plain = read_darknet_cfg(write_cfg(tmp_path, net_header(6, 6, 3) + conv.replace("size=3", "size=3\ncbn=0"),
                                       "plain.cfg"))
    assert not plain.layers[0].batch_normalize and not plain.warnings  # cbn=0: as without the key


def test_spaces_inside_a_cfg_line_are_deleted_as_darknets_strip_deletes_them(tmp_path):
    """Darknet's read_cfg calls strip (src/utils.c), which deletes every space and tab of a line: an item with a
    missing comma is two numbers joined, a header or key with spaces inside is read without them."""
    text = (net_header(8, 8, 3) + "learning rate = 0.5\n" + CONV.replace("[convolutional]", "[ conv olutional ]")
            + YOLO.replace("anchors=1,2, 3,4", "anchors = 1 , 2  3 ,\t4 ,5  ").replace("num=2", "num = 2 "))
    path = write_cfg(tmp_path, text)
    cfg = read_darknet_cfg(path)
    assert [layer.section for layer in cfg.layers[:1]] == ["convolutional"]
    assert cfg.yolo_layers[0].masked_anchors == ((1, 23), (4, 5))  # "2  3" is 23, as Darknet reads it
    assert "learningrate" in cfg.net.options  # unknown to Darknet as written, and warned about
    assert any("[net] learningrate: 'learning rate' is read as 'learningrate'" in w for w in cfg.warnings)
    assert sum("is read as" in w for w in cfg.warnings) == 2  # "1 , 2" and ",\t4 ,5" join nothing


def test_the_stock_cfg_with_a_missing_comma_reads_the_anchor_darknet_reads():
    """AlexeyAB's cspx-p7-mish_hp.cfg writes ``61,45    61,45``: Darknet's anchor is 4561, not 45."""
    cfg = read_darknet_cfg(Path(STOCK_CFGS) / "alexeyab" / "cspx-p7-mish_hp.cfg")
    for yolo in cfg.yolo_layers:
        assert yolo.anchors[3] == (61.0, 4561.0) and yolo.anchors[4] == (45.0, 48.0)


@pytest.mark.parametrize(("keys", "classes", "values"), [("", 1, 7 * 7 * (2 * 2 + 1)),
                                                          ("classes=3\n", 3, 7 * 7 * (2 * 2 + 3))])
def test_a_detection_layer_without_classes_has_one_as_parse_detection_reads_it(tmp_path, keys, classes, values):
    """Both forks' parse_detection: ``option_find_int(options, "classes", 1)``; its input is side * side *
    ((1 + coords) * num + classes) values."""
    text = (net_header(14, 14, 3) + "\n[maxpool]\nsize=2\nstride=2\n\n[connected]\n"
            f"output={values}\nactivation=linear\n\n[detection]\n{keys}coords=1\nnum=2\nside=7\n")
    cfg = read_darknet_cfg(write_cfg(tmp_path, text))
    assert cfg.layers[-1].kind == "detection" and cfg.layers[-1].classes == classes
    DarknetNetwork(cfg)  # the connected layer's outputs fit the head


def test_yolo_keys_are_stored(tmp_path):
    keys = """random=1.25
scale_x_y=1.05
iou_normalizer=0.07
cls_normalizer=1.0
obj_normalizer=0.4
iou_loss=ciou
nms_kind=diounms
beta_nms=0.6
iou_thresh=0.213
max_delta=5
counters_per_class=10,20
label_smooth_eps=0.1
new_coords=1
objectness_smooth=1
resize=1.5
max=300
jitter=.3
ignore_thresh=.7
truth_thresh=1"""
    cfg = read_darknet_cfg(write_cfg(tmp_path, net_header(8, 8, 3) + YOLO.replace("num=2", "num=2\n" + keys)))
    yolo = cfg.yolo_layers[0]
    assert (yolo.random, yolo.scale_x_y, yolo.iou_loss, yolo.nms_kind, yolo.iou_thresh) == (
        1.25, 1.05, "ciou", "diounms", 0.213)
    assert (yolo.counters_per_class, yolo.max_boxes, yolo.new_coords, yolo.resize, yolo.max_delta) == (
        (10, 20), 300, 1, 1.5, 5.0)
    assert (yolo.iou_normalizer, yolo.obj_normalizer, yolo.label_smooth_eps, yolo.objectness_smooth) == (
        0.07, 0.4, 0.1, 1)
    assert ignored_keys(cfg) == []  # AlexeyAB's zoom: a run's data.jitter_resize (the last [yolo]'s)
    assert ignored_keys(read_darknet_cfg(write_cfg(tmp_path, net_header(8, 8, 3) + YOLO + "resize=1\n"))) == []
    assert with_classes(cfg, 2) == cfg


@pytest.mark.parametrize("body, line, message", [
    (CONV.replace("size=3", "size=3\nsizes=3"), 10, "[convolutional] sizes: unknown key, not used"),
    (CONV.replace("size=3", "size=3\nsize=5"), 9, "[convolutional] size: given twice (also line 10); Darknet reads "
                                                   "the first, '3'"),
    ("\nmax_epochs=8\n" + CONV, 7, "[net] max_epochs: unknown key, not used"),
    ("\nheight=16\n" + CONV, 4, "[net] height: given twice (also line 7)"),
    (CONV.replace("filters=4", "filters=4 ###P6"), 8, "filters: the comment after the value (###P6) is ignored"),
    (CONV + YOLO.replace("anchors=1,2, 3,4", "anchors=1,2, 3"), 20, "[yolo] anchors: 3 numbers, 4 expected (num=2); "
                                                                    "the last 1 are Darknet's default, 0.5"),
    (CONV + YOLO.replace("anchors=1,2, 3,4", "anchors=1,2, 3,4, 5,6"), 20, "[yolo] anchors: 6 numbers; Darknet reads "
                                                                           "the first 4"),
    (CONV + YOLO.replace("anchors=1,2, 3,4", "anchors=1,2  3,4"), 20, "[yolo] anchors: '2  3' is read as '23': "
                                                                       "Darknet's strip deletes every space"),
    (CONV + YOLO.replace("anchors=1,2, 3,4", "anchors=1,2x, 3,4"), 20, "[yolo] anchors: '2x' read as 2"),
    (CONV + YOLO.replace("mask=0,1", "mask=0,2"), 19, "[yolo] mask: index 2 is not below num=2: Darknet reads an "
                                                      "undefined anchor"),
])
def test_darknet_leniencies_are_warnings_and_read_as_darknet_reads(tmp_path, body, line, message):
    """What Darknet reads with a warning (or silently), bigbatch reads the same way and says once."""
    path = write_cfg(tmp_path, net_header(8, 8, 3) + body)
    cfg = read_darknet_cfg(path)
    assert any(w.startswith(f"{path}:{line}: ") and message in w for w in cfg.warnings), cfg.warnings
    network = DarknetNetwork(cfg)
    assert network.input_shape.height == 8  # the first height, as Darknet's option_find
    assert network.shapes[0][1].channels == 4 and network.layers[0].conv.kernel_size == (3, 3)
