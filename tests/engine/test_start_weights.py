"""``model.weights`` for every model family, by tensor name (runs and checkpoints of another class count, timm and
torchvision state dicts, safetensors, the wrappers of DDP and ``torch.compile``), ``model.mismatched``, and
``model.freeze``/``model.unfreeze_at``: frozen tensors never move, get no optimizer state, keep their BatchNorm
statistics; a resume across ``unfreeze_at`` is bit-identical; two processes train as one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from bigbatch.config import load_config
from bigbatch.engine.start_weights import load_weights_file, matched_names
from bigbatch.errors import UserError
from bigbatch.models import build_classifier
from tests.helpers import (
    COMMON,
    StopAfter,
    assert_same_weights,
    run_main,
    torchrun,
    weights,
    write_photo_folder,
)

SHORT = ["steps=2", "batch=32", "subdivisions=1", "data.size=16", "model.width=8", "log.tensorboard=false",
         "eval.every=100", "schedule.warmup=[]"]


def classifier(name: str, classes: int, seed: int = 0, size: int = 32) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = load_config("digits", [f"model.name={name}", f"data.size={size}", "model.width=8"])
    return build_classifier(cfg.model, classes, 3, size)


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("start") / "digits"
    result = run_main("train", "digits", "--out", str(out), "--set", *SHORT, "ema.decay=0.9")
    assert result.returncode == 0, result.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> Path:
    return write_photo_folder(tmp_path_factory.mktemp("photos") / "set", train=6, val=2)


def test_a_run_of_another_class_count_loads_all_but_its_head_with_reinit(digits_run):
    """small_cnn of 10 classes into 3: ``error`` names the head with both shapes; ``reinit`` keeps its new
    initialisation and loads every other tensor bit for bit (the EMA's, by default; the raw ones on request)."""
    state = torch.load(digits_run / "checkpoints" / "last.pt", weights_only=True)
    model = classifier("small_cnn", 3)
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(UserError, match=r"^model.mismatched: .* has tensors of other shapes: head.weight \[10, 32\] in "
                                        r"the file, \[3, 32\] here; head.bias \[10\] in the file, \[3\] here; set "
                                        r"model.mismatched=reinit"):
        load_weights_file(model, digits_run)
    started = load_weights_file(model, digits_run, mismatched="reinit")
    assert started.reinitialised == ["head.weight", "head.bias"] and started.missing == []
    assert len(started.loaded) == started.total - 2 and "EMA weights" in started.source
    after = model.state_dict()
    for key, value in state["ema"]["module"].items():
        if key.startswith("head."):
            assert torch.equal(after[key], fresh[key])
        else:
            assert torch.equal(after[key], value), key
    raw = load_weights_file(classifier("small_cnn", 3), digits_run, weights_from="raw", mismatched="reinit")
    assert "raw weights" in raw.source
    assert "loaded 18 of 20 tensors" in started.line() and "reinitialised: head.weight, head.bias" in started.line()


@pytest.mark.parametrize("family", ["timm/resnet10t", "resnet18"])
@pytest.mark.parametrize("form", ["pth", "safetensors", "ddp-under-state_dict"])
def test_a_timm_or_torchvision_state_dict_starts_a_classifier_of_other_classes(tmp_path, family, form):
    """Their own 1000-class state dicts (as ``timm.create_model(...).state_dict()`` and torchvision's ``.pth``
    files hold them) into a 4-class model: everything but the classifier (timm's ``fc``, torchvision's ``fc``)."""
    source = classifier(family, 1000, seed=1)
    state = source.state_dict()
    path = tmp_path / ("w.safetensors" if form == "safetensors" else "w.pth")
    if form == "safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, path)
    elif form == "pth":
        torch.save(state, path)
    else:  # a training script's checkpoint of a DDP model
        torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in state.items()}}, path)
    model = classifier(family, 4)
    started = load_weights_file(model, path, mismatched="reinit")
    assert started.reinitialised == ["fc.weight", "fc.bias"] and started.missing == [] and started.unused == []
    got = model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in state.items() if not k.startswith("fc."))


