"""Darknet networks through the CLI: ``bigbatch show net.cfg`` lists the layers and counts the parameters as Darknet
does, ``bigbatch export`` converts both ways, and a malformed cfg or weights file is one clear line."""

from __future__ import annotations

import struct

import pytest
import torch

from tests.helpers import DARKNET_DATA, run_main


@pytest.mark.parametrize(("name", "layers", "parameters"), [("yolov3.cfg", 107, "61,949,149"),
                                                             ("yolov3-tiny.cfg", 24, "8,852,366")])
def test_show_counts_the_parameters_as_darknet(name, layers, parameters):
    shown = run_main("show", str(DARKNET_DATA / name))
    assert shown.returncode == 0, shown.stderr
    assert f"; {layers} layers; {parameters} parameters" in shown.stdout
    assert "model:\n  name: darknet" in shown.stdout and "resize: stretch" in shown.stdout  # letter_box=0
    assert "keys Darknet uses and bigbatch ignores: net:angle\n" in shown.stdout
    assert "jitter: 0.3" in shown.stdout and "saturation: 1.5" in shown.stdout and "hue: 0.1" in shown.stdout
    table = shown.stdout.split("layer  type")[1].splitlines()
    assert table[1].split()[:3] == ["0", "conv", "16" if "tiny" in name else "32"]


def test_export_writes_darknet_weights_that_read_back_bit_identically(tmp_path):
    """A fresh yolov3-tiny as Darknet weights: exactly 35,434,956 bytes (a 20-byte header and 8,858,734 float32 values,
    the convolutions' running statistics among them); converted back through --weights, the same bytes and the same
    tensors in a checkpoint that model.weights reads. (The tiny network: yolov3's three files took 744 MB of disk.)"""
    from bigbatch.darknet.models import darknet_network, load_darknet_weights

    cfg = DARKNET_DATA / "yolov3-tiny.cfg"
    first = tmp_path / "first.weights"
    result = run_main("export", str(cfg), "--darknet-weights", str(first))
    assert result.returncode == 0, result.stderr
    assert first.stat().st_size == 35_434_956
    again, checkpoint = tmp_path / "again.weights", tmp_path / "yolov3-tiny.pt"
    result = run_main("export", str(cfg), "--weights", str(first), "--darknet-weights", str(again),
                      "--checkpoint", str(checkpoint))
    assert result.returncode == 0, result.stderr
    assert first.read_bytes() == again.read_bytes()
    from_weights, from_checkpoint = darknet_network(str(cfg)), darknet_network(str(cfg))
    load_darknet_weights(from_weights, first)
    load_darknet_weights(from_checkpoint, checkpoint)
    a, b = from_weights.state_dict(), from_checkpoint.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fresh = darknet_network(str(cfg))  # a different init: the weights really were loaded
    assert not torch.equal(fresh.state_dict()["layers.0.conv.weight"], a["layers.0.conv.weight"])


def test_export_refuses_to_overwrite_and_names_a_mismatched_file(tmp_path):
    tiny = DARKNET_DATA / "yolov3-tiny.cfg"
    kept = tmp_path / "kept.weights"
    kept.write_bytes(b"mine")
    result = run_main("export", str(tiny), "--darknet-weights", str(kept))
    assert result.returncode == 2 and result.stderr.startswith(f"error: --darknet-weights: {kept} exists")
    assert kept.read_bytes() == b"mine"
    wrong = tmp_path / "wrong.weights"
    wrong.write_bytes(struct.pack("<3iQ", 0, 2, 5, 0) + b"\0" * 400)  # a 0.2 header (64-bit seen), too few values
    result = run_main("export", str(tiny), "--weights", str(wrong), "--darknet-weights", str(tmp_path / "o.weights"))
    assert result.returncode == 2
    assert result.stderr == (f"error: {wrong}: 420 bytes, but the network of {tiny} takes 35,434,956 (20-byte header "
                             f"+ 8,858,734 float32 values); a file of its first N layers only (what export --upto N "
                             f"and Darknet's partial write) would be 2,004 bytes (--upto 2)\n")
    assert not (tmp_path / "o.weights").exists()
    result = run_main("export", str(tiny))
    assert result.returncode == 2 and "nothing to write" in result.stderr


