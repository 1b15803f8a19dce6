"""Training Darknet networks in bigbatch's engine: the same loss for any batch layout, .weights in and out of a run,
mixed precision with the update_ratio loss scale and the memory log, and the yolov3-tiny-shapes recipe learning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import run_main, torchrun, write_shapes_set

QUICK = ["log.tensorboard=false", "data.workers=0", "eval.batch=50"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return write_shapes_set(tmp_path_factory.mktemp("shapes") / "set", 250)


def network_weights(out: Path) -> dict[str, torch.Tensor]:
    from bigbatch.darknet.models import network_state

    return network_state(torch.load(out / "checkpoints" / "last.pt", weights_only=True))


def test_the_loss_its_terms_and_the_update_are_the_same_for_1_and_4_subdivisions_and_2_processes(shapes, tmp_path):
    """Darknet's batch/subdivisions meaning: one step of batch 16 as 1 micro-batch of 16 or 4 of 4, or under torchrun
    2 processes of 2 of 4, gives the same loss, the same loss terms and the same weights (BatchNorm frozen during a
    burn-in of 2 steps, so that its batch statistics do not depend on the layout; the loss is per image). The terms
    sum to the loss; under torchrun the record's are the global batch's, not rank 0's half."""
    settings = [f"data.path={shapes}", *QUICK, "batch=16", "steps=2", "eval.every=100", "checkpoint.every=2",
                "norm.freeze_during_warmup=true", "data.jitter=0", "optim.lr=0.01", "schedule.darknet.burn_in=2"]
    outs = {layout: tmp_path / layout for layout in ("1x1", "1x4", "2x2")}
    for subdivisions in (1, 4):
        result = run_main("train", "yolov3-tiny-shapes", "--out", str(outs[f"1x{subdivisions}"]), "--set",
                          *settings, f"subdivisions={subdivisions}")
        assert result.returncode == 0, result.stderr[-2000:]
    result = torchrun(outs["2x2"], "subdivisions=2", config="yolov3-tiny-shapes", common=settings)
    assert result.returncode == 0, result.stderr[-3000:]
    logged = {layout: [r for r in records(out) if "loss" in r] for layout, out in outs.items()}
    keys = ("loss", "loss_box", "loss_obj", "loss_cls")  # the terms: each the mean over the micro-batches
    for layout in ("1x4", "2x2"):
        assert [r["step"] for r in logged[layout]] == [r["step"] for r in logged["1x1"]] == [1, 2]
        for a, b in zip(logged["1x1"], logged[layout], strict=True):
            assert [b[k] for k in keys] == pytest.approx([a[k] for k in keys], rel=1e-5), layout
    for r in logged["1x1"]:
        assert sum(r[k] for k in keys[1:]) == pytest.approx(r["loss"], rel=1e-6)
    a = network_weights(outs["1x1"])
    for layout in ("1x4", "2x2"):
        b = network_weights(outs[layout])
        for key in a:
            assert torch.allclose(a[key], b[key], rtol=1e-4, atol=1e-6), (layout, key)


def test_weights_files_start_a_run_and_come_out_of_it(shapes, tmp_path):
    """A .weights file written by ``export`` starts a run (model.weights); the run's weights, exported, read back
    as the checkpoint holds them."""
    from bigbatch.darknet.models import darknet_network, load_darknet_weights

    start = tmp_path / "start.weights"
    assert run_main("export", "yolov3-tiny-shapes.cfg", "--darknet-weights", str(start)).returncode == 2  # no file
    result = run_main("export", "bigbatch/configs/yolov3-tiny-shapes.cfg", "--darknet-weights", str(start),
                      "--seed", "7")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "run"
    result = run_main("train", "yolov3-tiny-shapes", "--out", str(out), "--set", f"data.path={shapes}", *QUICK,
                      "batch=8", "steps=1", "eval.every=100", f"model.weights={start}")
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = darknet_network("yolov3-tiny-shapes.cfg", size=128)
    load_darknet_weights(loaded, start)
    trained = network_weights(out)
    # the first step's learning rate is lr * (1 / burn_in)^4 = 4e-11: the convolutions are still the file's
    for key, value in loaded.state_dict().items():
        if key.endswith("conv.weight"):
            assert torch.allclose(trained[key], value, atol=1e-6), key
    exported = tmp_path / "trained.weights"
    result = run_main("export", str(out), "--darknet-weights", str(exported))
    assert result.returncode == 0, result.stderr
    assert "seen 8" in result.stdout
    back = darknet_network("yolov3-tiny-shapes.cfg", size=128)
    assert load_darknet_weights(back, exported) == 8
    for key, value in back.state_dict().items():
        if not key.endswith("num_batches_tracked"):  # Darknet's file has no such counter
            assert torch.equal(value, trained[key]), key


