"""Bounds checked before any work:

- the largest batch a run may reach (a batch schedule's, a growing adaptive batch's ``batch.max``) passes every
  check a fixed batch passes: the data order's memory, the 64-bit image counts, whole micro-batches;
- a Darknet ``.cfg`` costs work linear in its layers (no list of every earlier layer's output rebuilt for each
  layer), and has at most ``MAX_LAYERS`` layers.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bigbatch.cli import main
from bigbatch.config import load_config
from bigbatch.darknet import cfg as darknet_cfg
from bigbatch.darknet.spec import KINDS
from bigbatch.darknet.text import read_cfg_sections
from tests.helpers import ROOT


def one_error(capsys: pytest.CaptureFixture, *expected: str) -> str:
    """The one ``error:`` line on stderr (no warning before it), holding each of ``expected``."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for text in expected:
        assert text in err, err
    return err.rstrip("\n")


# --------------------------------------------------------------------------------------------- the largest batch

ADAPTIVE = "batch={{mode: adaptive, base: 8, max: {max}, grow: {grow}}}"


def test_the_batches_a_run_may_reach_name_their_keys():
    from bigbatch.batching import reachable_batches

    grow = load_config("digits", [ADAPTIVE.format(max=64, grow="true"), "subdivisions=2"])
    assert reachable_batches(grow) == [("batch", 8), ("batch.max", 64)]
    fixed = load_config("digits", [ADAPTIVE.format(max=64, grow="false"), "subdivisions=2"])
    assert reachable_batches(fixed) == [("batch", 64)]
    scheduled = load_config("digits", ["batch=32", "schedule.batch=[{at: 2, factor: 2}, {at: 4, batch: 256}]"])
    assert reachable_batches(scheduled) == [("batch", 32), ("schedule.batch[0]", 64), ("schedule.batch[1]", 256)]


@pytest.mark.parametrize("command", ["show", "train"])
def test_a_growing_batch_is_refused_as_the_same_fixed_batch_is(command, tmp_path, capsys, no_training):
    """``max: 1e12`` was refused with ``grow: false`` and planned as "doubling up to 1000000000000" with ``grow:
    true``: the same check now refuses both, in the same words, naming the key that sets the batch."""
    out = ["--out", str(tmp_path / "run")] if command == "train" else []
    said = {}
    for grow, key in (("false", "batch: "), ("true", "batch.max: ")):
        assert main([command, "digits", *out, "--set", ADAPTIVE.format(max=10**12, grow=grow), "subdivisions=2"]) == 2
        said[grow] = one_error(capsys, f"error: {key}1000000000000 images per step", "for the data order alone")
        said[grow] = said[grow].removeprefix(f"error: {key}")
    assert said["true"] == said["false"]
    assert not (tmp_path / "run").exists()


def test_a_growing_batch_counts_its_images_in_64_bits_at_its_largest(capsys):
    """10 steps of up to 2^62 images: the old plan counted them at the base batch (10 x 8) and named it."""
    assert main(["show", "digits", "--set", ADAPTIVE.format(max=2**62, grow="true"), "subdivisions=2",
                 "steps=10"]) == 2
    one_error(capsys, f"batch.max: 10 steps of up to {2**62} images", "more than a 64-bit count holds")


def test_a_growing_batch_must_be_whole_micro_batches_before_any_work(tmp_path, capsys, no_training):
    assert main(["train", "digits", "--out", str(tmp_path / "run"), "--set", ADAPTIVE.format(max=1002, grow="true"),
                 "subdivisions=2", "steps=10"]) == 2
    one_error(capsys, "batch.max: a batch of 1002 is not a whole number of micro-batches of 4")


# --------------------------------------------------------------------------------------------- a cfg's layers


