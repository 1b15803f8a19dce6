"""The unknown keys said before any part loads (``config/unknown_keys.py``) are said as validation says them: a
config whose only mistakes are unknown keys, anywhere (a section, a part section, a section in a section, an item of
a list of sections), gets validation's very line; one with other mistakes as well gets its unknown keys, each as
validation words it; a config without unknown keys, nothing."""

from __future__ import annotations

import copy
import os

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from bigbatch.config import RunConfig, read_config, validate_config
from bigbatch.config.messages import section_in
from bigbatch.config.unknown_keys import unknown_keys_line
from bigbatch.errors import UserError

pytestmark = pytest.mark.fast

PROPERTY = settings(deadline=None, derandomize=bool(os.environ.get("CI")), database=None, max_examples=60)
RECIPES = ["digits", "shapes-detect", "inception-v3-tpu", "yolov3-tiny-shapes"]
READ = {recipe: read_config(recipe) for recipe in RECIPES}


def section_at(path: tuple[str, ...]):
    cls = RunConfig
    for key in path:
        cls = section_in(cls.keys()[key])
    return cls


SECTIONS = [(), ("model",), ("data",), ("optim",), ("schedule",), ("schedule", "decay"), ("data", "multiscale"),
            ("data", "standard"), ("data", "darknet"), ("clip",), ("precision",), ("schedule", "darknet"),
            ("schedule", "inception_tpu"), ("ema",), ("log",)]
"""Sections whose keys all have defaults: an unknown key put in one is the config's only mistake."""
NAMES = st.sampled_from(["widht", "lrr", "a-b", "float", "none", "0", "é", " x", "a:b", "step"]) | st.text(max_size=6)


def with_keys(data: dict, placed: list[tuple[tuple[str, ...], str]]) -> dict:
    """``data`` with the key ``name`` (value 1) put in the section at each path."""
    data = copy.deepcopy(data)
    for path, name in placed:
        node = data
        for key in path:
            node = node.setdefault(key, {})
            assume(isinstance(node, dict))
        assume(name not in section_at(path).keys() and not (path == () and name == "adaptive"))
        node[name] = 1
    return data


def validation_line(data: dict) -> str | None:
    try:
        validate_config(data)
    except UserError as e:
        return str(e)
    return None


@PROPERTY
@given(recipe=st.sampled_from(RECIPES), placed=st.lists(st.tuples(st.sampled_from(SECTIONS), NAMES), min_size=1,
                                                         max_size=3))
@example(recipe="digits", placed=[(("data",), "z"), (("data", "standard"), "x"), (("data", "multiscale"), "y")])
@example(recipe="digits", placed=[((), "z"), (("optim",), "y"), (("model",), "x"), (("schedule", "decay"), "w")])
def test_only_unknown_keys_get_validations_line(recipe, placed):
    """The examples: the order of the keys, a part section's own sections before its parts' and its own unknown keys
    last; the sections in the order the config declares them."""
    data = with_keys(READ[recipe], placed)
    line = validation_line(data)
    assert line is not None
    assert unknown_keys_line(data) == line


@PROPERTY
@given(recipe=st.sampled_from(RECIPES), placed=st.lists(st.tuples(st.sampled_from(SECTIONS), NAMES), min_size=1,
                                                         max_size=2),
       other=st.sampled_from([("data", "size", -1), ("optim", "name", "nosuch"), ("model", "norm", "layer"),
                              ("data", "train", {"x": 1}), ("schedule", "warmup", [{"kind": "linear", "a-b": 2}]),
                              ("clip", "max_norm", "x")]))
def test_other_mistakes_too_get_the_unknown_keys_as_validation_words_them(recipe, placed, other):
    data = with_keys(READ[recipe], placed)
    section, key, value = other
    data.setdefault(section, {})[key] = value
    line, full = unknown_keys_line(data), validation_line(data)
    assert line is not None and full is not None
    assert set(line.split("; ")) <= set(full.split("; "))


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_config_without_unknown_keys_gets_nothing(recipe):
    assert unknown_keys_line(READ[recipe]) is None
    assert unknown_keys_line({**READ[recipe], "model": {"name": "nosuch", "width": -3}}) is None  # validation's


def test_what_validation_words_otherwise_is_left_to_it():
    """A key that is not a string, in a section that is not a part section: pydantic says "keys should be strings"."""
    data = {**READ["digits"], "clip": {1: 2}, "zzz": 1}
    assert validation_line(data).startswith("clip.1: keys should be strings")
    assert unknown_keys_line(data) is None
    data = {**READ["digits"], "model": {1: 2}}  # a part section's own check: "unknown key"
    assert unknown_keys_line(data) == validation_line(data)


def test_an_adaptive_batchs_mistake_is_validations_line():
    for data in [{**READ["digits"], "adaptive": {"base": 1}},
                 {**READ["digits"], "batch": {"mode": "adaptive", "base": 32, "max": 64, "step": 1}}]:
        assert unknown_keys_line(data) == validation_line(data)