def test_mixed_precision_with_the_update_ratio_loss_scale_and_the_memory_log(shapes, tmp_path):
    out = tmp_path / "bf16"
    result = run_main("train", "yolov3-tiny-shapes", "--out", str(out), "--set", f"data.path={shapes}", *QUICK,
                      "batch=8", "steps=3", "eval.every=3", "precision.dtype=bf16",
                      "precision.loss_scale=update_ratio", "memory.interval=0.01")
    assert result.returncode == 0, result.stderr[-2000:]
    train = [r for r in records(out) if "loss" in r]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in train) and "loss_scale" in train[-1]
    assert train[-1]["skipped"] == 0
    memory = (out / "memory.csv").read_text().splitlines()
    assert len(memory) >= 2 and "rss" in memory[0]
    val = [r for r in records(out) if r.get("split") == "val"][-1]
    assert "mAP50" in val and val["images"] == 50


@pytest.mark.slow  # make test-slow: keeps make test under 10 minutes on 2 cores
def test_yolov3_tiny_shapes_learns_a_small_set(tmp_path):
    """The recipe at test size: 16 generated images at 96 px, evaluated on themselves (what a network that learns
    must fit first), past 0.5 mAP@0.5 in 100 steps of 16 (it reached 0.91; 0.05 halfway; 33 s on the 2-core machine).
    BatchNorm momentum 0.1: Darknet's 0.01 averages its running statistics over ~100 steps, too slow for this run."""
    root = tmp_path / "set"
    assert run_main("data", "shapes", "--out", str(root), "--images", "20", "--seed", "0").returncode == 0
    split = [f"data.{s}.images={root / 'train'}" for s in ("train", "val")]
    split += [f"data.{s}.annotations={root / 'annotations' / 'train.json'}" for s in ("train", "val")]
    out = tmp_path / "run"
    result = run_main("train", "yolov3-tiny-shapes", "--out", str(out), "--set", *QUICK, "data.name=coco", *split,
                      "data.jitter=0", "data.flip=0", "batch=16",
                      "optim.ref_batch=16", "steps=100", "eval.every=50", "checkpoint.every=100", "data.size=96",
                      "schedule.darknet.burn_in=20", "schedule.darknet.steps=[80, 90]", "norm.momentum=0.1")
    assert result.returncode == 0, result.stderr[-2000:]
    val = [r["mAP50"] for r in records(out) if r.get("split") == "val"]
    assert val[-1] > 0.5 and val[-1] > val[0] + 0.3, val


@pytest.mark.parametrize(("recipe", "parameters", "peer"), [
    ("yolov4-tiny-3l-shapes", 6_125_178, 12_134_698),  # Ultralytics' yolov3-tinyu at 5 classes
    ("yolov4-tiny-3l-slim-shapes", 2_400_750, 2_505_750),  # Ultralytics' yolo26n at 5 classes (yolo11n: 2,590,815)
])
def test_the_yolov4_tiny_3l_recipes_train_their_three_heads(shapes, tmp_path, recipe, parameters, peer):
    """The recipes measured against Ultralytics (docs/benchmarks.md): AlexeyAB's yolov4-tiny-3l (heads at strides 32,
    16 and 8, nine anchors) and its slim form (every width at 5/8), each with fewer parameters than the Ultralytics
    model it was measured against, and a few AdamW steps that lower its loss."""
    from bigbatch.darknet.models import darknet_network

    network = darknet_network(f"{recipe}.cfg", size=128)
    heads = sorted(network.yolo_heads, key=lambda head: head.output)
    assert [head.spec.mask for head in heads] == [(6, 7, 8), (3, 4, 5), (0, 1, 2)]
    assert all(len(head.spec.anchors) == 9 and head.spec.iou_thresh == pytest.approx(0.213) for head in heads)
    assert sum(p.numel() for p in network.parameters()) == parameters < peer
    out = tmp_path / "run"
    result = run_main("train", recipe, "--out", str(out), "--set", f"data.path={shapes}", *QUICK,
                      "steps=12", "batch=16", "eval.every=12", "checkpoint.every=12", "log.every=1")
    assert result.returncode == 0, result.stderr
    train = [r for r in records(out) if "loss" in r and "split" not in r]
    assert [r["step"] for r in train] == list(range(1, 13))
    assert sum(r["loss"] for r in train[-3:]) < sum(r["loss"] for r in train[:3])


