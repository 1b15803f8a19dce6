"""``model.darknet_dialect``: under ``alexeyab`` and ``pjreddie`` the gradient of a micro-batch's YOLO loss with
respect to each ``[yolo]`` input is minus that fork's own ``l.delta`` divided by the number of images, as measured
with Darknet itself (benchmarks/darknet_oracle/yolo_delta.c on YOLO_DELTA_CASES of tests/helpers.py, stored in
tests/fixtures/darknet/yolo_delta/); each rule the cases rely on really changes the deltas; the dialect reaches the
network and the loss through the config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from bigbatch.darknet import load_network, read_darknet_cfg, yolo_delta
from bigbatch.darknet.detector import DarknetDetector, check_supported, decode_yolo_output
from bigbatch.darknet.shapes import layer_shapes
from bigbatch.darknet.yolo_delta import layer_delta, layer_loss
from bigbatch.darknet.yolo_loss import yolo_loss
from bigbatch.errors import UserError
from tests.helpers import (
    DARKNET_DATA,
    ROOT,
    STOCK_CFGS,
    YOLO_DELTA_CASES,
    YOLO_DELTA_TRUTHS,
    cfg_with_keys,
    yolo_delta_input,
)

pytestmark = pytest.mark.fast

MEASURED = DARKNET_DATA / "yolo_delta"
RELATIVE = 1e-5


def truth_tensors() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """YOLO_DELTA_TRUTHS as Darknet reads them (float32 fractions), padded: boxes, labels, valid."""
    count = max(len(t) for t in YOLO_DELTA_TRUTHS)
    boxes = torch.zeros(len(YOLO_DELTA_TRUTHS), count, 4, dtype=torch.float64)
    labels = torch.zeros(len(YOLO_DELTA_TRUTHS), count, dtype=torch.long)
    valid = torch.zeros(len(YOLO_DELTA_TRUTHS), count, dtype=torch.bool)
    for b, truths in enumerate(YOLO_DELTA_TRUTHS):
        for t, (x, y, w, h, c) in enumerate(truths):
            boxes[b, t] = torch.tensor([x, y, w, h], dtype=torch.float32).double()
            labels[b, t], valid[b, t] = c, True
    return boxes, labels, valid


def case_layers(case, tmp_path: Path):
    path = tmp_path / case.cfg
    stock = (ROOT / STOCK_CFGS / case.fork / case.cfg).read_text()
    path.write_text(cfg_with_keys(stock, case.size, case.keys, case.images))
    measured = np.load(MEASURED / f"{case.name}.npz")
    cfg = read_darknet_cfg(path)
    assert sorted(spec.index for spec in cfg.yolo_layers) == list(measured["layers"])
    for spec in cfg.yolo_layers:
        delta = torch.from_numpy(measured[f"delta_{spec.index}"])
        x = torch.from_numpy(yolo_delta_input(case, spec.index, spec, *delta.shape[-2:]))
        yield spec, x, delta, float(measured[f"cost_{spec.index}"])


def assert_equal_deltas(ours: torch.Tensor, theirs: torch.Tensor, spec) -> None:
    """Equal within RELATIVE of the largest |delta| of each term (box, objectness, classes) of the layer."""
    n, _, h, w = theirs.shape
    a = len(spec.mask)
    ours = ours.reshape(n, a, -1, h, w)
    theirs = theirs.reshape(n, a, -1, h, w).to(ours)
    for name, entries in (("box", slice(0, 4)), ("objectness", slice(4, 5)), ("classes", slice(5, None))):
        scale = float(theirs[:, :, entries].abs().max())
        error = float((ours[:, :, entries] - theirs[:, :, entries]).abs().max())
        assert error <= RELATIVE * max(scale, 1e-3), f"layer {spec.index} {name}: error {error:.3g}, |delta| {scale}"
    # the same slots written, beyond rounding
    assert torch.equal(ours.abs() > 1e-6, theirs.abs() > 1e-6)


@pytest.mark.parametrize("case", YOLO_DELTA_CASES, ids=[c.name for c in YOLO_DELTA_CASES])
def test_gradient_is_minus_darknets_delta(case, tmp_path):
    """The loss of the case's images, backpropagated: the gradient w.r.t. each [yolo] input is -delta / N, delta
    Darknet's own; for mse (where Darknet's cost is |delta|^2 in both forks) the loss is Darknet's cost / N."""
    boxes, labels, valid = truth_tensors()
    for spec, x, delta, cost in case_layers(case, tmp_path):
        raw = x.clone().requires_grad_()
        terms = layer_loss(raw, spec, boxes, labels, valid, (case.size, case.size), case.fork, case.images)
        sum(terms.values()).backward()
        assert_equal_deltas(-raw.grad * case.images, delta, spec)
        if spec.iou_loss == "mse" or case.fork == "pjreddie":
            assert float(sum(terms.values()).detach()) == pytest.approx(cost / case.images, rel=1e-4)


