"""Where to add X: an optimizer, a decay kind, a dataset format, a model family, a batch controller is one
definition and one registration (here, in this file), used through the real config and CLI with no other change;
what it registers about itself (its task, its own config keys, its smallest input, its per-step rates) is what the
config checks and ``bigbatch scale`` rescales."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Annotated, Any

import pytest
import torch
import torch.nn as nn
import yaml
from pydantic import Field

from bigbatch.batching import make_plan
from bigbatch.config import (
    Interval,
    Length,
    RunConfig,
    Section,
    load_config,
    validate_config,
)
from bigbatch.data.pipeline.loader import TensorImages
from bigbatch.engine.controllers.base import BatchController, StepBatch
from bigbatch.errors import UserError
from bigbatch.largebatch.rescale import rescale
from bigbatch.largebatch.schedule import build_schedule, scaled_lr
from bigbatch.registry import BATCH_CONTROLLERS, DATASETS, DECAYS, MODELS, OPTIMIZERS
from tests.helpers import run_main, train_records

TINY = ["batch=32", "subdivisions=2", "data.size=8", "model.width=4", "log.tensorboard=false", "eval.every=2",
        "checkpoint.every=2", "memory.interval=60"]


def run(*argv: str) -> tuple[int, str, str]:
    """``bigbatch ARGV`` in this process: (exit code, stdout, stderr)."""
    result = run_main(*argv)
    return result.returncode, result.stdout, result.stderr


def final_weights(out) -> dict[str, torch.Tensor]:
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True)["model"]


# ----------------------------------------------------------------------------- an optimizer


@pytest.fixture
def toy_sgd():
    """Plain SGD (no momentum), the weight decay of each parameter group: obj(param_groups, lr, optim_cfg)."""
    calls = []

    def build(groups: list[dict[str, Any]], lr: float, cfg) -> torch.optim.Optimizer:
        calls.append((lr, cfg.name))
        return torch.optim.SGD(groups, lr=lr)

    OPTIMIZERS.register("toy_sgd", build)
    yield calls
    OPTIMIZERS.unregister("toy_sgd")


def test_a_registered_optimizer_trains_as_the_same_update_written_otherwise(tmp_path, toy_sgd):
    """Two steps with the toy optimizer end at the weights torch's SGD with momentum 0 reaches."""
    toy, reference = tmp_path / "toy", tmp_path / "sgd"
    assert run("train", "digits", "--out", str(toy), "--set", *TINY, "steps=2", "optim.name=toy_sgd")[0] == 0
    assert run("train", "digits", "--out", str(reference), "--set", *TINY, "steps=2", "optim.momentum=0")[0] == 0
    assert [name for _, name in toy_sgd] == ["toy_sgd"]  # built once, from the run's optim section
    toy_weights, reference_weights = final_weights(toy), final_weights(reference)
    assert toy_weights.keys() == reference_weights.keys()
    for key, value in reference_weights.items():
        torch.testing.assert_close(toy_weights[key], value, rtol=0, atol=0)


def test_the_optimizer_names_the_config_takes_are_the_registered_ones(toy_sgd):
    with pytest.raises(UserError, match=r"^optim.name: unknown optimizer 'nope' \(expected one of: sgd, .*toy_sgd\)$"):
        load_config("digits", ["optim.name=nope"])
    OPTIMIZERS.unregister("toy_sgd")
    with pytest.raises(UserError, match=r"^optim.name: unknown optimizer 'toy_sgd'"):
        load_config("digits", ["optim.name=toy_sgd"])


# ----------------------------------------------------------------------------- a decay kind


@pytest.fixture
def toy_halving():
    """A decay kind with a key of its own, a length: the LR halves every ``schedule.decay.halve_every``."""
    from bigbatch.largebatch.schedule import length_in_steps

    def halving(cfg, plan, start, floor):
        every = length_in_steps(cfg.halve_every, plan)
        return lambda t: 0.5 ** math.floor(t / every)

    DECAYS.register("toy_halving", halving, fields={"halve_every": (Interval, 5)})
    yield
    DECAYS.unregister("toy_halving")