def test_export_replaces_only_the_cfg_it_wrote_unchanged_and_refuses_an_edited_or_copied_one(tmp_path):
    """``OUT.cfg`` beside ``--darknet-weights OUT.weights`` is replaced only while it is the file export wrote and
    recorded, unchanged: a cfg tuned by hand since, or a copy of an exported one (its ``# kept by bigbatch:`` first
    line too), is the user's and is refused in one line naming the option and the file; nothing is written."""
    from tests.helpers import SMALL

    cfg = tmp_path / "small.cfg"
    cfg.write_text(SMALL)
    weights, beside = tmp_path / "out.weights", tmp_path / "out.cfg"
    assert run_main("export", str(cfg), "--darknet-weights", str(weights)).returncode == 0
    assert beside.read_text().startswith("# kept by bigbatch:")
    weights.unlink()
    result = run_main("export", str(cfg), "--darknet-weights", str(weights), "--seed", "3")  # its own cfg: replaced
    assert result.returncode == 0, result.stderr
    lines = beside.read_text().splitlines()
    beside.write_text("\n".join([lines[0], "# MY HAND-TUNED CFG", *lines[1:]]) + "\n")
    weights.unlink()
    copied = tmp_path / "copy.cfg"
    copied.write_bytes(tmp_path.joinpath("out.cfg").read_bytes().replace(b"# MY HAND-TUNED CFG\n", b""))
    for cfg_out, out in ((beside, weights), (copied, tmp_path / "copy.weights")):
        before = cfg_out.read_bytes()
        result = run_main("export", str(cfg), "--darknet-weights", str(out))
        assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
        assert result.stderr.startswith(f"error: --darknet-weights: {cfg_out} exists; "), result.stderr
        assert cfg_out.read_bytes() == before and not out.exists()


def test_a_cfg_written_back_changes_its_keys_where_darknet_reads_them_and_keeps_every_other_line(tmp_path):
    from bigbatch.darknet.cfg_edit import KEPT_CFG_MARK, cfg_text_for_classes, edit_cfg_text

    path = tmp_path / "net.cfg"
    path.write_text("[net]\nwidth=64\nheight=64\n# a note\n[convolutional]\nsize=1\nfilters = 18 # for 1 class\n"
                    "filters=99\nactivation=linear\n[yolo]\nmask=0,1,2\nanchors=1,1, 2,2, 3,3\nnum=3\n")
    text = cfg_text_for_classes(path, 4, f"{KEPT_CFG_MARK} test")
    assert text == (f"{KEPT_CFG_MARK} test\n[net]\nwidth=64\nheight=64\n# a note\n[convolutional]\nsize=1\n"
                    "filters=27 # for 1 class\nfilters=99\nactivation=linear\n[yolo]\nclasses=4\nmask=0,1,2\n"
                    "anchors=1,1, 2,2, 3,3\nnum=3\n")  # [yolo] had no classes= (Darknet's default, 20): added
    again = tmp_path / "again.cfg"
    again.write_text(text)
    assert edit_cfg_text(again, {}, f"{KEPT_CFG_MARK} again").split("\n")[:2] == [f"{KEPT_CFG_MARK} again", "[net]"]


@pytest.mark.parametrize(("text", "message"), [
    ("[net]\nwidth=64\nheight=64\nchannels=3\n[convolutional]\nfilters=8\nsize=3\nactivation=leaky\n[yolo]\n",
     "net.cfg:9: [yolo]"),
    ("[net]\nwidth=64\nheight=64\n[convolution]\nfilters=8\n", "net.cfg:4:"),
    ("[net]\nwidth=64\nheight=64\n[convolutional]\nfilters=eight\n", "net.cfg:5: [convolutional] filters:"),
    ("[net]\nwidth=64\nheight=64\n[convolutional]\nfilters=8\nsize=3\n[route]\nlayers=-5\n", "net.cfg:8: [route]"),
    ("[net]\nwidth=64\nheight=48\n[convolutional]\nfilters=18\nsize=1\n[yolo]\nmask=0\nanchors=1,1\nnum=1\nclasses=1\n",
     "[net] height: 48 differs from width 64"),
])
def test_a_malformed_cfg_is_one_line_naming_file_and_line(tmp_path, text, message):
    path = tmp_path / "net.cfg"
    path.write_text(text)
    shown = run_main("show", str(path))
    assert shown.returncode == 2 and shown.stdout == ""
    assert len(shown.stderr.splitlines()) == 1 and message in shown.stderr, shown.stderr


