"""The ``[net]`` recipe of a ``.cfg`` (darknet/recipe.py) against Darknet's own reading of it (src/parser.c
parse_net_options, get_policy; src/network.c get_current_rate)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bigbatch.batching import make_plan
from bigbatch.config import load_config
from bigbatch.errors import UserError
from bigbatch.largebatch.schedule import build_schedule

LAYERS = ("[convolutional]\nfilters=4\nsize=3\nstride=2\npad=1\nactivation=leaky\n"
          "[avgpool]\n[softmax]\n")


def write_cfg(tmp_path: Path, net: str) -> Path:
    path = tmp_path / "net.cfg"
    path.write_text("[net]\nbatch=4\nsubdivisions=1\nwidth=32\nheight=32\nchannels=3\nlearning_rate=0.01\n"
                    f"max_batches=200\n{net}\n{LAYERS}", encoding="utf-8")
    return path


def test_the_sigmoid_policy_is_darknets_sigmoid(tmp_path):
    """policy=sigmoid, as get_policy names it: lr / (1 + exp(gamma * (batch_num - step))), batch_num = step + 1."""
    cfg = load_config(str(write_cfg(tmp_path, "policy=sigmoid\ngamma=0.1\nstep=100\n")), [])
    lr = build_schedule(cfg, make_plan(cfg, 1, 1000))
    for step in range(200):
        batch_num = step + 1
        assert lr(step) == pytest.approx(0.01 * (1.0 / (1.0 + math.exp(0.1 * (batch_num - 100)))), rel=1e-9), step


@pytest.mark.parametrize("policy", ["sig", "Sigmoid", "cosine"])
def test_a_policy_darknet_does_not_know_is_one_line_naming_the_valid_ones(tmp_path, policy):
    """Darknet's get_policy warns and trains at a constant rate; bigbatch refuses, naming the key and the policies."""
    path = write_cfg(tmp_path, f"policy={policy}\n")
    with pytest.raises(UserError) as error:
        load_config(str(path), [])
    message = str(error.value)
    assert f"{path}:1: [net] policy: {policy!r} is not a Darknet policy" in message and "\n" not in message
    assert "constant, step, steps, exp, poly, sigmoid, sgdr" in message


def test_the_random_policy_is_darknets_and_refused(tmp_path):
    with pytest.raises(UserError, match=r"\[net\] policy: 'random' is Darknet's, not supported by bigbatch"):
        load_config(str(write_cfg(tmp_path, "policy=random\n")), [])


@pytest.mark.parametrize("value", ["1", "2", "-1"])
def test_adam_is_refused_in_one_line_naming_its_line_not_trained_as_sgd(tmp_path, value):
    """parse_net_options trains Adam for any adam != 0 (AlexeyAB's GPU build: L2 decay inside the gradient, the
    convolutions only), which no bigbatch optimizer computes: refused, not SGD in silence."""
    path = write_cfg(tmp_path, f"adam={value}\nB1=0.8\n")
    with pytest.raises(UserError) as error:
        load_config(str(path), [])
    message = str(error.value)
    assert message.startswith(f"config: {path}:9: [net] adam: {value!r}: Darknet's Adam") and "\n" not in message
    assert "set adam=0 to train with SGD" in message


def test_adam_0_trains_sgd_as_without_it(tmp_path):
    cfg = load_config(str(write_cfg(tmp_path, "adam=0\n")), [])
    assert cfg.optim.name == "sgd" and cfg.optim.momentum == 0.9


def test_the_input_is_stretched_unless_letter_box_is_set_as_darknet_trains_and_scores(tmp_path):
    """AlexeyAB's load_data_detection and validate_detector_map stretch the image to the input unless ``[net]
    letter_box`` is non-zero (default 0); a .cfg run once letterboxed every image, and predict stretched them."""
    yolo = ("[convolutional]\nfilters=30\nsize=1\nstride=1\nactivation=linear\n"
            "[yolo]\nmask=0,1,2\nanchors=10,14, 23,27, 37,58\nclasses=5\nnum=3\njitter=.2\n")

    def resize(net: str) -> str:
        path = tmp_path / "det.cfg"
        path.write_text(f"[net]\nbatch=4\nwidth=64\nheight=64\nchannels=3\n{net}\n{LAYERS.split('[avgpool]')[0]}"
                        f"{yolo}", encoding="utf-8")
        return load_config(str(path), []).data.resize

    assert resize("") == "stretch" and resize("letter_box=0") == "stretch"
    assert resize("letter_box=1") == "letterbox"
    with pytest.raises(UserError, match=r"det.cfg:6: \[net\] letter_box: expected an integer"):
        resize("letter_box=yes")


def test_policy_steps_without_steps_or_scales_is_refused_as_darknet_refuses_it(tmp_path):
    """parse_net_options: error("STEPS policy must have steps and scales in cfg file"); a missing line once trained at
    a constant rate."""
    with pytest.raises(UserError, match=r"net.cfg:1: \[net\] policy=steps: scales missing"):
        load_config(str(write_cfg(tmp_path, "policy=steps\nsteps=100")), [])
    with pytest.raises(UserError, match=r"policy=steps: steps and scales missing"):
        load_config(str(write_cfg(tmp_path, "policy=steps")), [])
    assert load_config(str(write_cfg(tmp_path, "policy=steps\nsteps=100\nscales=.1")), []).steps == 200