def test_the_loss_reads_pixel_targets_as_darknet_does(tmp_path):
    """Through ``yolo_loss`` (targets XYXY in input pixels, as the data pipeline gives them), every layer of a
    network at once: the same gradients."""
    case = next(c for c in YOLO_DELTA_CASES if c.name == "alexeyab-yolov4-tiny")
    targets = [{"boxes": torch.tensor([[(x - w / 2) * case.size, (y - h / 2) * case.size, (x + w / 2) * case.size,
                                        (y + h / 2) * case.size] for x, y, w, h, _ in truths],
                                      dtype=torch.float64).reshape(-1, 4),
                "labels": torch.tensor([c for *_, c in truths], dtype=torch.long)} for truths in YOLO_DELTA_TRUTHS]
    layers = list(case_layers(case, tmp_path))
    raws = [x.clone().requires_grad_() for _, x, _, _ in layers]
    sum(yolo_loss(raws, [spec for spec, *_ in layers], targets, (case.size, case.size), dialect="alexeyab")
        .values()).backward()
    for raw, (spec, _, delta, _) in zip(raws, layers, strict=True):
        assert_equal_deltas(-raw.grad * case.images, delta, spec)


TRUTH_PAIRS = ((YOLO_DELTA_TRUTHS[0][0], YOLO_DELTA_TRUTHS[0][1]), (YOLO_DELTA_TRUTHS[1][3], YOLO_DELTA_TRUTHS[1][4]))


def test_two_truths_share_a_slot():
    """YOLO_DELTA_TRUTHS puts two truths on one cell and best anchor (the rule that AlexeyAB adds and pjreddie
    overwrites) on some layer of each network the cases use."""
    shared = set()
    for case in YOLO_DELTA_CASES:
        cfg = read_darknet_cfg(ROOT / STOCK_CFGS / case.fork / case.cfg)
        shapes = layer_shapes(cfg, cfg.net.channels, case.size, case.size)
        for spec in cfg.yolo_layers:
            grid = shapes[spec.index][1]
            for first, second in (TRUTH_PAIRS):
                slots = []
                for x, y, w, h, _ in (first, second):
                    inter = [min(w, aw / case.size) * min(h, ah / case.size) for aw, ah in spec.anchors]
                    ious = [i / (w * h + aw * ah / case.size ** 2 - i)
                            for i, (aw, ah) in zip(inter, spec.anchors, strict=True)]
                    slots.append((int(x * grid.width), int(y * grid.height), int(np.argmax(ious))))
                if slots[0] == slots[1] and slots[0][2] in spec.mask:
                    shared.add(case.name)
    assert shared == {c.name for c in YOLO_DELTA_CASES}


