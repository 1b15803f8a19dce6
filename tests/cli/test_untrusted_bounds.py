"""Bounds checked before any work, and a set that cannot be read is one line:

- the largest batch a run may reach (a batch schedule's, a growing adaptive batch's ``batch.max``) passes every
  check a fixed batch passes: the data order's memory, the 64-bit image counts, whole micro-batches;
- a Darknet ``.cfg`` costs work linear in its layers (no list of every earlier layer's output rebuilt for each
  layer), and has at most ``MAX_LAYERS`` layers;
- a set none of whose images can be read (shards, an image folder, detection records; read in the training process
  or in a DataLoader worker) is one error line naming the set, with no warning for each image before it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bigbatch.cli import main
from bigbatch.config import load_config
from bigbatch.darknet import cfg as darknet_cfg
from bigbatch.darknet.spec import KINDS
from bigbatch.darknet.text import read_cfg_sections
from bigbatch.data.formats.pack import pack
from tests.helpers import DARKNET_DATA, run_cli


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
    stock = sorted((DARKNET_DATA / "stock").rglob("*.cfg"))
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


# --------------------------------------------------------------------------------------------- sets none can read


def not_images(root: Path) -> Path:
    """An image folder whose every file (``.jpg``, 2 classes x 2, in train and val) is text."""
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i in range(2):
                (root / split / name / f"{i}.jpg").write_text(f"not an image: {split} {name} {i}\n")
    return root


TRAIN = ["batch=4", "subdivisions=2", "steps=2", "data.size=16", "model.width=4", "log.tensorboard=false"]


@pytest.mark.parametrize("name", ["shards", "folder"])
def test_a_set_whose_every_image_is_unreadable_is_one_line_naming_the_set(name, tmp_path, capsys):
    """The old code printed a warning for each of the 4 images (each "replaced by the next readable one"), then
    "none of the 4 images can be decoded", without saying which set."""
    data = not_images(tmp_path / "set")
    if name == "shards":
        pack(data, tmp_path / "shards", 60_000)
        data, named = tmp_path / "shards", f"the train shards in {tmp_path / 'shards'} (train-000000.tar)"
    else:
        named = f"the training set {data / 'train'}"
    assert main(["train", "digits", "--out", str(tmp_path / "run"), "--set", f"data.name={name}",
                 f"data.path={data}", *TRAIN]) == 2
    one_error(capsys, f"error: data: none of the 4 images of {named} can be decoded (the first tried, ",
              "cannot identify image file")


def test_a_set_none_can_read_is_one_line_from_a_dataloader_worker(tmp_path):
    """In a DataLoader worker the old code printed the 4 warnings and then torch's text of the worker's error: its
    traceback."""
    pack(not_images(tmp_path / "set"), tmp_path / "shards", 60_000)
    done = run_cli("train", "digits", "--out", str(tmp_path / "run"), "--set", "data.name=shards",
                   f"data.path={tmp_path / 'shards'}", "data.workers=1", *TRAIN)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"error: data: none of the 4 images of the train shards in {tmp_path / 'shards'}")


def fifo_folder(root: Path) -> Path:
    """An image folder whose training files are all FIFOs (the validation set holds one real JPEG)."""
    import os

    for split in ("train", "val"):
        (root / split / "a").mkdir(parents=True)
    for i in range(3):
        os.mkfifo(root / "train" / "a" / f"{i}.jpg")
    Image.new("RGB", (20, 20)).save(root / "val" / "a" / "x.jpg")
    return root


def test_a_folder_of_no_image_file_is_one_line_in_train_and_pack(tmp_path, capsys):
    """The old code warned of each FIFO skipped, then said the folder holds no image file."""
    data = fifo_folder(tmp_path / "set")
    assert main(["train", "digits", "--out", str(tmp_path / "run"), "--set", "data.name=folder", f"data.path={data}",
                 *TRAIN]) == 2
    one_error(capsys, f"data.path: {data / 'train'} holds no .jpg, .jpeg or .png file in a class folder (3 problems "
                      f"in the data, the first: {data / 'train' / 'a' / '0.jpg'}: a FIFO")
    assert main(["pack", str(data), "--out", str(tmp_path / "shards")]) == 2
    one_error(capsys, f"{data / 'train'}: holds no .jpg, .jpeg or .png file in a class folder (3 problems")


def coco_set(root: Path, body: str) -> list[str]:
    """A COCO set of 3 images with a box each, used for training and validation: ``body`` ``text`` (none is an
    image) or ``truncated`` (JPEGs whose header reads and whose body does not decode); the ``--set`` settings."""
    images = root / "images"
    images.mkdir(parents=True)
    entries, boxes = [], []
    for k in range(3):
        path = images / f"{k}.jpg"
        if body == "text":
            path.write_text("not an image\n")
        else:
            pixels = np.random.default_rng(k).integers(0, 256, (48, 64, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(path, quality=95)
            encoded = path.read_bytes()
            path.write_bytes(encoded[:len(encoded) * 6 // 10])
        entries.append({"id": k + 1, "file_name": path.name, "width": 64, "height": 48})
        boxes.append({"id": k + 1, "image_id": k + 1, "category_id": 1, "bbox": [4, 4, 20, 20], "iscrowd": 0})
    annotations = root / "instances.json"
    annotations.write_text(json.dumps({"images": entries, "annotations": boxes,
                                       "categories": [{"id": 1, "name": "thing"}]}))
    split = f"{{images: {images}, annotations: {annotations}}}"
    return ["data.name=coco", f"data.train={split}", f"data.val={split}", "batch=2", "subdivisions=1", "steps=1",
            "data.size=64", "data.max_size=64", "data.multiscale.sizes=null", "log.tensorboard=false"]


def test_a_detection_set_with_no_usable_image_is_one_line(tmp_path, capsys):
    """Refused when loaded (no image header reads): the old code warned of each image, then said "the training set
    holds no usable image with a box"."""
    settings = coco_set(tmp_path / "coco", "text")
    assert main(["train", "shapes-detect", "--out", str(tmp_path / "run"), "--set", *settings]) == 2
    one_error(capsys, "data: the training set holds no usable image with a box (3 problems in the data, the first: "
                      f"{tmp_path / 'coco' / 'images' / '0.jpg'}: unreadable image")