def test_names_are_matched_through_wrappers_and_one_prefix():
    ours = ["detector.backbone.conv.weight", "detector.head.weight"]
    assert matched_names(["backbone.conv.weight", "head.weight"], ours) == {
        "detector.backbone.conv.weight": "backbone.conv.weight", "detector.head.weight": "head.weight"}
    assert matched_names(["module._orig_mod.network.layers.0.weight"], ["layers.0.weight"]) == {
        "layers.0.weight": "module._orig_mod.network.layers.0.weight"}


def test_a_file_of_another_model_or_kind_is_one_line(tmp_path, digits_run):
    model = classifier("small_cnn", 10)
    other = tmp_path / "other.pt"
    torch.save({"encoder.weight": torch.zeros(3)}, other)
    with pytest.raises(UserError, match=r"^model.weights: .*other.pt \(a state dict\) matches none of the model's 20 "
                                        r"tensors by name \(its first: encoder.weight"):
        load_weights_file(model, other)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((digits_run / "checkpoints" / "last.pt").read_bytes()[:2000])
    with pytest.raises(UserError, match=r"^model.weights: .*truncated.pt is not a readable torch file"):
        load_weights_file(model, truncated)
    with pytest.raises(UserError, match=r"^model.weights: .* is a folder without checkpoints/last.pt"):
        load_weights_file(model, tmp_path)


def test_a_run_starts_from_another_task_frozen_and_its_backbone_never_moves(digits_run, photos, tmp_path):
    """A digits run (10 classes) starts a 3-class folder run with its backbone frozen: the summary is printed and
    recorded, config.yaml reads back, every backbone tensor (BatchNorm statistics included) is the start's bit for
    bit, the head moved, and the optimizer keeps state for the head's parameters only."""
    out = tmp_path / "tuned"
    result = run_main("train", "digits", "--out", str(out), "--set", *SHORT, "data.name=folder",
                      f"data.path={photos}", f"model.weights={digits_run}", "model.weights_from=raw",
                      "model.mismatched=reinit", "model.freeze=backbone", "steps=3")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "model.weights: loaded 18 of 20 tensors" in result.stdout and "reinitialised: head.weight, head.bias" \
        in result.stdout
    assert "frozen: 9 parameter tensors for the whole run (model.freeze: backbone)" in result.stdout
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"event"' in line]
    started = next(e for e in events if e["event"] == "weights")
    assert started["loaded"] == 18 and started["reinitialised"] == ["head.weight", "head.bias"]
    assert load_config(str(out / "config.yaml")).model.freeze == "backbone"
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["weights"] == str(digits_run)
    start = weights(digits_run)
    end = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    for key, value in end["model"].items():
        if key.startswith("head."):
            assert value.shape[0] == 3
        else:
            assert torch.equal(value, start[key]), f"{key} moved while frozen"
    assert not torch.equal(end["model"]["head.weight"], classifier("small_cnn", 3).state_dict()["head.weight"])
    assert len(end["optimizer"]["state"]) == 2, "optimizer state for the head's weight and bias only"