def test_a_class_counted_zero_times_is_counted_once_as_get_classes_multipliers_does(tmp_path):
    """AlexeyAB's get_classes_multipliers raises each counter below 1 to 1 before max / counter: a 0 (or a
    negative count) gives finite deltas, those of a 1."""
    spec = replace(read_darknet_cfg(ROOT / STOCK_CFGS / "alexeyab" / "yolov3-tiny.cfg").yolo_layers[0],
                   counters_per_class=(0, 4, 20) + (10,) * 77, max_delta=1e9)
    expected = [20.0, 5.0, 1.0] + [2.0] * 77  # max(1, 4, 20, 10) / max(1, counter), written out
    assert yolo_delta.class_multipliers(spec).tolist() == expected
    assert yolo_delta.class_multipliers(replace(spec, max_delta=3.0)).tolist() == [3.0, 3.0, 1.0] + [2.0] * 77
    case = next(c for c in YOLO_DELTA_CASES if c.fork == "alexeyab")
    boxes, labels, valid = truth_tensors()
    for layer, x, _, _ in case_layers(case, tmp_path):
        zero = tuple(0 if c == int(labels[0, 0]) else 5 for c in range(layer.classes))
        one = tuple(max(c, 1) for c in zero)
        size = (case.size, case.size)
        got = layer_delta(x, replace(layer, counters_per_class=zero), boxes, labels, valid, size, case.fork)
        assert torch.isfinite(got).all()
        assert torch.equal(got, layer_delta(x, replace(layer, counters_per_class=one), boxes, labels, valid, size,
                                            case.fork))


RULES = {  # key: the value that turns the rule off
    "truth_thresh": 1.0, "iou_thresh": 1.0, "objectness_smooth": 0, "focal_loss": 0, "counters_per_class": None,
    "label_smooth_eps": 0.0, "max_delta": float("inf"), "scale_x_y": 1.0, "iou_normalizer": 1.0,
    "obj_normalizer": 1.0}


def test_every_rule_the_cases_set_changes_the_deltas(tmp_path, monkeypatch):
    """Each non-default key of the cases' [yolo] layers (and AlexeyAB's class match) changes the deltas of some
    case: matching Darknet on the cases takes implementing it."""
    boxes, labels, valid = truth_tensors()
    changed: dict[str, bool] = {}
    for case in YOLO_DELTA_CASES:
        layers = list(case_layers(case, tmp_path))
        for key, off in RULES.items():
            for spec, x, delta, _ in layers:
                if getattr(spec, key) == off or (key == "max_delta" and spec.iou_loss == "mse"):
                    continue
                other = layer_delta(x, replace(spec, **{key: off}), boxes, labels, valid, (case.size, case.size),
                                    case.fork)
                changed[key] = changed.get(key, False) or float((other.float() - delta).abs().max()) > 1e-3
        if case.fork == "alexeyab":
            with monkeypatch.context() as patch:
                patch.setattr(yolo_delta, "CLASS_MATCH_THRESH", -1.0)  # every prediction "has a class"
                changed["compare_yolo_class"] = changed.get("compare_yolo_class", False) or any(
                    float((layer_delta(x, spec, boxes, labels, valid, (case.size, case.size), case.fork).float()
                           - delta).abs().max()) > 1e-3 for spec, x, delta, _ in layers)
    assert set(changed) == set(RULES) | {"compare_yolo_class"} and all(changed.values()), changed


TINY_NEW_COORDS = """[net]
width=64
height=64
channels=3

[convolutional]
batch_normalize=1
filters=8
size=3
stride=2
pad=1
activation=leaky

[convolutional]
filters=16
size=3
stride=2
pad=1
activation=leaky

[convolutional]
filters=21
size=1
stride=1
pad=1
activation=logistic

[yolo]
mask=0,1,2
anchors=8,8, 16,20, 30,24
classes=2
num=3
scale_x_y=2.0
iou_loss=ciou
iou_normalizer=0.05
obj_normalizer=1.0
iou_thresh=0.2
new_coords=1
max_delta=5
ignore_thresh=.7
"""


