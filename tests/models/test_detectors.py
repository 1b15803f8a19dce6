"""Detectors by name: built from scratch offline, one contract (labels 0..C-1, no resizing, losses in
train mode, detections in the input's pixels in eval mode), weights files."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.nn as nn
from torchvision import tv_tensors

from bigbatch.engine.start_weights import load_weights_file
from bigbatch.errors import UserError
from bigbatch.models.detectors import build_detector, known_detectors

NUM_CLASSES = 3
SIZES = [(64, 96), (96, 64)]  # (H, W): non-square, different per image, multiples of 32 (so no padding)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any download attempt fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a detector tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)


def inputs(seed: int = 0) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]]]:
    g = torch.Generator().manual_seed(seed)
    images = [tv_tensors.Image(torch.rand(3, h, w, generator=g)) for h, w in SIZES]
    targets = [
        {"boxes": tv_tensors.BoundingBoxes([[4.0, 6.0, 40.0, 50.0]], format="XYXY", canvas_size=SIZES[0]),
         "labels": torch.tensor([0]), "image_id": 1},
        {"boxes": tv_tensors.BoundingBoxes([[10.0, 8.0, 60.0, 90.0], [2.0, 3.0, 20.0, 30.0]], format="XYXY",
                                           canvas_size=SIZES[1]),
         "labels": torch.tensor([NUM_CLASSES - 1, 1]), "image_id": 2},
    ]
    return images, targets


def backbone_input_shapes(model: nn.Module) -> list[tuple[int, ...]]:
    """Record the shape of every batch the detector's backbone sees."""
    shapes: list[tuple[int, ...]] = []
    model.detector.backbone.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    return shapes


@pytest.mark.parametrize("name", known_detectors())
def test_trains_and_detects_in_input_pixels(name: str) -> None:
    torch.manual_seed(0)
    # min_size / max_size as for COCO: a resizing transform would scale these 64-96 px inputs up to ~800 px
    model = build_detector(name, NUM_CLASSES, min_size=800, max_size=1333)
    seen = backbone_input_shapes(model)
    images, targets = inputs()

    model.train()
    losses = model(images, targets)
    assert isinstance(losses, dict) and losses
    assert all(torch.isfinite(v) for v in losses.values()), losses
    sum(losses.values()).backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)

    model.eval()
    with torch.no_grad():
        detections = model(images)
    # no resize: the backbone saw the inputs zero-padded into one batch (96 x 96) in training; in eval, each image
    # alone, at its own size (images that pad to different sizes never share a forward: detect_by_padded_size)
    assert seen == [(2, 3, 96, 96), (1, 3, 64, 96), (1, 3, 96, 64)]
    assert len(detections) == 2
    for (h, w), det in zip(SIZES, detections, strict=True):
        assert set(det) >= {"boxes", "scores", "labels"}
        boxes = det["boxes"]
        assert boxes.ndim == 2 and boxes.shape[1] == 4 and len(boxes) <= 100
        assert (boxes[:, 0] >= 0).all() and (boxes[:, 1] >= 0).all()
        assert (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()
        assert ((det["labels"] >= 0) & (det["labels"] < NUM_CLASSES)).all()


@pytest.mark.parametrize("name", ["small_detector", "fcos_resnet50_fpn"])
def test_detections_do_not_depend_on_which_images_share_a_forward(name: str) -> None:
    """The transform pads a batch to its largest image, which moved the detections of the smaller ones (one model's
    mAP changed 18 % with eval.batch): images of different padded sizes are now run apart, so each image's detections
    are those of the image alone, whatever the batch (the exported model takes one image at a time)."""
    torch.manual_seed(0)
    model = build_detector(name, NUM_CLASSES, min_size=64, max_size=128).eval()
    g = torch.Generator().manual_seed(1)
    images = [torch.rand(3, h, w, generator=g) for h, w in [(64, 96), (96, 64), (50, 70), (64, 90), (33, 128)]]
    seen = backbone_input_shapes(model)
    with torch.no_grad():
        together = model(images)
        alone = [model([image])[0] for image in images]
    # (64, 96), (50, 70) and (64, 90) pad to 64 x 96 and share one forward; the others run alone
    assert sorted(seen[:3]) == [(1, 3, 64, 128), (1, 3, 96, 64), (3, 3, 64, 96)]
    for mine, single in zip(together, alone, strict=True):
        assert mine.keys() == single.keys()
        for key in mine:
            torch.testing.assert_close(mine[key], single[key], atol=1e-4, rtol=1e-4)


def test_transform_normalises_and_pads_without_resizing() -> None:
    model = build_detector("small_detector", NUM_CLASSES, min_size=800, max_size=1333)
    transform = model.detector.transform
    image = torch.rand(3, 50, 70)
    batch, _ = transform([image])
    assert batch.image_sizes == [(50, 70)]
    assert batch.tensors.shape == (1, 3, 64, 96)  # padded up to multiples of 32
    mean = torch.tensor(transform.image_mean)[:, None, None]
    std = torch.tensor(transform.image_std)[:, None, None]
    torch.testing.assert_close(batch.tensors[0, :, :50, :70], (image - mean) / std)
    assert (batch.tensors[0, :, 50:, :] == 0).all() and (batch.tensors[0, :, :, 70:] == 0).all()
    # postprocess maps boxes from the input size to the same size: unchanged
    boxes = torch.tensor([[1.0, 2.0, 30.0, 40.0]])
    out = transform.postprocess([{"boxes": boxes.clone()}], batch.image_sizes, [(50, 70)])
    torch.testing.assert_close(out[0]["boxes"], boxes)


@pytest.mark.parametrize("name, offset", [("fasterrcnn_mobilenet_v3_large_fpn", 1),
                                          ("ssdlite320_mobilenet_v3_large", 1), ("small_detector", 0)])
def test_labels_are_shifted_for_detectors_with_a_background_class(name: str, offset: int) -> None:
    torch.manual_seed(0)
    model = build_detector(name, NUM_CLASSES, min_size=96, max_size=96)
    inner = model.detector
    images, targets = inputs()
    received = []
    inner_forward = inner.forward

    def spy(images, targets=None):
        received.append(targets)
        return inner_forward(images, targets)

    inner.forward = spy
    model.train()
    model(images, targets)  # label 0 is a valid class
    assert [t["labels"].tolist() for t in received[0]] == [(t["labels"] + offset).tolist() for t in targets]

    model.eval()
    with torch.no_grad():
        ours = model(images)
        theirs = [inner_forward([im.as_subclass(torch.Tensor)])[0] for im in images]  # sizes differ: one by one
    assert any(len(d["labels"]) for d in ours)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a["boxes"], b["boxes"])
        assert a["labels"].tolist() == (b["labels"] - offset).tolist()
        assert ((a["labels"] >= 0) & (a["labels"] < NUM_CLASSES)).all()


