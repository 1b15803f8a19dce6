"""``model.memory_format``: timm's and torchvision's classifiers train channels-last under ``auto`` (the rest
contiguous), the layout changes the arithmetic by rounding only, and a channels-last run resumes bit-identically.
Also the training loader's prefetch: the workers prepare a whole step."""

from __future__ import annotations

import pytest
import torch

from bigbatch.config import load_config
from bigbatch.data.pipeline.loader import step_prefetch
from bigbatch.models import build_classifier
from bigbatch.registry import HOOKS
from tests.helpers import StopAfter, assert_same_weights, run_main, weights

TIMM = ["model.name=timm/resnet10t", "data.size=32", "batch=16", "subdivisions=2", "steps=3", "eval.every=3",
        "checkpoint.every=1", "log.tensorboard=false", "schedule.warmup=[]", "log.noise_scale=false",
        "log.updates=false"]


def conv_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.dim() == 4]


@pytest.mark.fast
@pytest.mark.parametrize(("name", "setting", "expected"), [
    ("timm/resnet10t", "auto", True), ("resnet18", "auto", True), ("small_cnn", "auto", False),
    ("timm/resnet10t", "contiguous", False), ("small_cnn", "channels_last", True)])
def test_auto_lays_out_timm_and_torchvision_classifiers_channels_last(name, setting, expected):
    cfg = load_config("digits", [f"model.name={name}", f"model.memory_format={setting}"])
    model = build_classifier(cfg.model, 10, 3, 32)
    layouts = {w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
               for w in conv_weights(model) if w.shape[2] * w.shape[3] > 1}
    assert layouts == {expected}


@pytest.mark.fast
def test_a_step_of_micro_batches_is_prefetched():
    assert step_prefetch(8, 1) == 8 and step_prefetch(8, 3) == 3 and step_prefetch(2, 4) == 2
    assert step_prefetch(8, 0) is None


def test_the_layout_changes_the_weights_by_rounding_only(tmp_path):
    """A step of timm's ResNet-10t on digits, channels-last against contiguous: the same update up to float
    rounding (an independent check that nothing but the layout changed; over more steps the network's chaos
    grows the rounding)."""
    for layout in ("channels_last", "contiguous"):
        result = run_main("train", "digits", "--out", str(tmp_path / layout), "--set", *TIMM, "steps=1",
                          f"model.memory_format={layout}")
        assert result.returncode == 0, result.stderr
    last, contiguous = weights(tmp_path / "channels_last"), weights(tmp_path / "contiguous")
    assert any(not torch.equal(last[k], contiguous[k]) for k in last)  # the arithmetic did change order
    assert_same_weights(last, contiguous, atol=1e-4)  # 1e-5 measured (one thread: 3e-8)


def test_a_channels_last_run_resumes_bit_identically(tmp_path):
    reference = run_main("train", "digits", "--out", str(tmp_path / "reference"), "--set", *TIMM)
    assert reference.returncode == 0, reference.stderr
    HOOKS.register("stop_after_2", lambda run: StopAfter(2))
    try:
        stopped = run_main("train", "digits", "--out", str(tmp_path / "stopped"), "--set", *TIMM)
    finally:
        HOOKS.unregister("stop_after_2")
    assert stopped.returncode == 130
    resumed = run_main("train", "--resume", str(tmp_path / "stopped"))
    assert resumed.returncode == 0, resumed.stderr
    expected, actual = weights(tmp_path / "reference"), weights(tmp_path / "stopped")
    assert all(torch.equal(expected[k], actual[k]) for k in expected)
