"""``model.compile`` (engine/compile.py): compiled training matches eager within a stated tolerance, checkpoints keep
the plain module's keys, a compiled run resumes exactly, a failed compilation falls back to eager with one warning
line; under the ``slow`` marker, detection's multi-scale sizes compile at most twice, torchrun with DDP and
cross-device BatchNorm trains the weights one eager process does, and a torchvision detector (FCOS) trains as eager.

torch.compile is slow on the 2-core CPU (tens of seconds a compilation under load; inductor's FX graph cache on disk
makes a repeated one a few seconds): the runs here are the smallest digits model, a few steps, in this process."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from tests.helpers import (
    COMMON,
    assert_same_weights,
    run_main,
    torchrun,
    train_records,
    weights,
    write_shapes_set,
)

TINY = ["data.size=16", "model.width=8", "batch=64", "subdivisions=2", "eval.batch=50", "eval.every=100",
        "log.tensorboard=false", "log.every=1", "schedule.warmup=[]", "schedule.decay={kind: constant}",
        "ema.decay=0.9", "checkpoint.every=5"]
"""A digits run with subdivisions and a weight EMA, its learning rate constant (a shorter run, resumed, sees the same
schedule)."""

LOSS_RTOL = 1e-4
"""Compiled against eager losses, relative, over 10 steps. Inductor fuses and reorders float32 sums (BatchNorm's
statistics, the convolutions' backward), so the two may differ in the last bits; measured: equal to the 6 digits the
record prints on this CPU (torch 2.14.1), the tolerance leaves 100x that."""


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from an empty dynamo cache (its compilations counted alone; inductor's cache on disk
    stays)."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def train(out, *settings: str) -> None:
    result = run_main("train", "digits", "--out", str(out), "--set", *TINY, *settings)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "model.compile" not in result.stderr, result.stderr[-3000:]


def checkpoint(out) -> dict:
    return torch.load(out / "checkpoints" / "last.pt", weights_only=True)


def test_compiled_training_matches_eager_and_its_checkpoints_keep_the_plain_keys(tmp_path):
    train(tmp_path / "eager", "steps=10")
    train(tmp_path / "compiled", "steps=10", "model.compile=default")
    assert counters["stats"]["unique_graphs"] >= 1, "nothing was compiled"
    eager, compiled = train_records(tmp_path / "eager"), train_records(tmp_path / "compiled")
    assert len(compiled) == 10
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=LOSS_RTOL)
    a, b = checkpoint(tmp_path / "eager"), checkpoint(tmp_path / "compiled")
    assert list(b["model"]) == list(a["model"]) and list(b["ema"]["module"]) == list(a["ema"]["module"])
    assert not any("_orig_mod" in key for key in [*b["model"], *b["ema"]["module"]])
    assert_same_weights(a["model"], b["model"], atol=1e-4)
    assert_same_weights(a["ema"]["module"], b["ema"]["module"], atol=1e-4)  # the EMA followed the trained weights


def test_a_compiled_run_resumed_equals_the_uninterrupted_compiled_run(tmp_path):
    train(tmp_path / "whole", "steps=8", "model.compile=default")
    train(tmp_path / "part", "steps=4", "model.compile=default")
    resumed = run_main("train", "--resume", str(tmp_path / "part"), "--set", "steps=8")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = checkpoint(tmp_path / "whole"), checkpoint(tmp_path / "part")
    assert b["step"] == a["step"] == 8
    for key, value in a["model"].items():
        assert torch.equal(b["model"][key], value), key
    for key, value in a["ema"]["module"].items():
        assert torch.equal(b["ema"]["module"][key], value), key
    losses = [r["loss"] for r in train_records(tmp_path / "whole")]
    assert [r["loss"] for r in train_records(tmp_path / "part")] == losses


def test_a_failed_compilation_falls_back_to_eager_with_one_warning_line(tmp_path, monkeypatch):
    """A backend that fails as inductor does without a C++ compiler: the run trains on, eager, the same losses."""
    import bigbatch.engine.compile as compile_module

    def no_compiler(graph, example_inputs):
        raise RuntimeError("Compiler: g++ is not found\nsecond line of the error")

    monkeypatch.setattr(compile_module, "BACKEND", no_compiler)
    train(tmp_path / "eager", "steps=3")
    result = run_main("train", "digits", "--out", str(tmp_path / "fallback"), "--set", *TINY, "steps=3",
                      "model.compile=default")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.splitlines() == ["warning: model.compile: torch.compile failed (RuntimeError: Compiler: g++ "
                                          "is not found); training goes on in eager mode"]
    losses = [r["loss"] for r in train_records(tmp_path / "fallback")]
    assert losses == [r["loss"] for r in train_records(tmp_path / "eager")]


def test_reduce_overhead_is_default_off_cuda():
    from bigbatch.engine.compile import torch_mode

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert [torch_mode(m, cpu) for m in ("default", "reduce-overhead", "max-autotune")] == [None, None,
                                                                                            "max-autotune"]
    assert torch_mode("reduce-overhead", cuda) == "reduce-overhead"


TINY_YOLO = """[net]
batch=4
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

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[convolutional]
size=1
stride=1
pad=1
filters=30
activation=linear

[yolo]
mask=0,1,2
anchors=10,14, 23,27, 37,58
classes=5
num=3
"""
"""A three-convolution Darknet detector: the smallest network with a ``[yolo]`` head."""


@pytest.mark.slow  # two compilations of a detector's forward and backward: minutes on the 2-core CPU under load
def test_multi_scale_sizes_compile_the_detector_network_at_most_twice(tmp_path):
    from bigbatch.data.transforms.multiscale import MultiScale, draw_for

    sizes = [32, 64, 96, 128, 160]
    steps, seed = 6, 6  # a seed whose 6 steps draw the 5 sizes: 160, 128, 96, 160, 32, 64
    drawn = MultiScale(draw_for(sizes, 64), every=1, seed=seed, stop=steps, final=0)
    assert len({drawn.size_at(step) for step in range(steps)}) == 5, "the run must see the five sizes"
    (tmp_path / "tiny.cfg").write_text(TINY_YOLO)
    shapes = write_shapes_set(tmp_path / "set", 40)
    result = run_main("train", str(tmp_path / "tiny.cfg"), "--out", str(tmp_path / "run"), "--set",
                      f"data.path={shapes}", "data.workers=0", "log.tensorboard=false", "eval.batch=50",
                      "eval.every=100", "batch=4", "subdivisions=2", "data.size=64", f"data.multiscale.sizes={sizes}",
                      "data.multiscale.every=1", "data.multiscale.final=0", f"steps={steps}", f"seed={seed}",
                      "model.compile=default")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "model.compile" not in result.stderr
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert 1 <= counters["frames"]["ok"] <= 2 and 1 <= counters["stats"]["unique_graphs"] <= 2, dict(counters["stats"])


@pytest.mark.slow  # two torchrun processes that each compile: about a minute on the 2-core CPU
@pytest.mark.parametrize(("one_process", "two_processes"), [
    (["subdivisions=1"], ["subdivisions=1", "norm.sync=bigbatch"]),
    (["model.norm=group", "subdivisions=4"], ["model.norm=group", "subdivisions=2"]),
], ids=["cross-device-bn-1-vs-2x1", "groupnorm-4-vs-2x2"])
def test_torchrun_compiled_trains_the_weights_of_one_eager_process(tmp_path, one_process, two_processes):
    single = run_main("train", "digits", "--out", str(tmp_path / "one"), "--set", *COMMON, *one_process,
                      "ema.decay=0.9", "log.every=1")
    assert single.returncode == 0, single.stderr
    multi = torchrun(tmp_path / "two", *two_processes, "ema.decay=0.9", "log.every=1", "model.compile=default")
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert "model.compile" not in multi.stderr
    assert_same_weights(weights(tmp_path / "one"), weights(tmp_path / "two"))
    one, two = train_records(tmp_path / "one"), train_records(tmp_path / "two")
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], rel=LOSS_RTOL)


@pytest.mark.slow  # FCOS's backbone and head compiled for any size: minutes on the 2-core CPU under load
def test_a_torchvision_detector_compiled_trains_as_eager(tmp_path):
    shapes = write_shapes_set(tmp_path / "set", 40)
    settings = [f"data.path={shapes}", "steps=5", "batch=4", "subdivisions=2", "data.size=64", "eval.every=100",
                "eval.batch=50", "data.workers=0", "log.every=1", "log.tensorboard=false"]
    for mode in ("false", "default"):
        result = run_main("train", "shapes-detect", "--out", str(tmp_path / mode), "--set", *settings,
                          f"model.compile={mode}")
        assert result.returncode == 0, result.stderr[-3000:]
        assert "model.compile" not in result.stderr
    assert counters["stats"]["unique_graphs"] >= 2, "the backbone and the head"
    eager, compiled = train_records(tmp_path / "false"), train_records(tmp_path / "default")
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=LOSS_RTOL)
