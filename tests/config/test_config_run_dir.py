"""A run directory written before the config became a package (``tests/fixtures/run-digits-before-config-package``:
digits, 4 steps of batch 32, a checkpoint every 2, EMA on) still reads and resumes: its ``config.yaml`` validates and
is written back byte for byte, and training goes on from its last checkpoint."""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from bigbatch.cli import main
from bigbatch.config import config_to_yaml, load_config, read_yaml, validate_config
from bigbatch.errors import UserError
from tests.helpers import FIXTURES

BEFORE_PACKAGE_RUN = FIXTURES / "run-digits-before-config-package"


ADDED_SINCE = {"  val: null\n": "  annotations: auto\n", "  jitter: 0.0\n": "  jitter_resize: 1.0\n",
               "  color_jitter: 0.0\n": "  mosaic: 0.0\n  mosaic_bound: false\n",
               "  preprocessing: inception\n": (
    "  darknet:\n    min_crop: 1.0\n    max_crop: 2.0\n    aspect: 1.0\n    angle: 0.0\n    hue: 0.0\n"
    "    saturation: 1.0\n    exposure: 1.0\n    flip: true\n"
    "  standard:\n    scale:\n    - 0.08\n    - 1.0\n    ratio:\n    - 0.75\n    - 1.3333333333333333\n"
    "    hflip: 0.5\n    color_jitter: 0.0\n    interpolation: bilinear\n    crop_pct: 0.875\n"
    "  decode: exact\n  follow_links: false\n"),
    "  cfg: null\n": "  memory_format: auto\n  compile: false\n  darknet_dialect: alexeyab\n  weights_cfg: null\n",
    "  weights: null\n": "  weights_from: ema\n  mismatched: error\n  freeze: none\n  unfreeze_at: null\n",
    "  min_lr_ratio: null\n": "  batch: []\n  decay_at_batch_milestones: false\n",
    "  momentum_correction: false\n": "  backbone_lr_scale: 1.0\n  fused: false\n",
    "  limit: null\n": "  keep_freed: true\n",
    "    max_batches: null\n": "    learning_rate_min: 1.0e-05\n    sgdr_cycle: null\n    sgdr_mult: 2\n"}
"""Keys added to the config since the run was written (after the line they follow), at their defaults:
``data.annotations`` (a COCO file of a YOLO set's validation images); ``data.jitter_resize`` (AlexeyAB's zoom);
``data.mosaic`` and ``data.mosaic_bound``
(detection augmentation); ``data.darknet``, Darknet's classifier augmentation (``data.preprocessing: darknet``);
``data.standard``, the keys of ``data.preprocessing: standard``; ``data.decode``; ``data.follow_links``;
``model.memory_format``;
``model.compile`` (torch.compile); ``model.darknet_dialect``; ``model.weights_from``, ``mismatched``, ``freeze``,
``unfreeze_at`` and ``weights_cfg`` (fine-tuning); ``optim.backbone_lr_scale``; ``schedule.batch`` and
``schedule.decay_at_batch_milestones`` (a batch schedule); ``optim.fused`` (AdamW's fused kernel);
``memory.keep_freed`` (host memory kept for the next micro-batch); ``schedule.darknet.learning_rate_min``,
``sgdr_cycle`` and ``sgdr_mult`` (Darknet's ``sgdr`` policy)."""


def test_its_config_is_written_back_byte_for_byte():
    """Byte for byte, but for the keys added since, each at its default where the schema puts it."""
    text = (BEFORE_PACKAGE_RUN / "config.yaml").read_text(encoding="utf-8")
    for line, added in ADDED_SINCE.items():
        assert line in text
        text = text.replace(line, line + added)
    assert config_to_yaml(validate_config(read_yaml(BEFORE_PACKAGE_RUN / "config.yaml"))) == text


def test_it_resumes_from_its_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(BEFORE_PACKAGE_RUN, run)  # never write into tests/fixtures
    before = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert before["step"] == 4
    assert main(["train", "--resume", str(run), "--set", "steps=6"]) == 0
    after = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert after["step"] == 6 and after["ema"]["updates"] == 6
    assert not torch.equal(after["model"][next(iter(after["model"]))], before["model"][next(iter(before["model"]))])


def test_a_key_of_another_format_is_accepted_at_its_default_and_refused_otherwise():
    """``data.shapes_images`` is a key of ``shapes``: a config of ``digits`` may hold it at its default (as every
    config.yaml written before does), not with another value; the error names the key and the format that uses it."""
    assert load_config("digits", ["data.shapes_images=2000", "data.flip=0.5"]).data.shapes_images == 2000
    with pytest.raises(UserError, match=r"^data\.shapes_images: used by dataset shapes only, not by 'digits' "
                                        r"\(data\.name\); leave it out, or at its default 2000$"):
        load_config("digits", ["data.shapes_images=10"])
    with pytest.raises(UserError, match=r"^data\.flip: used by dataset shapes, coco or yolo only, not by 'digits'"):
        load_config("digits", ["data.flip=0.25"])
    assert load_config("shapes-detect", ["data.shapes_images=10", "data.flip=0.25"]).data.flip == 0.25


def test_an_unknown_data_key_lists_every_key_in_the_written_order():
    with pytest.raises(UserError) as raised:
        load_config("digits", ["data.shape_images=10"])
    listed = str(raised.value).partition("expected one of: ")[2].rstrip(")").split(", ")
    written = list(read_yaml(BEFORE_PACKAGE_RUN / "config.yaml")["data"])
    after = written.index("color_jitter") + 1
    written[after:after] = ["mosaic", "mosaic_bound"]  # added since (ADDED_SINCE), as the next four
    written.insert(written.index("val") + 1, "annotations")
    written.insert(written.index("jitter") + 1, "jitter_resize")
    assert listed == [*written, "darknet", "standard", "decode", "follow_links"]


def test_show_says_where_a_filled_in_metric_came_from(capsys):
    assert main(["show", "digits", "--set", "eval.metric=null"]) == 0
    assert "eval.metric     top1  (unset in the config: the classification task's default)" in capsys.readouterr().out
    assert main(["show", "digits", "--set", "eval.metric=top5"]) == 0
    assert "unset in the config" not in capsys.readouterr().out


def test_a_dump_shares_its_key_strings_so_checkpoints_pickle_the_same_bytes():
    """The laid-out sections keep pydantic's own (interned) key strings: a checkpoint, which pickles the dump, writes
    a repeated key once, as before the keys were laid out (a pydantic serializer would make new strings)."""
    def keys(value):
        if isinstance(value, dict):
            return [*value, *(k for v in value.values() for k in keys(v))]
        return [k for v in value for k in keys(v)] if isinstance(value, list) else []

    dumped = load_config("shapes-detect").model_dump(mode="json")
    assert list(dumped["data"])[:6] == ["name", "size", "max_size", "resize", "path", "train"]
    assert all(key is sys.intern(key) for key in keys(dumped))