@pytest.mark.parametrize("unfreeze_at", [3, 1])
def test_a_resume_across_unfreeze_at_is_bit_identical(digits_run, tmp_path, unfreeze_at):
    """Frozen until ``unfreeze_at``, stopped after step 2 and resumed (before the freeze ends, or after): the run ends
    where one that was never stopped does, bit for bit, BatchNorm statistics included (the unfrozen layers' BatchNorm
    trains again from the step the freeze ends, resumed or not); frozen tensors moved only after it ended."""
    from bigbatch.registry import HOOKS

    settings = [*SHORT, "steps=5", "checkpoint.every=1", f"model.weights={digits_run}", "model.weights_from=raw",
                "model.freeze=1", f"model.unfreeze_at={unfreeze_at}"]
    straight = run_main("train", "digits", "--out", str(tmp_path / "straight"), "--set", *settings)
    assert straight.returncode == 0, straight.stderr[-2000:]
    HOOKS.register("stop_after_2", lambda run: StopAfter(2))
    try:
        stopped = run_main("train", "digits", "--out", str(tmp_path / "resumed"), "--set", *settings)
    finally:
        HOOKS.unregister("stop_after_2")
    assert stopped.returncode != 0
    frozen = torch.load(tmp_path / "resumed" / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert torch.equal(frozen["features.0.0.weight"], weights(digits_run)["features.0.0.weight"]) == (unfreeze_at > 2)
    resumed = run_main("train", "--resume", str(tmp_path / "resumed"))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    a, b = weights(tmp_path / "straight"), weights(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["features.0.0.weight"], weights(digits_run)["features.0.0.weight"]), "unfrozen at step 3"


def test_two_processes_train_a_freeze_that_ends_as_one_process(digits_run, tmp_path):
    """Under torchrun the DDP wrapper is built again when the freeze ends: the weights are one process's."""
    settings = [f"model.weights={digits_run}", "model.freeze=backbone", "model.unfreeze_at=2", "steps=4",
                "model.norm=group", "model.mismatched=reinit"]
    single = run_main("train", "digits", "--out", str(tmp_path / "one"), "--set", *COMMON, *settings,
                      "subdivisions=2")
    assert single.returncode == 0, single.stderr[-2000:]
    multi = torchrun(tmp_path / "two", *settings, "subdivisions=1")
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert_same_weights(weights(tmp_path / "one"), weights(tmp_path / "two"))


@pytest.mark.parametrize("optimizer", ["sgd", "lars", "lamb"])
def test_backbone_lr_scale_moves_the_backbone_by_that_fraction_inside_the_trust_ratio(optimizer):
    """The first update of each tensor with ``optim.backbone_lr_scale=0.1`` is 0.1 times the update without it in the
    backbone (LARS's and LAMB's trust ratios are per tensor, so they compose with it), the same in the head; the
    weight-decay groups are kept."""
    from bigbatch.largebatch.optim import build_optimizer, set_lr

    images, labels = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0)), torch.arange(8) % 3

    def first_update(scale: float) -> dict[str, torch.Tensor]:
        model = classifier("small_cnn", 3, size=16)
        start = {k: v.clone() for k, v in model.named_parameters()}
        cfg = load_config("digits", [f"optim.name={optimizer}", "optim.weight_decay=0.01",
                                     "optim.no_decay_norm_bias=true", f"optim.backbone_lr_scale={scale}"])
        opt = build_optimizer(cfg.optim, model, 0.05, "small_cnn")
        assert len(opt.param_groups) == (4 if scale != 1 else 2)
        set_lr(opt, 0.05)
        torch.nn.functional.cross_entropy(model(images), labels).backward()
        opt.step()
        return {k: v.detach() - start[k] for k, v in model.named_parameters()}

    plain, scaled = first_update(1.0), first_update(0.1)
    for name, delta in plain.items():
        expected = delta if name.startswith("head.") else 0.1 * delta
        torch.testing.assert_close(scaled[name], expected, rtol=1e-3, atol=1e-7, msg=name)  # w - w0: float32 rounding


def test_a_detector_of_another_class_count_starts_with_its_classifier_reinitialised(tmp_path):
    from bigbatch.models.detectors import build_detector

    torch.manual_seed(0)
    five = build_detector("fasterrcnn_mobilenet_v3_large_fpn", 5, min_size=64, max_size=64)
    torch.save({"model": five.state_dict(), "format": 1, "step": 7, "config": {}}, tmp_path / "five.pt")
    three = build_detector("fasterrcnn_mobilenet_v3_large_fpn", 3, min_size=64, max_size=64)
    started = load_weights_file(three, tmp_path / "five.pt", mismatched="reinit")
    assert started.reinitialised == ["detector.roi_heads.box_predictor.cls_score.weight",
                                     "detector.roi_heads.box_predictor.cls_score.bias",
                                     "detector.roi_heads.box_predictor.bbox_pred.weight",
                                     "detector.roi_heads.box_predictor.bbox_pred.bias"]
    assert "checkpoint of step 7" in started.source and started.missing == []