NEW_COORDS = ("[net]\nwidth=64\nheight=64\nchannels=3\nbatch=2\nmax_batches=1\n"
              "[convolutional]\nfilters=12\nsize=1\nactivation=logistic\n"
              "[yolo]\nmask=0,1\nanchors=10,10, 20,20\nnum=2\nclasses=1\nnew_coords=1\n")


def test_show_shows_what_training_refuses_and_train_says_why_before_any_step(tmp_path):
    """``show`` shows any network that builds; what the YOLO loss cannot do (new_coords under the gradient dialect)
    is said when training starts."""
    path = tmp_path / "scaled.cfg"
    path.write_text(NEW_COORDS)
    shown = run_main("show", str(path))
    assert shown.returncode == 0, shown.stderr
    assert "; 2 layers; 48 parameters" in shown.stdout
    out = tmp_path / "run"
    trained = run_main("train", str(path), "--out", str(out), "--set", "model.darknet_dialect=gradient")
    assert trained.returncode == 2
    assert trained.stderr.splitlines()[-1] == (
        f"error: {path}:16: [yolo] new_coords: the scaled-YOLOv4 box coordinates (new_coords=1) are not implemented "
        "by the gradient dialect's loss; use model.darknet_dialect: alexeyab, or remove the key")
    assert not (out / "checkpoints").exists()


def test_export_upto_writes_seen_zero_as_darknet_partial_does(tmp_path):
    """``darknet partial`` (AlexeyAB's src/darknet.c) sets ``*net.seen = 0`` before ``save_weights_upto``, so that a
    training from the ``.conv.N`` starts at iteration 0, burn-in included: ``export --upto N`` writes seen 0 (it wrote
    the source's) and says so; a whole network's file keeps the source's seen."""
    from bigbatch.darknet import write_weights
    from bigbatch.darknet.export import export
    from bigbatch.darknet.models import darknet_network

    cfg = DARKNET_DATA / "yolov3-tiny.cfg"
    full = tmp_path / "trained.weights"
    write_weights(darknet_network(str(cfg)), full, seen=64_000)
    backbone, whole = tmp_path / "trained.conv.15", tmp_path / "again.weights"
    lines = export(cfg, backbone, None, weights=full, upto=15)
    assert struct.unpack("<3iQ", backbone.read_bytes()[:20]) == (0, 2, 5, 0)
    assert any("seen 0, as Darknet's partial writes it; the first 15 layers" in line for line in lines), lines
    lines = export(cfg, whole, None, weights=full)
    assert struct.unpack("<3iQ", whole.read_bytes()[:20]) == (0, 2, 5, 64_000)
    assert any("seen 64,000)" in line for line in lines), lines


def test_export_gives_each_output_a_file_of_its_own(tmp_path, monkeypatch):
    """``--darknet-weights x.cfg`` wrote the weights, then the cfg beside them over them; ``--checkpoint`` given the
    weights' path another way (absolute against relative), or the cfg's, wrote over that file: both were reported
    written. Each case is one line before anything is written."""
    from tests.helpers import ROOT

    cfg = ROOT / "bigbatch" / "configs" / "yolov3-tiny-shapes.cfg"
    monkeypatch.chdir(tmp_path)
    for args, expected in (
            (["--darknet-weights", "x.cfg"], "--darknet-weights: x.cfg ends in .cfg, the name of the network's cfg"),
            (["--darknet-weights", "a.weights", "--checkpoint", str(tmp_path / "a.weights")],
             f"--checkpoint: {tmp_path / 'a.weights'} is also --darknet-weights"),
            (["--darknet-weights", "s.weights", "--checkpoint", "s.cfg"],
             "--checkpoint: s.cfg is also the cfg written beside the weights")):
        result = run_main("export", str(cfg), *args, cwd=tmp_path)
        assert result.returncode == 2 and result.stderr.startswith(f"error: {expected}"), result.stderr
        assert result.stderr.count("\n") == 1 and list(tmp_path.iterdir()) == [], result.stderr
