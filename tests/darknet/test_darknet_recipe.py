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