def test_a_freeze_past_the_last_layer_is_one_line(tmp_path):
    result = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", *SHORT, "model.freeze=9")
    assert result.returncode == 2
    assert result.stderr == "error: model.freeze: 9 is past the model's last layer (it has 3 top-level children)\n"
    missing = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", *SHORT,
                       f"model.weights={tmp_path / 'nowhere.pt'}")
    assert missing.returncode == 2
    assert missing.stderr == f"error: model.weights: {tmp_path / 'nowhere.pt'} does not exist\n"
    assert not (tmp_path / "run").exists(), "refused before any work"
    from types import SimpleNamespace

    from bigbatch.config import RECIPES_DIR
    from bigbatch.darknet.detector import DarknetDetector
    from bigbatch.darknet.models import darknet_network
    from bigbatch.largebatch.freeze import freeze_groups

    network = darknet_network(str(RECIPES_DIR / "yolov3-tiny-shapes.cfg"), None, 64)
    with pytest.raises(UserError, match=r"^model.freeze: backbone is not defined for a Darknet cfg"):
        freeze_groups(DarknetDetector(network), SimpleNamespace(freeze="backbone", name="darknet"), None)
    with pytest.raises(UserError, match=r"^model.freeze: 99 is past the model's last layer \(it has 24 layers\)$"):
        freeze_groups(DarknetDetector(network), SimpleNamespace(freeze=99, name="darknet"), None)
    groups = freeze_groups(DarknetDetector(network), SimpleNamespace(freeze=3, name="darknet"), 5)
    assert groups[0].until == 5 and {name.split(".")[2] for name in groups[0].names} == {"0", "2"}  # 1: a maxpool


def test_only_the_leading_wrappers_are_taken_off_a_name(tmp_path):
    """``module.`` inside a name (timm's ``se_module``, ``context_module``) is the model's own: a squeeze-excitation
    ResNet's state dict, saved under DDP and ``torch.compile`` wrappers, loads every tensor into the same network
    (legacy_seresnet18's ``layer1.0.se_module.fc1.weight`` became ``layer1.0.se_fc1.weight`` and kept its random
    initialisation)."""
    import timm

    from bigbatch.engine.start_weights import unwrapped

    assert unwrapped("module._orig_mod.module.layer1.0.se_module.fc1.weight") == "layer1.0.se_module.fc1.weight"
    assert unwrapped("_orig_mod.module.context_module.weight") == "context_module.weight"
    torch.manual_seed(0)
    source = timm.create_model("legacy_seresnet18", num_classes=10)
    state = source.state_dict()
    assert any(".se_module." in k for k in state)
    torch.save({"state_dict": {f"module._orig_mod.{k}": v for k, v in state.items()}}, tmp_path / "se.pth")
    torch.manual_seed(1)
    model = timm.create_model("legacy_seresnet18", num_classes=10)
    started = load_weights_file(model, tmp_path / "se.pth")
    assert started.missing == [] and started.unused == [] and len(started.loaded) == len(state)
    got = model.state_dict()
    assert all(torch.equal(got[k], v) for k, v in state.items())