def eval_outputs(model: nn.Module) -> list[dict[str, torch.Tensor]]:
    model.eval()
    with torch.no_grad():
        return model(inputs(seed=1)[0])


@pytest.mark.parametrize("form", ["wrapped", "bare", "checkpoint", "safetensors"])
def test_weights_file_round_trip(tmp_path, form: str) -> None:
    torch.manual_seed(0)
    trained = build_detector("small_detector", NUM_CLASSES, min_size=96, max_size=96)
    with torch.no_grad():  # move the BatchNorm statistics off their defaults too
        for module in trained.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.1, 0.1)
                module.running_var.uniform_(0.9, 1.1)
    state = trained.state_dict()
    path = tmp_path / ("w.safetensors" if form == "safetensors" else "w.pt")
    if form == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, path)
    else:
        saved = {"wrapped": state, "bare": trained.detector.state_dict(), "checkpoint": {"model": state, "step": 3}}
        torch.save(saved[form], path)
    torch.manual_seed(1)
    fresh = build_detector("small_detector", NUM_CLASSES, min_size=96, max_size=96)
    loaded = build_detector("small_detector", NUM_CLASSES, min_size=96, max_size=96)
    started = load_weights_file(loaded, path)
    assert len(started.loaded) == started.total and not started.missing
    expected, got, other = eval_outputs(trained), eval_outputs(loaded), eval_outputs(fresh)
    for e, g in zip(expected, got, strict=True):
        for key in ("boxes", "scores", "labels"):
            torch.testing.assert_close(g[key], e[key])
    assert not torch.equal(other[0]["scores"], expected[0]["scores"])  # the weights made the difference


def test_bad_weights_are_user_errors(tmp_path) -> None:
    model = build_detector("small_detector", NUM_CLASSES, min_size=96, max_size=96)
    with pytest.raises(UserError, match=r"model\.weights: .*missing\.pt does not exist"):
        load_weights_file(model, tmp_path / "missing.pt")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a weights file")
    with pytest.raises(UserError, match=r"model\.weights: .*garbage\.pt is not a readable torch file"):
        load_weights_file(model, garbage)
    other_classes = tmp_path / "five.pt"
    torch.save(build_detector("small_detector", 5, min_size=96, max_size=96).state_dict(), other_classes)
    with pytest.raises(UserError, match=r"model\.mismatched: .*five\.pt \(a state dict\) has tensors of other "
                                        r"shapes: detector\.head\.classification_head\.cls_logits\.weight \[5, "):
        load_weights_file(model, other_classes)
    not_a_dict = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], not_a_dict)
    with pytest.raises(UserError, match=r"model\.weights: .*list\.pt holds no state dict"):
        load_weights_file(model, not_a_dict)


def test_unknown_name_is_a_user_error() -> None:
    with pytest.raises(UserError, match=r"model\.name: unknown detector 'yolo9000'.*small_detector"):
        build_detector("yolo9000", NUM_CLASSES, min_size=96, max_size=96)


@pytest.mark.parametrize("name", ["small_detector", "ssdlite320_mobilenet_v3_large"])
def test_group_norm_replaces_every_batch_norm(name: str) -> None:
    model = build_detector(name, NUM_CLASSES, min_size=96, max_size=96, norm="group")
    kinds = {type(m) for m in model.modules()}
    assert nn.BatchNorm2d not in kinds and nn.GroupNorm in kinds
    model.train()
    losses = model(*inputs())
    assert all(torch.isfinite(v) for v in losses.values())
