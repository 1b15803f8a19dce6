"""Every stock ``.cfg`` bigbatch builds exports to ONNX (``bigbatch.inference.export.write_onnx``: the dynamo
exporter, opset 18, batch 1) and passes the export's own check (``check_file``: onnxruntime against PyTorch on 2
seeded random inputs, ``max|a - b| / max|b|`` at most ``TOLERANCE``).

Each cfg is built at the size ``tests/fixtures/darknet/stock/oracle.json`` records for it (its own, or 64-128 px for
the large detectors and the p6/p7 cfgs), with seeded random weights (:func:`randomize`) in eval mode. The default
suite exports a few small representative cfgs (:data:`QUICK`); the whole list is under ``slow``
(``make test-slow``); ``benchmarks/darknet_onnx_sweep.py`` runs the whole list with a timeout per cfg and prints a
table. Every cfg bigbatch builds (120 of the 132) exports and passes (``docs/darknet.md``, "Exporting to ONNX");
the 12 it refuses by design (recurrent layers, ``xnor=1``) are skipped here (``test_darknet_stock.py`` checks the
refusal).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import DARKNET_DATA

STOCK = DARKNET_DATA / "stock"
ORACLE_FILE = STOCK / "oracle.json"
ORACLE = json.loads(ORACLE_FILE.read_text(encoding="utf-8"))["entries"] if ORACLE_FILE.is_file() else []
CHECK_INPUTS = 2
SEED = 0

QUICK = {"alexeyab/yolov4-tiny.cfg": 64}
"""The cfg exported in every run of the suite, at a small input size (the suite keeps under 10 minutes on 2 cores;
yolov3-tiny's and the classifiers' networks are exported by tests/inference/test_export.py); the others, at the
oracle's size, under ``slow``."""

def entry_id(entry: dict) -> str:
    return f"{entry['fork']}/{entry['cfg']}"


def stock_path(entry: dict) -> Path:
    return STOCK / entry["fork"] / entry["cfg"]


def randomize(network: torch.nn.Module, seed: int = SEED) -> None:
    """Every value a ``.weights`` file holds, seeded, by the oracle's rule (``benchmarks/darknet_oracle/``):
    convolution and connected weights uniform with variance 1 / fan_in, biases and BN shifts and means small, BN
    scales around 1, BN variances in [0.5, 1.5). (With variance 2 / fan_in the deepest cfgs' activations reach
    1e12, where float32 rounding alone flips the sign of a logistic's input: a difference of 1 between two correct
    computations.)"""
    from bigbatch.darknet.weights import named_weight_tensors

    tensors = named_weight_tensors(network)
    sizes: dict[tuple[int, str], int] = {(index, name): t.numel() for index, name, t in tensors}
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for index, name, tensor in tensors:
            u = torch.rand(tensor.shape, generator=generator, dtype=torch.float32)
            if name == "scales":
                values = 0.8 + 0.4 * u
            elif name == "rolling_variance":
                values = 0.5 + u
            elif name == "weights":
                fan_in = sizes[index, "weights"] / max(sizes.get((index, "biases"), 1), 1)
                values = (2 * u - 1) * (3.0 / fan_in) ** 0.5
            else:  # biases, rolling_mean, and any other
                values = 0.2 * (u - 0.5)
            tensor.copy_(values)


def build(path: Path, width: int | None, height: int | None):
    """The seeded, eval-mode network of the cfg at ``path`` (a ``UserError`` where bigbatch refuses it)."""
    from bigbatch.darknet import DarknetNetwork, read_darknet_cfg

    network = DarknetNetwork(read_darknet_cfg(path), width, height)
    randomize(network)
    return network.eval()


def export_and_check(network, folder: Path) -> float:
    """Export ``network`` to ``folder/net.onnx`` as ``bigbatch export`` does (batch 1) and check it on
    :data:`CHECK_INPUTS` seeded random inputs; -> the largest difference (``CheckFailed`` over the tolerance)."""
    from bigbatch.inference.export import OPSET, check_file, write_onnx

    shape = network.input_shape
    inputs = torch.rand(CHECK_INPUTS, shape.channels, shape.height, shape.width,
                        generator=torch.Generator().manual_seed(SEED))
    path = folder / "net.onnx"
    write_onnx(network, inputs[:1], path, "{}", OPSET, dynamic_batch=False)
    return check_file(network, path, "onnx", inputs, dynamic_batch=False)


def cases() -> list:
    """Every stock cfg with the size the oracle ran it at (the ``[net]`` size where the oracle has none), the
    :data:`QUICK` ones at their small size in every run, all under ``slow``."""
    params = [pytest.param(f"{key}@{side}", STOCK / key, side, side, id=f"{key}@{side}")
              for key, side in QUICK.items()]
    for entry in ORACLE:
        params.append(pytest.param(entry_id(entry), stock_path(entry), entry.get("width"), entry.get("height"),
                                   id=entry_id(entry), marks=pytest.mark.slow))
    return params


pytestmark = [pytest.mark.skipif(not ORACLE, reason="tests/fixtures/darknet/stock/oracle.json is absent"),
              pytest.mark.filterwarnings("ignore")]


@pytest.mark.parametrize("key, path, width, height", cases())
def test_a_stock_cfg_bigbatch_builds_exports_to_onnx_and_passes_the_check(key, path, width, height, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from bigbatch.errors import UserError
    from bigbatch.inference.export import TOLERANCE

    if not path.is_file():
        pytest.skip(f"{path} is absent")
    try:
        network = build(path, width, height)
    except UserError:
        pytest.skip("refused by design (recurrent or xnor layers): test_darknet_stock.py checks the refusal")
    worst = export_and_check(network, tmp_path)
    assert 0 <= worst <= TOLERANCE
    if "@" in key:  # the same file against the network with one weight changed: the check sees it
        from bigbatch.inference.export import CheckFailed, check_file

        with torch.no_grad():
            next(w for w in network.parameters() if w.dim() == 4).mul_(-1)
        shape = network.input_shape
        inputs = torch.rand(1, shape.channels, shape.height, shape.width, generator=torch.Generator().manual_seed(0))
        with pytest.raises(CheckFailed):
            check_file(network, tmp_path / "net.onnx", "onnx", inputs, dynamic_batch=False)