@pytest.mark.parametrize("ema_key", ["state_dict_ema", "model_ema"])
def test_weights_from_chooses_between_a_timm_checkpoints_raw_and_ema_state_dicts(tmp_path, ema_key):
    """A timm training checkpoint holds both ``state_dict`` and ``state_dict_ema`` (``model_ema`` in older ones):
    ``model.weights_from: ema`` (the default) takes the EMA, as timm's own ``load_checkpoint(use_ema=True)`` does,
    ``raw`` the raw weights; the line says which entry loaded. A file with one of them loads it either way."""
    from timm.models import load_checkpoint

    raw, ema = classifier("timm/resnet10t", 10, seed=1), classifier("timm/resnet10t", 10, seed=2)
    path = tmp_path / "model_best.pth.tar"
    torch.save({"epoch": 5, "arch": "resnet10t", "state_dict": raw.state_dict(), ema_key: ema.state_dict()}, path)
    reference = classifier("timm/resnet10t", 10, seed=3)
    load_checkpoint(reference, str(path))  # timm's default: use_ema=True
    for weights_from, expected in (("ema", reference.state_dict()), ("raw", raw.state_dict())):
        model = classifier("timm/resnet10t", 10, seed=4)
        started = load_weights_file(model, path, weights_from=weights_from)
        assert all(torch.equal(model.state_dict()[k], v) for k, v in expected.items()), weights_from
        entry = ema_key if weights_from == "ema" else "state_dict"
        assert f"under {entry!r}" in started.line(), started.line()
    assert all(torch.equal(reference.state_dict()[k], v) for k, v in ema.state_dict().items())
    torch.save({"epoch": 5, "state_dict": raw.state_dict()}, tmp_path / "raw_only.pth")
    model = classifier("timm/resnet10t", 10, seed=4)
    started = load_weights_file(model, tmp_path / "raw_only.pth")
    assert "under 'state_dict'" in started.source and "holds no EMA" in started.source
    assert all(torch.equal(model.state_dict()[k], v) for k, v in raw.state_dict().items())


def test_an_imagenet_resnet50_state_dict_starts_a_detectors_backbone(tmp_path):
    """torchvision's ``resnet50()`` state dict (what its ``weights_backbone`` loads) into bigbatch's
    ``fasterrcnn_resnet50_fpn``, whose backbone lies under ``detector.backbone.body.``, three dotted parts deep: every
    backbone tensor (BatchNorm statistics included) is the file's, bit for bit; the ImageNet ``fc`` is not used; the
    FPN and heads keep their initialisation. Before, only prefixes of one or two parts were tried: "matches none"."""
    import torchvision

    from bigbatch.models.detectors import build_detector

    torch.manual_seed(0)
    source = torchvision.models.resnet50()
    with torch.no_grad():  # statistics unlike a fresh BatchNorm's, so that a tensor left alone cannot pass as loaded
        for module in source.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_()
                module.running_var.uniform_(1, 2)
                module.num_batches_tracked.fill_(7)
    state = source.state_dict()
    torch.save(state, tmp_path / "resnet50.pth")
    detector = build_detector("fasterrcnn_resnet50_fpn", 5, min_size=128, max_size=160)
    fresh = {k: v.clone() for k, v in detector.state_dict().items()}
    started = load_weights_file(detector, tmp_path / "resnet50.pth")
    body = "detector.backbone.body."
    got = detector.state_dict()
    backbone = [k for k in got if k.startswith(body)]
    assert len(backbone) == len(state) - 2 and sorted(started.loaded) == sorted(backbone)
    assert all(torch.equal(got[k], state[k[len(body):]]) for k in backbone)
    assert started.unused == ["fc.weight", "fc.bias"] and started.reinitialised == []
    assert all(torch.equal(got[k], fresh[k]) for k in got if not k.startswith(body))
    assert f"loaded {len(backbone)} of {len(got)} tensors" in started.line()


def test_the_prefix_chosen_is_the_one_that_matches_most_tensors_of_the_same_shape():
    """Of two prefixes mapping as many names, the one whose tensors have the same shapes wins; of equal scores, the
    empty prefix, then the shorter, whatever the order of the names."""
    t = torch.zeros
    ours = {"a.x.weight": t(3), "b.c.x.weight": t(5)}
    assert matched_names({"x.weight": t(5)}, ours) == {"b.c.x.weight": "x.weight"}
    assert matched_names({"x.weight": t(3)}, ours) == {"a.x.weight": "x.weight"}
    assert matched_names(["x.weight"], dict(reversed(ours.items()))) == {"a.x.weight": "x.weight"}
    assert matched_names({"m.x.weight": t(2)}, {"x.weight": t(2), "q.m.x.weight": t(2)}) == {
        "q.m.x.weight": "m.x.weight"}