def chain_cfg(path: Path, layers: int, last: str = "") -> Path:
    """A ``.cfg`` of ``layers`` small layers: convolutions, shortcuts and routes reading earlier layers (then
    ``last``, a section's text, when given)."""
    kinds = ["[convolutional]\nfilters=2\nsize=1\nactivation=leaky\n", "[convolutional]\nfilters=2\nsize=1\n",
             "[shortcut]\nfrom=-2\n", "[route]\nlayers=-1,-3\n"]
    sections = ["[net]\nwidth=16\nheight=16\nchannels=3\n", *(kinds[i % 4] for i in range(layers))]
    path.write_text("\n".join(sections + ([last] if last else [])))
    return path


def test_a_cfg_costs_work_linear_in_its_layers(tmp_path, monkeypatch, capsys):
    """Each layer's shape rule and builder get the outputs of the layers before it. The old code built a new list of
    them for each layer (N^2 / 2 shapes copied by each, in each build ``show`` makes); now one list grows."""
    copied: dict[int, tuple[list, int]] = {}  # id -> (the list, kept so that no id is reused; its length then)

    def counted(rule):
        def rule_counted(*args):
            outputs = args[-1]
            copied.setdefault(id(outputs), (outputs, len(outputs)))
            return rule(*args)
        return rule_counted

    for name, kind in list(KINDS.items()):
        monkeypatch.setitem(KINDS, name, dataclasses.replace(kind, shape=counted(kind.shape),
                                                             build=counted(kind.build)))
    layers = 400
    cfg = chain_cfg(tmp_path / "deep.cfg", layers)
    assert main(["show", "yolov3-tiny-shapes", "--set", f"model.cfg={cfg}"]) == 0
    assert f"{layers} layers;" in capsys.readouterr().out
    assert copied  # the rules were called
    assert sum(length for _, length in copied.values()) <= layers  # old code: 319,200 (2 builds x 2 x 400 x 399 / 2)


def test_the_maximum_layer_count_leaves_the_stock_cfgs_room():
    stock = sorted((ROOT / "tests/data/darknet/stock").rglob("*.cfg"))
    deepest = max(len(read_cfg_sections(path, prefix="")) - 1 for path in stock)
    assert deepest == 375  # cspx-p7-mish, as MAX_LAYERS' docstring says
    assert darknet_cfg.MAX_LAYERS >= 25 * deepest


def test_a_cfg_of_more_than_the_maximum_is_one_line_naming_its_first_layer_past_it(tmp_path, capsys):
    """One layer more than ``MAX_LAYERS`` is refused before any section is parsed (the last one is not even a
    layer bigbatch knows), by every command that reads the cfg."""
    most = darknet_cfg.MAX_LAYERS
    cfg = chain_cfg(tmp_path / "deep.cfg", most + 1, last="[no_such_layer]\n")
    past = read_cfg_sections(cfg, prefix="")[most + 1]
    expected = f"{cfg}:{past.line}: [{past.name}]: layer {most} is past the most layers a .cfg may have, {most:,}"
    assert main(["show", "yolov3-tiny-shapes", "--set", f"model.cfg={cfg}"]) == 2
    one_error(capsys, expected)
    assert main(["export", str(cfg), "--checkpoint", str(tmp_path / "out.pt")]) == 2
    one_error(capsys, expected)
    assert not (tmp_path / "out.pt").exists()
    assert main(["show", str(cfg)]) == 2  # the .cfg config format
    one_error(capsys, expected)


def test_the_maximum_itself_is_allowed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(darknet_cfg, "MAX_LAYERS", 6)
    assert main(["show", "yolov3-tiny-shapes", "--set", f"model.cfg={chain_cfg(tmp_path / 'six.cfg', 6)}"]) == 0
    assert "6 layers;" in capsys.readouterr().out
    assert main(["show", "yolov3-tiny-shapes", "--set", f"model.cfg={chain_cfg(tmp_path / 'seven.cfg', 7)}"]) == 2
    one_error(capsys, "[shortcut]: layer 6 is past the most layers a .cfg may have, 6 (the cfg has 7")