def test_a_detection_set_none_of_whose_images_decodes_is_one_line_naming_it(tmp_path, capsys):
    """Found when decoded (the headers read): the old code warned of each image, then "none of the 3 images can be
    decoded"."""
    settings = coco_set(tmp_path / "coco", "truncated")
    assert main(["train", "shapes-detect", "--out", str(tmp_path / "run"), "--set", *settings]) == 2
    one_error(capsys, f"error: data: none of the 3 images of the training set under {tmp_path / 'coco' / 'images'} "
                      "can be decoded (the first tried, ")


@pytest.mark.parametrize("text, says", [('[1, 2]', "expected a COCO annotation file"),
                                        ('{"images": [', "not valid JSON"),
                                        ("[" * 100_000 + "]" * 100_000, "nested too deeply")])
@pytest.mark.parametrize("command", ["show", "train"])
def test_a_broken_training_annotation_file_is_one_line_when_the_set_is_counted_too(tmp_path, capsys, text, says,
                                                                                   command):
    """``show`` counts the training images (``counts.images_in_annotations``) with the same checked reader as training:
    it once parsed the file unchecked (a traceback on a list, a broken or a deeply nested file)."""
    settings = coco_set(tmp_path / "coco", "truncated")
    broken = tmp_path / "coco" / "broken.json"
    broken.write_text(text)
    settings[1] = f"data.train={{images: {tmp_path / 'coco' / 'images'}, annotations: {broken}}}"
    args = [command, "shapes-detect", "--set", *settings] + (["--out", str(tmp_path / "run")] if command == "train"
                                                               else [])
    assert main(args) == 2
    one_error(capsys, "error: data", f"{broken}", says)