def test_new_coords_trains_and_decodes(tmp_path):
    """A new_coords network (the conv before [yolo] is logistic): eval decodes x = (i + 2 o - 0.5) / W, w = 4 o^2
    a / in_w and scores o_obj o_c without a second logistic; under alexeyab it trains (the loss on one batch falls
    over 30 steps); gradient refuses it with one line."""
    path = tmp_path / "new_coords.cfg"
    path.write_text(TINY_NEW_COORDS)
    torch.manual_seed(0)
    network = load_network(path)
    check_supported(network, "alexeyab")
    with pytest.raises(UserError, match=r"new_coords.cfg:\d+: \[yolo\] new_coords.*gradient dialect"):
        check_supported(network, "gradient")
    spec = network.cfg.yolo_layers[0]
    raw = torch.full((1, 21, 16, 16), 0.5)
    boxes, objectness, classes = decode_yolo_output(raw, spec, (64, 64))
    # cell (0, 0), anchor 0: x = (0 + 2 * 0.5 - 0.5) / 16 of 64 px = 2 px; w = 4 * 0.25 * 8 = 8 px
    torch.testing.assert_close(boxes[0, 0], torch.tensor([2 - 4.0, 2 - 4.0, 2 + 4.0, 2 + 4.0]))
    assert float(objectness[0, 0]) == 0.5 and float(classes[0, 0, 0]) == 0.5

    model = DarknetDetector(network, dialect="alexeyab")
    images = [torch.rand(3, 64, 64) for _ in range(2)]
    targets = [{"boxes": torch.tensor([[10.0, 12.0, 30.0, 40.0], [40.0, 8.0, 60.0, 20.0]]),
                "labels": torch.tensor([0, 1])}, {"boxes": torch.tensor([[20.0, 20.0, 44.0, 50.0]]),
                                                  "labels": torch.tensor([1])}]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        terms = model(images, targets)
        sum(terms.values()).backward()
        optimizer.step()
        losses.append(float(sum(terms.values()).detach()))
    assert all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0], losses


SHORTCUT = """[net]
width=8
height=8
channels=3

[convolutional]
filters=3
size=1
stride=1
pad=1
activation=linear

[shortcut]
from=-2
alpha=0.5
beta=2
activation=linear
"""


def test_shortcut_alpha_beta_follow_the_dialect(tmp_path):
    """pjreddie applies [shortcut] alpha and beta; AlexeyAB does not read them (a warning says so)."""
    path = tmp_path / "shortcut.cfg"
    path.write_text(SHORTCUT.replace("from=-2", "from=-1"))
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    pjreddie = load_network(path, dialect="pjreddie").eval()
    alexeyab = load_network(path, dialect="alexeyab").eval()
    alexeyab.load_state_dict(pjreddie.state_dict())
    conv = pjreddie.layers[0](x)
    torch.testing.assert_close(pjreddie(x)[-1], 0.5 * conv + 2 * conv)
    torch.testing.assert_close(alexeyab(x)[-1], conv + conv)
    assert any("alpha=0.5, beta=2: AlexeyAB's Darknet does not read them" in w for w in alexeyab.cfg.warnings)
    assert not pjreddie.cfg.warnings


def test_pjreddie_refuses_keys_it_does_not_read(tmp_path):
    path = tmp_path / "ciou.cfg"
    path.write_text(TINY_NEW_COORDS.replace("new_coords=1\n", "").replace("logistic", "linear"))
    network = load_network(path, dialect="pjreddie")
    with pytest.raises(UserError, match=r"ciou.cfg:\d+: \[yolo\] scale_x_y: pjreddie's Darknet does not read this "
                                        r"key \(it trains as if scale_x_y=1.0\)"):
        check_supported(network, "pjreddie")
    check_supported(network, "alexeyab")
    check_supported(network, "gradient")
