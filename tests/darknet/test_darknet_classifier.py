"""Darknet's classifier layers ([avgpool], [softmax], [cost]) against numpy transcriptions of avgpool_layer.c,
blas.c ``softmax``/``softmax_cpu``, tree.c ``read_tree`` and get_network_output (partial ``.weights`` files:
``tests/darknet/test_darknet_classify.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from bigbatch.darknet import read_darknet_cfg
from bigbatch.darknet.network import DarknetNetwork
from bigbatch.errors import UserError

HEAD = """[net]
width=8
height=8
channels=3

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=6
size=1
stride=1
pad=1
activation=linear

[avgpool]

[softmax]
{softmax}

[cost]
type=sse
"""


def network(tmp_path: Path, softmax: str = "", name: str = "c.cfg") -> DarknetNetwork:
    path = tmp_path / name
    path.write_text(HEAD.format(softmax=softmax))
    return DarknetNetwork(read_darknet_cfg(path)).eval()


def np_softmax(x: np.ndarray, temp: float) -> np.ndarray:
    """blas.c softmax: exp(x/temp - largest/temp) / sum."""
    e = np.exp(x / temp - x.max() / temp)
    return e / e.sum()


def test_avgpool_softmax_cost_forward(tmp_path: Path) -> None:
    net = network(tmp_path, "groups=2\ntemperature=0.5")
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    net = net.double()
    with torch.no_grad():
        every = net.forward_layers(x)
        (logits,) = net(x)
    conv = every[2].numpy()
    avg = conv.reshape(2, 6, -1).mean(axis=2)  # avgpool_layer.c: sum over h*w / (h*w)
    np.testing.assert_allclose(every[3].numpy().reshape(2, 6), avg, rtol=1e-12)
    soft = np.stack([np.concatenate([np_softmax(row[g * 3:(g + 1) * 3], 0.5) for g in range(2)]) for row in avg])
    np.testing.assert_allclose(every[4].numpy().reshape(2, 6), soft, rtol=1e-12)
    np.testing.assert_array_equal(every[5].numpy(), every[4].numpy())  # [cost]: get_network_output skips it
    # the network returns the head input: the logits
    np.testing.assert_allclose(logits.numpy().reshape(2, 6), avg, rtol=1e-12)
    assert [s[1].size for s in net.shapes][3:] == [6, 6, 6]


def test_softmax_tree(tmp_path: Path) -> None:
    # 5 lines, parents -1 -1 0 0 1: runs of equal parent [2, 2, 1]; the 6th output is not in the tree: 0
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "t.tree").write_text("a -1\nb -1\nc 0\nd 0\ne 1\n")
    sub = tmp_path / "cfg"
    sub.mkdir()
    net = network(sub, "tree=data/t.tree")  # found relative to the cfg folder's parent, as from Darknet's root
    x = torch.randn(3, 3, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        every = net.double().forward_layers(x)
    avg = every[3].numpy().reshape(3, 6)
    want = np.stack([np.concatenate([np_softmax(r[0:2], 1), np_softmax(r[2:4], 1), np_softmax(r[4:5], 1), [0.0]])
                     for r in avg])
    np.testing.assert_allclose(every[4].numpy().reshape(3, 6), want, rtol=1e-12)


def test_softmax_tree_missing_and_groups(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="tree: nowhere.tree not found"):
        network(tmp_path, "tree=nowhere.tree")
    with pytest.raises(UserError, match="groups: 4 does not divide the 6 inputs"):
        network(tmp_path, "groups=4")