def test_a_cfg_run_keeps_its_network_and_evaluates_resumes_and_exports_after_the_cfg_is_moved(shapes, tmp_path,
                                                                                               capsys):
    """Darknet's 80-class yolov3-tiny.cfg trained on the 5-class shapes set: the run directory keeps the cfg as the
    run built it (classes=5, filters=30 before each [yolo], every other line as written), so that once the user's
    cfg is moved, ``eval``, ``--resume`` and ``export`` still work; the exported .weights come with that cfg beside
    them, and the two load together."""
    from bigbatch.cli import main
    from bigbatch.darknet import read_darknet_cfg
    from bigbatch.darknet.models import darknet_network, load_darknet_weights
    from tests.helpers import DARKNET_DATA

    mine = tmp_path / "mine.cfg"
    mine.write_bytes((DARKNET_DATA / "yolov3-tiny.cfg").read_bytes())
    run = tmp_path / "run"
    small = [f"data.path={shapes}", *QUICK, "batch=8", "subdivisions=2", "data.size=64", "data.multiscale.sizes=null",
             "eval.every=100"]
    assert main(["train", str(mine), "--out", str(run), "--set", *small, "steps=1"]) == 0, capsys.readouterr().err
    kept = (run / "model.cfg").read_text().split("\n")
    original = mine.read_text().split("\n")
    assert kept[0].startswith("# kept by bigbatch:") and len(kept) == len(original) + 1
    changed = [(a, b) for a, b in zip(original, kept[1:], strict=True) if a != b]
    assert changed == [("filters=255", "filters=30"), ("classes=80", "classes=5")] * 2
    network = read_darknet_cfg(run / "model.cfg")
    assert [yolo.classes for yolo in network.yolo_layers] == [5, 5]

    mine.rename(tmp_path / "moved.cfg")
    assert main(["eval", str(run)]) == 0, capsys.readouterr().err
    assert main(["train", "--resume", str(run), "--set", "steps=2"]) == 0, capsys.readouterr().err
    assert json.loads((run / "eval-last.json").read_text())["step"] == 1
    weights = tmp_path / "trained.weights"
    assert main(["export", str(run), "--darknet-weights", str(weights)]) == 0, capsys.readouterr().err
    beside = weights.with_suffix(".cfg")
    assert beside.read_text().split("\n")[1:] == kept[1:]  # the network the weights are of, for Darknet
    back = darknet_network(str(beside), size=64)
    assert load_darknet_weights(back, weights) == 16  # 2 steps of 8 images: Darknet's seen
    trained = network_weights(run)
    for key, value in back.state_dict().items():
        if not key.endswith("num_batches_tracked"):
            assert torch.equal(value, trained[key]), key


def test_weights_of_another_class_count_load_by_name_with_their_cfg_or_as_a_backbone(shapes, tmp_path, capsys):
    """An 80-class yolov3-tiny .weights for a 5-class run with ``model.mismatched=reinit``: with the cfg it was
    written for (``model.weights_cfg``), every tensor but the two heads' loads by name; without it, the layers before
    the first head, as a .conv.15 backbone, and the run says so."""
    from bigbatch.cli import main
    from tests.helpers import DARKNET_DATA

    coco = tmp_path / "coco80.weights"
    assert main(["export", str(DARKNET_DATA / "yolov3-tiny.cfg"), "--darknet-weights", str(coco)]) == 0
    capsys.readouterr()
    small = [f"data.path={shapes}", *QUICK, "batch=8", "data.size=64", "data.multiscale.sizes=null", "steps=1",
             "eval.every=100", f"model.weights={coco}", "model.mismatched=reinit"]
    assert main(["train", "yolov3-tiny-shapes", "--out", str(tmp_path / "a"), "--set", *small,
                 f"model.weights_cfg={DARKNET_DATA / 'yolov3-tiny.cfg'}"]) == 0
    out = capsys.readouterr().out
    assert "reinitialised: layers.15.conv.weight, layers.15.conv.bias, layers.22.conv.weight, layers.22.conv.bias;" \
        in out, out
    assert main(["train", "yolov3-tiny-shapes", "--out", str(tmp_path / "b"), "--set", *small]) == 0
    out = capsys.readouterr().out
    assert "no model.weights_cfg names its cfg: loaded its first 15 layers" in out, out


