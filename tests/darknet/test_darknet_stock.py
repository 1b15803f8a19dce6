"""Every stock ``.cfg`` of both Darknet forks against Darknet itself.

``tests/fixtures/darknet/stock/oracle.json`` was measured with Darknet built from source (AlexeyAB's fork and
pjreddie's, CPU), each cfg against its own fork, by ``benchmarks/darknet_oracle/`` (a C program linking
``libdarknet.so``; its README has the rules and the commands). For each cfg Darknet builds it holds the ``.weights``
size Darknet's ``save_weights`` writes, and each layer's output after ``network_predict`` with every saved value
set by a fixed rule (below) on a fixed input. bigbatch must build the same cfg at the same input size, with a
``.weights`` file of the same size, and, with the same values loaded in its own file order, compute the same
outputs, layer by layer, to float32 rounding. The cfgs bigbatch refuses by design (recurrent layers, binary
convolutions) must be refused with one line.

The fill rule (``benchmarks/darknet_oracle/README.md``): value ``k`` of the ``.weights`` stream is
``u = (hash32(k) >> 8) / 2**24``, mapped by the role of the tensor it lies in: biases and rolling means
``0.2 (u - 0.5)``, scales ``0.8 + 0.4 u``, rolling variances ``0.5 + u``, weights ``(2u - 1) sqrt(3 / fan_in)`` with
``fan_in`` = the layer's weights / its biases; input value ``k`` is ``u(k + 0x9E3779B9)``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bigbatch.darknet import DarknetNetwork, read_darknet_cfg, weights_size
from bigbatch.darknet.weights import named_weight_tensors
from bigbatch.errors import UserError
from tests.helpers import DARKNET_DATA

STOCK = DARKNET_DATA / "stock"
ORACLE_FILE = STOCK / "oracle.json"
ORACLE = json.loads(ORACLE_FILE.read_text(encoding="utf-8"))["entries"] if ORACLE_FILE.is_file() else []
REFUSED_SECTIONS = ("[rnn]", "[gru]", "[lstm]", "[crnn]", "[conv_lstm]")
"""Recurrent layers: refused by design, as binary (xnor) convolutions are."""


UNDECODED_HEADS = ("region", "Gaussian_yolo", "contrastive")
"""Heads whose own output is Darknet's decoding (region: logistic and softmax, laid out differently by each fork),
which bigbatch does not implement: the network returns their input, which is compared (the layer before)."""

CPU_DARKNET_DIFFERS = {
    ("alexeyab", "efficientnet-lite3.cfg"):
        "relu6: AlexeyAB's CPU activate() has no RELU6 case and returns 0; its CUDA kernel, which people train with, "
        "and bigbatch compute min(max(x, 0), 6)",
}
"""Cfgs whose outputs Darknet's CPU build computes wrongly: their bytes and shapes are compared, not their values."""


def refused_by_design(text: str) -> bool:
    lines = {line.split("#")[0].replace(" ", "") for line in text.splitlines()}
    return any(section in lines for section in REFUSED_SECTIONS) or "xnor=1" in lines


def hash32(x: np.ndarray) -> np.ndarray:
    """The oracle's integer hash, on uint32 (wrapping, as C's unsigned arithmetic)."""
    x = x.astype(np.uint32)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint32(16)
        x *= np.uint32(0x7FEB352D)
        x ^= x >> np.uint32(15)
        x *= np.uint32(0x846CA68B)
        x ^= x >> np.uint32(16)
    return x


