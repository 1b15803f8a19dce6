"""Darknet classifier cfgs trained by bigbatch: stock darknet19.cfg (AlexeyAB's file) through the CLI on a folder of
real JPEGs, from a ``.conv.N`` backbone file; partial ``.weights`` files as Darknet's ``load_weights_upto`` reads
them; the classifier head following the dataset's classes."""

from __future__ import annotations

import json

import pytest
import torch

from bigbatch.darknet import DarknetNetwork, read_darknet_cfg, weights_size, write_weights
from bigbatch.darknet.cfg import with_classes
from bigbatch.darknet.weights import layer_boundaries, named_weight_tensors, read_weights_upto
from bigbatch.errors import UserError
from tests.helpers import DARKNET_DATA, run_main, write_photo_folder

DARKNET19 = DARKNET_DATA / "stock" / "alexeyab" / "darknet19.cfg"


def darknet19(seed: int, size: int = 32, classes: int | None = None) -> DarknetNetwork:
    torch.manual_seed(seed)
    cfg = read_darknet_cfg(DARKNET19)
    return DarknetNetwork(with_classes(cfg, classes) if classes else cfg, size, size)


@pytest.mark.fast
def test_a_partial_file_loads_its_first_layers_and_leaves_the_rest(tmp_path):
    source, target = darknet19(0), darknet19(1)
    untouched = {(index, name): tensor.clone() for index, name, tensor in named_weight_tensors(target) if index >= 23}
    write_weights(source, tmp_path / "darknet19.conv.23", upto=23)
    assert (tmp_path / "darknet19.conv.23").stat().st_size == 20 + 4 * sum(
        t.numel() for index, _, t in named_weight_tensors(source) if index < 23)
    seen, layers = read_weights_upto(target, tmp_path / "darknet19.conv.23")
    assert (seen, layers) == (0, 23)
    for (index, name, a), (_, _, b) in zip(named_weight_tensors(source), named_weight_tensors(target), strict=True):
        if index < 23:
            assert torch.equal(a, b), (index, name)
    for index, name, tensor in named_weight_tensors(target):
        if index >= 23:
            assert torch.equal(tensor, untouched[index, name]), (index, name)
    assert not torch.equal(source.layers[23].conv.weight, target.layers[23].conv.weight)


@pytest.mark.fast
def test_a_partial_file_off_a_layer_boundary_is_refused_naming_the_nearest(tmp_path):
    network = darknet19(0)
    boundaries = sorted(layer_boundaries(network))
    path = tmp_path / "odd.weights"
    path.write_bytes((b"\0\0\0\0\2\0\0\0\0\0\0\0" + bytes(8)) + bytes(4 * (boundaries[3] + 1)))
    with pytest.raises(UserError) as refused:
        read_weights_upto(network, path)
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    below, above = (layer_boundaries(network)[boundaries[k]] for k in (3, 4))
    assert f"{20 + 4 * boundaries[3]:,} bytes (--upto {below}) or {20 + 4 * boundaries[4]:,} bytes (--upto {above})" \
        in message
    full = tmp_path / "full.weights"
    write_weights(network, full)
    assert read_weights_upto(network, full) == (0, len(network.layers))
    assert full.stat().st_size == weights_size(network)


@pytest.mark.fast
def test_the_classifier_head_takes_the_datasets_classes():
    network = darknet19(0, classes=3)
    assert network.shapes[23][1].channels == 3  # the 1000-filter convolution before [avgpool] and [softmax]
    logits = network(torch.rand(2, 3, 32, 32))
    assert len(logits) == 1 and logits[0].shape == (2, 3, 1, 1)  # the input of the [softmax]: the logits
    probabilities = network.forward_layers(torch.rand(2, 3, 32, 32))[25]
    assert torch.allclose(probabilities.sum(dim=1), torch.ones(2, 1, 1))


def test_stock_darknet19_trains_on_real_jpegs_from_a_backbone_file(tmp_path):
    """The issue's check: stock darknet19.cfg at a reduced input size, ``--set data.name=folder data.path=...``, from
    a ``.conv.23`` backbone (here Darknet's initialisation, written as ``darknet partial`` writes one), beats both
    chance (1/3) and the largest class's share of the validation set (1/2)."""
    photos = write_photo_folder(tmp_path / "photos", train=16, val=4)
    backbone = tmp_path / "darknet19.conv.23"
    exported = run_main("export", str(DARKNET19), "--darknet-weights", str(backbone), "--upto", "23")
    assert exported.returncode == 0, exported.stderr
    out = tmp_path / "run"
    trained = run_main("train", str(DARKNET19), "--out", str(out), "--set", "data.name=folder",
                       f"data.path={photos}", "data.size=32", "batch=16", "subdivisions=1", "steps=40",
                       f"model.weights={backbone}", "optim.lr=0.02", "norm.momentum=0.3")
    assert trained.returncode == 0, trained.stderr
    assert "holds the first 23 of the network's 27 layers" in trained.stdout
    assert "model.weights: loaded " in trained.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    final = [r for r in records if "top1" in r][-1]
    assert final["top1"] > 50.0, final