def test_bigbatch_schedule_prints_a_registered_decay_kind(toy_halving):
    rc, out, err = run("schedule", "digits", "--set", "schedule.warmup=[]", "schedule.decay.kind=toy_halving",
                       "schedule.decay.halve_every=3", "steps=12", "--lines", "12")
    assert rc == 0, err
    printed = {int(step): float(lr) for step, _, lr in re.findall(r"^\s+(\d+)\s+([\d.]+)\s+(\S+)$", out, re.M)}
    assert printed == {t: pytest.approx(0.1 * 0.5 ** (t // 3), rel=1e-5) for t in range(12)}  # printed to 6 digits


def test_a_decay_kind_key_is_checked_and_rescaled_as_the_length_it_is_typed(toy_halving):
    with pytest.raises(UserError, match=r"^schedule.decay.halve_every: expected a length > 0, got 0$"):
        load_config("digits", ["schedule.decay.kind=toy_halving", "schedule.decay.halve_every=0"])
    cfg = load_config("digits", ["schedule.decay.kind=toy_halving", "schedule.decay.halve_every=3", "steps=12",
                                 "schedule.warmup=[]"])
    new, changes = rescale(cfg, 512)
    assert new.schedule.decay.halve_every == "768 images"  # 1.5 steps of 512: the same 768 images
    assert ("schedule.decay.halve_every", 3, "768 images") in changes
    old_lr, new_lr = build_schedule(cfg, make_plan(cfg, 1, 1437)), build_schedule(new, make_plan(new, 1, 1437))
    for step in range(6):  # the same images seen, the same fraction of the peak LR
        assert new_lr(step) / scaled_lr(new.optim, 512) == pytest.approx(old_lr(2 * step) / scaled_lr(cfg.optim, 256))


# ----------------------------------------------------------------------------- a dataset format


def load_toy_blobs(cfg) -> tuple[TensorImages, TensorImages, int]:
    """Two classes of noise images, class 1 brighter: ``data.toy_count`` training images and a quarter as many
    validation images, at ``data.size`` px."""
    gen = torch.Generator().manual_seed(0)

    def split(n: int) -> TensorImages:
        labels = torch.arange(n) % 2
        images = torch.randn(n, 3, cfg.data.size, cfg.data.size, generator=gen) + labels[:, None, None, None]
        return TensorImages(images, labels)

    return split(cfg.data.toy_count), split(cfg.data.toy_count // 4), 2


@pytest.fixture
def toy_blobs():
    DATASETS.register("toy_blobs", load_toy_blobs, task="classification", count=lambda cfg: cfg.data.toy_count,
                      fields={"toy_count": (Annotated[int, Field(gt=0)], 64)})
    yield
    DATASETS.unregister("toy_blobs")


def test_a_registered_dataset_format_trains_with_a_key_of_its_own(tmp_path, toy_blobs):
    out = tmp_path / "run"
    rc, stdout, err = run("train", "digits", "--out", str(out), "--set", *TINY, "steps=2", "data.name=toy_blobs",
                          "data.toy_count=48")
    assert rc == 0, err
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["data"]["name"] == "toy_blobs" and saved["data"]["toy_count"] == 48
    assert "images seen     64\nepochs          1.33 (of 48 training images)" in stdout  # the format's count
    val = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if r.get("split") == "val"]
    assert val and val[-1]["images"] == 12  # the format's validation set, every image once


def test_a_dataset_format_key_is_typed_defaulted_and_listed(toy_blobs):
    assert load_config("digits", ["data.name=toy_blobs"]).data.toy_count == 64
    assert load_config("digits").data.toy_count == 64  # a key of the section, whatever the format
    with pytest.raises(UserError, match=r"^data.toy_count: input should be greater than 0, got 0$"):
        load_config("digits", ["data.name=toy_blobs", "data.toy_count=0"])
    with pytest.raises(UserError, match=r"^data.toy_count: input should be a valid integer, got 'x'$"):
        load_config("digits", ["data.toy_count=x"])
    with pytest.raises(UserError, match=r"^data.toy_cuont: unknown key, did you mean 'toy_count'\? \(expected one of: "
                                        r"name, .*\btoy_count\b.*\)$"):  # where depends on what registered first
        load_config("digits", ["data.toy_cuont=3"])
    with pytest.raises(UserError, match=r"^data.name: 'toy_blobs' is not a detection dataset; expected shapes, coco "
                                        r"or yolo$"):
        load_config("shapes-detect", ["data.name=toy_blobs"])
    with pytest.raises(UserError, match=r"^data.name: 'shapes' is not a classification dataset; expected digits, "
                                        r"folder, shards or toy_blobs$"):
        load_config("digits", ["data.name=shapes"])
    DATASETS.unregister("toy_blobs")
    with pytest.raises(UserError, match=r"^data.toy_count: unknown key"):
        load_config("digits", ["data.toy_count=3"])


# ----------------------------------------------------------------------------- a model family


class ToyMLP(nn.Module):
    """Average-pooled to 4 x 4, then ``model.toy_depth`` hidden layers of the width the name gives."""

    def __init__(self, hidden: int, depth: int, num_classes: int, in_channels: int):
        super().__init__()
        layers: list[nn.Module] = [nn.AdaptiveAvgPool2d(4), nn.Flatten()]
        width = in_channels * 16
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        self.body = nn.Sequential(*layers, nn.Linear(width, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.fixture
def toy_mlps():
    built = []

    def build(cfg, num_classes: int, in_channels: int) -> nn.Module:
        model = ToyMLP(int(cfg.name.rpartition("_")[2]), cfg.toy_depth, num_classes, in_channels)
        built.append((model, copy.deepcopy(model.state_dict())))
        return model

    MODELS.register_family(lambda: ("toy_mlp_8", "toy_mlp_16"), build, task="classification", min_input_size=4,
                           fields={"toy_depth": (int, 1)})
    yield built
    MODELS.unregister_family(build)


def test_a_registered_model_family_trains(tmp_path, toy_mlps):
    out = tmp_path / "run"
    rc, _, err = run("train", "digits", "--out", str(out), "--set", *TINY, "steps=2", "model.name=toy_mlp_16",
                     "model.toy_depth=2")
    assert rc == 0, err
    trained, initial = toy_mlps[-1]
    assert [m.out_features for m in trained.modules() if isinstance(m, nn.Linear)] == [16, 16, 10]
    weights = final_weights(out)  # the toy's weights, trained
    assert weights.keys() == initial.keys()
    assert all(not torch.equal(weights[k], initial[k]) for k in initial)


def test_a_model_family_checks_its_smallest_input_and_its_task(toy_mlps):
    with pytest.raises(UserError, match=r"^data.size: toy_mlp_8 needs images of at least 4 px, got 2$"):
        load_config("digits", ["model.name=toy_mlp_8", "data.size=2"])
    with pytest.raises(UserError, match=r"^model.name: 'toy_mlp_8' is not a detector \(task: detection\)$"):
        load_config("shapes-detect", ["model.name=toy_mlp_8"])
    assert load_config("digits", ["model.name=toy_mlp_8", "model.weights=w.pt"]).model.weights == "w.pt"  # any family


# ----------------------------------------------------------------------------- bigbatch scale, from the types


def _kind(annotation: Any) -> str | None:
    """``"length"`` or ``"steps"`` when ``annotation`` is (or holds) ``Length``/``Interval`` or ``StepCount``-like
    ``Annotated[int, Steps(...)]``; the config's own type objects, compared by identity."""
    from typing import get_args, get_origin

    from bigbatch.config import Steps

    if annotation is Length or annotation is Interval:
        return "length"
    if get_origin(annotation) is Annotated and any(isinstance(m, Steps) for m in get_args(annotation)[1:]):
        return "steps"
    return next(filter(None, map(_kind, get_args(annotation))), None)


def _typed_keys(cls: type[Section], prefix: str = "") -> dict[str, str]:
    """Every dotted key of a field typed as a length or a step count, found from the source's type hints (a list of
    sections: its first item, ``.0.``)."""
    import typing

    found = {}
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        if name not in cls.model_fields:
            continue
        kind = _kind(hint)
        section = next((a for a in [hint, *typing.get_args(hint)] if isinstance(a, type) and issubclass(a, Section)),
                       None)
        item = typing.get_args(hint)[0] if typing.get_origin(hint) is list else None
        if isinstance(item, type) and issubclass(item, Section):
            found.update(_typed_keys(item, f"{prefix}{name}.0."))
        elif section is not None:
            found.update(_typed_keys(section, f"{prefix}{name}."))
        elif kind is not None:
            found[prefix + name] = kind
    return found


def test_every_field_typed_as_a_length_or_a_step_count_is_rescaled():
    """Each such field set to 40 steps (a list to [40]) is 10 steps at four times the batch."""
    keys = _typed_keys(RunConfig)
    assert {"steps", "eval.every", "clip.start_step", "schedule.warmup.0.length", "schedule.decay.milestones",
            "schedule.darknet.burn_in", "schedule.darknet.steps"} <= keys.keys()
    data = load_config("digits").model_dump(mode="json")
    data.pop("epochs")
    data["schedule"].update(preset="darknet", warmup=[{"kind": "linear"}],  # the darknet section is in use
                            batch=[{"factor": 2}])  # and a batch schedule's milestone
    data["schedule"]["darknet"]["scales"] = [0.1]  # one per darknet step
    for key in keys:
        *parents, last = key.split(".")
        node = data
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        node[last] = [40] if isinstance(node.get(last), list) else 40
    cfg = validate_config(data)
    new, changes = rescale(cfg, cfg.batch * 4)
    rescaled = new.model_dump(mode="json")
    for key in keys:
        value = rescaled
        for part in key.split("."):
            value = value[int(part)] if part.isdigit() else value[part]
        assert value == ([10] if isinstance(value, list) else 10), key


# ----------------------------------------------------------------------------- a batch controller


class SquareRootLR(BatchController):
    """A fourth batch controller: the plan's batch, with the LR scaled by sqrt(batch / 64) (Krizhevsky's square-root
    rule, "One weird trick", 2014), which the training record shows as its gain."""

    def next_step(self, progress) -> StepBatch:
        batch = progress.plan.batch_at(progress.step)
        return StepBatch(batch, gain=math.sqrt(batch / 64))

    def record(self, progress) -> dict[str, Any]:
        return {"gain": math.sqrt(progress.plan.batch_at(progress.step - 1) / 64)}


@pytest.fixture
def toy_controller():
    BATCH_CONTROLLERS.register("sqrt_lr", SquareRootLR, chooses=lambda cfg: cfg.optim.name == "sgd")
    yield
    BATCH_CONTROLLERS.unregister("sqrt_lr")


def test_a_registered_batch_controller_decides_the_lr_gain_of_every_step(tmp_path, toy_controller):
    """The controller (one class, one registration) is asked before the built-in ones for the configs it chooses:
    every step's LR is its gain times the schedule's; a config it does not choose trains as before."""
    plain, toy = tmp_path / "plain", tmp_path / "toy"
    assert run("train", "digits", "--out", str(plain), "--set", *TINY, "steps=3", "log.every=1",
               "optim.name=momentum")[0] == 0
    assert run("train", "digits", "--out", str(toy), "--set", *TINY, "steps=3", "log.every=1", "optim.name=sgd")[0] == 0
    expected = [r["lr"] * math.sqrt(32 / 64) for r in train_records(plain)]
    assert [r["lr"] for r in train_records(toy)] == pytest.approx(expected, rel=1e-12)
    assert [r["gain"] for r in train_records(toy)] == [math.sqrt(0.5)] * 3
    assert all("gain" not in r for r in train_records(plain))