def uniform(start: int, count: int) -> np.ndarray:
    """``u(k)`` for ``k`` in ``[start, start + count)``, float32 in [0, 1)."""
    k = (np.arange(count, dtype=np.uint64) + np.uint64(start)) % np.uint64(2**32)
    return (hash32(k) >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def fill_as_the_oracle(network: DarknetNetwork) -> None:
    """Every value a ``.weights`` file holds, set by the oracle's rule, in bigbatch's own file order."""
    tensors = named_weight_tensors(network)
    per_layer: dict[int, dict[str, int]] = {}
    for index, name, tensor in tensors:
        per_layer.setdefault(index, {})[name] = tensor.numel()
    k = 0
    with torch.no_grad():
        for index, name, tensor in tensors:
            u = uniform(k, tensor.numel())
            k += tensor.numel()
            if name == "scales":
                values = np.float32(0.8) + np.float32(0.4) * u
            elif name == "rolling_variance":
                values = np.float32(0.5) + u
            elif name == "weights":
                fan_in = np.float32(per_layer[index]["weights"] / per_layer[index]["biases"])
                values = (np.float32(2.0) * u - np.float32(1.0)) * np.sqrt(np.float32(3.0) / fan_in)
            else:  # biases, rolling_mean, and any other
                values = np.float32(0.2) * (u - np.float32(0.5))
            tensor.copy_(torch.from_numpy(values.astype(np.float32)).view(tensor.shape))


def oracle_input(channels: int, height: int, width: int) -> torch.Tensor:
    return torch.from_numpy(uniform(0x9E3779B9, channels * height * width)).view(1, channels, height, width)


def stock_path(entry: dict):
    return STOCK / entry["fork"] / entry["cfg"]


def entry_id(entry: dict) -> str:
    return f"{entry['fork']}/{entry['cfg']}"


SLOW_VALUES = 50_000_000
"""A cfg whose weights and layer outputs hold more values than this (the p6/p7 detectors, VGG, ResNet-152...) is
compared under the ``slow`` marker (``make test-slow``), the others in every run of the suite, with the smallest
cfg of each section that only large cfgs use."""


def cost(entry: dict) -> int:
    return (entry["weights_bytes"] or 0) // 4 + sum(layer["outputs"] for layer in entry["layers"])


def sections(entry: dict) -> set[str]:
    text = stock_path(entry).read_text(encoding="utf-8", errors="replace")
    return {line.strip() for line in text.splitlines() if line.strip().startswith("[")}


def quick_entries() -> set[str]:
    """The cfgs compared in every run: the small ones, and for each section only large cfgs use, the smallest."""
    built = sorted((e for e in ORACLE if e["built"]), key=cost)
    quick = {entry_id(e) for e in built if cost(e) <= SLOW_VALUES}
    covered = set().union(*(sections(e) for e in built if entry_id(e) in quick)) if quick else set()
    for entry in built:
        if not sections(entry) <= covered:
            quick.add(entry_id(entry))
            covered |= sections(entry)
    return quick


QUICK = quick_entries()


def entries(built: bool) -> list:
    return [e if entry_id(e) in QUICK else pytest.param(e, marks=pytest.mark.slow)
            for e in ORACLE if e["built"] == built]


pytestmark = pytest.mark.skipif(not ORACLE, reason="tests/fixtures/darknet/stock/oracle.json is absent")


def test_the_oracle_covers_every_stock_cfg():
    on_disk = {f"{p.parent.name}/{p.name}" for p in STOCK.glob("*/*.cfg")}
    measured = {entry_id(e) for e in ORACLE}
    assert on_disk == measured


def test_every_layer_kind_is_compared_in_every_run_of_the_suite():
    """The cfgs left to ``slow`` are large, not the only ones of a kind."""
    from bigbatch.darknet.spec import KINDS

    quick = [e for e in entries(True) if isinstance(e, dict)]
    seen = set()
    for entry in quick:
        try:
            seen |= {layer.kind for layer in read_darknet_cfg(stock_path(entry)).layers}
        except UserError:  # refused by design
            continue
    assert set(KINDS) - seen == set()


@pytest.mark.parametrize("entry", entries(True), ids=entry_id)
def test_a_stock_cfg_darknet_builds_is_built_with_its_bytes_and_outputs(entry):
    path = stock_path(entry)
    if refused_by_design(path.read_text(encoding="utf-8", errors="replace")):
        with pytest.raises(UserError) as refused:
            DarknetNetwork(read_darknet_cfg(path), entry["width"], entry["height"])
        assert len(str(refused.value).splitlines()) == 1
        return
    network = DarknetNetwork(read_darknet_cfg(path), entry["width"], entry["height"]).eval()
    assert weights_size(network) == entry["weights_bytes"]
    assert len(network.layers) == len(entry["layers"])
    shapes = [(out.channels * out.height * out.width) for _, out in network.shapes]
    assert shapes == [layer["outputs"] for layer in entry["layers"]]
    if (entry["fork"], entry["cfg"]) in CPU_DARKNET_DIFFERS:
        return
    fill_as_the_oracle(network)
    with torch.no_grad():
        outputs = network.forward_layers(oracle_input(network.input_shape.channels, network.input_shape.height,
                                                       network.input_shape.width))
    for index, (output, expected) in enumerate(zip(outputs, entry["layers"], strict=True)):
        where = f"{entry_id(entry)} layer {index} ({expected['type']})"
        assert output.numel() == expected["outputs"], where
        if expected["type"] == "cost" and expected["max_abs"] == 0:
            continue  # AlexeyAB's [cost] output is its per-element loss, zero without a truth; the network skips it
        if network.cfg.layers[index].kind in UNDECODED_HEADS:
            continue
        values = output.detach().double().flatten()
        scale = max(expected["std"], abs(expected["mean"]), 1e-3)
        positions = [j * (values.numel() - 1) // 7 for j in range(8)]
        got = values[positions].numpy()
        np.testing.assert_allclose(got, expected["samples"], rtol=2e-3, atol=2e-3 * scale, err_msg=where)
        assert values.mean().item() == pytest.approx(expected["mean"], rel=2e-3, abs=2e-4 * scale), where
        assert values.std(unbiased=False).item() == pytest.approx(expected["std"], rel=2e-3, abs=2e-4 * scale), where


@pytest.mark.parametrize("entry", entries(False), ids=entry_id)
def test_a_stock_cfg_darknet_cannot_build_is_built_or_refused_with_one_line(entry):
    """Darknet crashes on these (its README lists why); bigbatch builds them where it can, or says why in a line."""
    path = stock_path(entry)
    try:
        DarknetNetwork(read_darknet_cfg(path), entry.get("width"), entry.get("height"))
    except UserError as refused:
        assert len(str(refused).splitlines()) == 1


@pytest.mark.parametrize("entry", entries(True), ids=entry_id)
def test_show_prints_every_stock_cfg_darknet_builds_without_its_data(entry, tmp_path, monkeypatch, capsys):
    """``bigbatch show NET.cfg`` plans the cfg's ``max_batches`` steps with the epochs unknown (no data is at hand
    here), for the classifiers (an image folder not given) and the detectors alike; the cfgs bigbatch refuses by
    design are one ``error:`` line naming the cfg's line. (The large cfgs under ``slow``, as above.)"""
    from bigbatch.cli import main

    monkeypatch.chdir(tmp_path)  # no data of any kind here
    path = stock_path(entry)
    rc = main(["show", str(path)])
    shown = capsys.readouterr()
    if refused_by_design(path.read_text(encoding="utf-8", errors="replace")):
        assert rc == 2 and shown.err.startswith(f"error: {path}:") and len(shown.err.splitlines()) == 1, shown.err
        return
    assert rc == 0, shown.err
    assert f"network of {path}" in shown.out
    net = read_darknet_cfg(path).net
    max_batches = [int(line.split("=")[1].split("#")[0]) for line in path.read_text(encoding="utf-8").splitlines()
                   if line.replace(" ", "").startswith("max_batches=")]
    if max_batches and max_batches[-1] > 0:  # the run's length is the cfg's
        assert f"steps: {max_batches[-1]}" in shown.out
        if net is not None and "[softmax]" in {line.strip() for line in path.read_text(encoding="utf-8").splitlines()}:
            assert "epochs          unknown" in shown.out  # an image folder not given: its size is not known
    else:  # Darknet trains it until stopped: no length to plan; the recipe still rescales
        assert "steps           not set" in shown.out
        assert main(["scale", str(path), "--batch", "64"]) == 0, capsys.readouterr().err