def test_weights_of_another_class_count_name_the_layers_that_load_and_the_command_that_keeps_them(shapes, tmp_path,
                                                                                                  capsys):
    """An 80-class yolov3-tiny .weights for a 5-class run: the error says the file is larger than the whole network
    and gives the ``export --upto N`` command (N: the layers before the first class-dependent one); that command,
    run as printed, writes a backbone the run then starts from."""
    import shlex

    from bigbatch.cli import main
    from tests.helpers import DARKNET_DATA

    coco = tmp_path / "coco80.weights"
    assert main(["export", str(DARKNET_DATA / "yolov3-tiny.cfg"), "--darknet-weights", str(coco)]) == 0
    capsys.readouterr()
    small = [f"data.path={shapes}", *QUICK, "batch=8", "data.size=64", "data.multiscale.sizes=null", "steps=1",
             "eval.every=100"]
    assert main(["train", "yolov3-tiny-shapes", "--out", str(tmp_path / "a"), "--set", *small,
                 f"model.weights={coco}"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "larger than the whole network" in err, err
    assert "nearest" not in err and "--upto 15" in err, err
    command = shlex.split(err.split("`")[1])
    assert command[:2] == ["bigbatch", "export"] and main(command[1:]) == 0, capsys.readouterr().err
    backbone = tmp_path / "coco80.conv.15"
    assert "the first 15 layers" in capsys.readouterr().out
    assert main(["train", "yolov3-tiny-shapes", "--out", str(tmp_path / "b"), "--set", *small,
                 f"model.weights={backbone}"]) == 0, capsys.readouterr().err


def test_darknet_weights_count_and_list_no_batch_counter_as_missing(tmp_path):
    """A Darknet file never holds BatchNorm's ``num_batches_tracked`` (Darknet has no such counter): loading a whole
    ``.weights`` reports every tensor loaded and "missing: none" (it reported "loaded 111 of 132 ... missing:
    layers.0.bn.num_batches_tracked ..."); a ``.conv.N`` misses only the later layers' weights and statistics."""
    from types import SimpleNamespace

    from bigbatch.darknet import write_weights
    from bigbatch.darknet.detector import DarknetDetector
    from bigbatch.darknet.models import darknet_network, darknet_start
    from tests.helpers import DARKNET_DATA

    cfg = str(DARKNET_DATA / "yolov3-tiny.cfg")
    source = darknet_network(cfg, 80, 64)
    whole, backbone = tmp_path / "tiny.weights", tmp_path / "tiny.conv.15"
    write_weights(source, whole, seen=0)
    write_weights(source, backbone, seen=0, upto=15)
    values = [k for k in source.state_dict() if not k.endswith("num_batches_tracked")]
    settings = dict(weights_cfg=None, mismatched="error", darknet_dialect="alexeyab")
    started = darknet_start(DarknetDetector(darknet_network(cfg, 80, 64)), SimpleNamespace(weights=str(whole),
                                                                                              **settings))
    assert started.total == len(values) and started.loaded == values and started.missing == []
    assert f"loaded {len(values)} of {len(values)} tensors" in started.line() and "missing: none" in started.line()
    started = darknet_start(DarknetDetector(darknet_network(cfg, 80, 64)), SimpleNamespace(weights=str(backbone),
                                                                                              **settings))
    later = [k for k in values if int(k.split(".")[1]) >= 15]
    assert started.total == len(values) and started.missing == later and started.loaded == values[:-len(later)]


def test_darknet_weights_read_through_their_cfg_count_no_batch_counter(tmp_path):
    """Through ``model.weights_cfg`` (the file read into the network of its cfg, then matched by name) a Darknet file
    also loads no ``num_batches_tracked``: "loaded N of N", where it counted the fresh source network's counters as
    loaded from the file (70 of 70 for yolov3-tiny's 59)."""
    from types import SimpleNamespace

    from bigbatch.darknet import write_weights
    from bigbatch.darknet.detector import DarknetDetector
    from bigbatch.darknet.models import darknet_network, darknet_start
    from tests.helpers import DARKNET_DATA

    cfg = str(DARKNET_DATA / "yolov3-tiny.cfg")
    source = darknet_network(cfg, 80, 64)
    whole = tmp_path / "tiny.weights"
    write_weights(source, whole, seen=0)
    values = [k for k in source.state_dict() if not k.endswith("num_batches_tracked")]
    started = darknet_start(DarknetDetector(darknet_network(cfg, 80, 64)),
                            SimpleNamespace(weights=str(whole), weights_cfg=cfg, mismatched="error",
                                            darknet_dialect="alexeyab"))
    assert started.total == len(values) and sorted(started.loaded) == sorted(values) and started.missing == []
    assert f"loaded {len(values)} of {len(values)} tensors" in started.line() and "missing: none" in started.line()
