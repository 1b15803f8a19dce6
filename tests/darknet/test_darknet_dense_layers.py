"""[connected], [local], [local_avgpool] and [crop]: each module against a loop transcription of Darknet's CPU
forward (forward_connected_layer, forward_local_layer with im2col_cpu, forward_local_avgpool_layer,
forward_crop_layer) on small inputs, the .weights byte counts, a write/read round trip, and the stock cfgs."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from bigbatch.darknet.cfg import read_darknet_cfg
from bigbatch.darknet.network import DarknetNetwork, layer_table
from bigbatch.darknet.weights import read_weights, weights_size, write_weights
from bigbatch.errors import UserError
from tests.helpers import DARKNET_DATA

STOCK = DARKNET_DATA / "stock"


def network(tmp_path: Path, body: str, w: int = 7, h: int = 6, c: int = 3) -> DarknetNetwork:
    path = tmp_path / "t.cfg"
    path.write_text(f"[net]\nwidth={w}\nheight={h}\nchannels={c}\n\n{body}")
    return DarknetNetwork(read_darknet_cfg(path)).eval()


def fill(net: DarknetNetwork) -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for layer in net.layers:
            for name, t in getattr(layer, "darknet_tensors", list)():
                t.copy_(torch.rand(t.shape, generator=g) + (0.5 if name == "rolling_variance" else -0.5))


@pytest.mark.fast
def test_connected_matches_darknet_loop(tmp_path: Path) -> None:
    net = network(tmp_path, "[connected]\noutput=5\nactivation=linear\nbatch_normalize=1\n")
    fill(net)
    x = torch.randn(2, 3, 6, 7)
    got = net.forward_layers(x)[-1]
    assert got.shape == (2, 5, 1, 1)
    (b, wt, s, m, v) = (t.detach() for _, t in net.layers[0].darknet_tensors())
    xs, W = x.numpy().reshape(2, -1), wt.detach().numpy().reshape(-1)
    inputs = 3 * 6 * 7
    want = np.zeros((2, 5), np.float32)
    for i in range(2):  # gemm(0,1): out[i][j] = sum_k in[i*k + k] * W[j*inputs + k]
        for j in range(5):
            acc = sum(float(xs[i, k]) * float(W[j * inputs + k]) for k in range(inputs))
            acc = (acc - float(m[j])) / math.sqrt(float(v[j]) + 1e-5) * float(s[j]) + float(b[j])
            want[i, j] = acc
    np.testing.assert_allclose(got.detach().numpy().reshape(2, 5), want, rtol=1e-4, atol=1e-5)
    assert weights_size(net) == 20 + 4 * (5 + 5 * inputs + 3 * 5)


def im2col(x: np.ndarray, size: int, stride: int, pad: int) -> np.ndarray:
    c, h, w = x.shape
    hc, wc = (h + 2 * pad - size) // stride + 1, (w + 2 * pad - size) // stride + 1
    col = np.zeros((c * size * size, hc * wc), np.float32)
    for cc in range(c * size * size):
        wo, ho, ci = cc % size, (cc // size) % size, cc // size // size
        for i in range(hc):
            for j in range(wc):
                r, q = ho + i * stride - pad, wo + j * stride - pad
                col[cc, i * wc + j] = x[ci, r, q] if 0 <= r < h and 0 <= q < w else 0
    return col


@pytest.mark.fast
@pytest.mark.parametrize("size,stride,pad", [(3, 1, 1), (3, 2, 1), (2, 1, 0), (3, 2, 0)])
def test_local_matches_darknet_loop(tmp_path: Path, size: int, stride: int, pad: int) -> None:
    net = network(tmp_path, f"[local]\nfilters=4\nsize={size}\nstride={stride}\npad={pad}\nactivation=linear\n")
    fill(net)
    x = torch.randn(2, 3, 6, 7)
    got = net.forward_layers(x)[-1].detach().numpy()
    (_, b), (_, wt) = net.layers[0].darknet_tensors()
    bflat, wflat = b.detach().numpy().reshape(-1), wt.detach().numpy().reshape(-1)
    k = 3 * size * size
    for n in range(2):
        col = im2col(x[n].numpy(), size, stride, pad)
        L = col.shape[1]
        out = bflat.copy()  # copy_cpu(biases) then per location gemm with a = weights + j*k*filters
        for j in range(L):
            a = wflat[j * k * 4:(j + 1) * k * 4].reshape(4, k)
            out[j::L][:4] += a @ col[:, j]
        np.testing.assert_allclose(got[n].reshape(-1), out, rtol=1e-4, atol=1e-5)
    oh, ow = got.shape[2:]
    assert weights_size(net) == 20 + 4 * (4 * oh * ow + oh * ow * 4 * k)


@pytest.mark.fast
def test_local_refuses_pad_im2col_disagrees(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="im2col"):
        network(tmp_path, "[local]\nfilters=2\nsize=5\npad=1\n")


@pytest.mark.fast
@pytest.mark.parametrize("size,stride,padding", [(3, 1, None), (2, 2, None), (3, 2, 1), (3, 1, 4), (2, 1, 0)])
def test_local_avgpool_matches_darknet_loop(tmp_path: Path, size: int, stride: int, padding: int | None) -> None:
    extra = "" if padding is None else f"padding={padding}\n"
    net = network(tmp_path, f"[local_avgpool]\nsize={size}\nstride={stride}\n{extra}")
    x = torch.randn(2, 3, 6, 7)
    got = net.forward_layers(x)[-1].detach().numpy()
    p = size - 1 if padding is None else padding
    h, w = 6, 7
    oh, ow = (h + p - size) // stride + 1, (w + p - size) // stride + 1
    assert got.shape == (2, 3, oh, ow)
    xs = x.numpy()
    for b in range(2):
        for k in range(3):
            for i in range(oh):
                for j in range(ow):
                    vals = [xs[b, k, -(p // 2) + i * stride + n, -(p // 2) + j * stride + m]
                            for n in range(size) for m in range(size)
                            if 0 <= -(p // 2) + i * stride + n < h and 0 <= -(p // 2) + j * stride + m < w]
                    want = sum(vals) / len(vals) if vals else float("nan")
                    np.testing.assert_allclose(got[b, k, i, j], want, rtol=1e-5, atol=1e-6)
    assert "avg" in layer_table(net)


@pytest.mark.fast
@pytest.mark.parametrize("noadjust", [0, 1])
def test_crop_eval_and_train(tmp_path: Path, noadjust: int) -> None:
    net = network(tmp_path, f"[crop]\ncrop_height=3\ncrop_width=4\nflip=1\nnoadjust={noadjust}\nshift=.2\n")
    x = torch.rand(2, 3, 6, 7)
    scale, trans = (1.0, 0.0) if noadjust else (2.0, -1.0)
    got = net.forward_layers(x)[-1]
    dh, dw = (6 - 3) // 2, (7 - 4) // 2
    torch.testing.assert_close(got, x[..., dh:dh + 3, dw:dw + 4] * scale + trans)
    assert weights_size(net) == 20
    net.train()
    seen = set()
    for _ in range(60):
        y = net(x)[0]
        assert y.shape == (2, 3, 3, 4)
        hits = []
        for dh in range(4):
            for dw in range(4):
                plain = x[..., dh:dh + 3, dw:dw + 4] * scale + trans
                flipped = x[..., dh:dh + 3, 7 - dw - 4:7 - dw].flip(-1) * scale + trans  # col = w - dw - j - 1
                hits += [(dh, dw, False)] * bool(torch.equal(y, plain)) + [(dh, dw, True)] * bool(
                    torch.equal(y, flipped))
        assert hits
        seen.update(hits)
    assert any(f for *_, f in seen) and any(not f for *_, f in seen) and len(seen) > 4


@pytest.mark.fast
def test_crop_larger_than_input_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="crop_width"):
        network(tmp_path, "[crop]\ncrop_height=3\ncrop_width=8\n")


@pytest.mark.fast
def test_weights_round_trip(tmp_path: Path) -> None:
    body = ("[local]\nfilters=2\nsize=3\npad=1\nactivation=leaky\n\n[local_avgpool]\nsize=2\nstride=2\n\n"
            "[connected]\noutput=4\nbatch_normalize=1\nactivation=linear\n\n[conn]\noutput=3\n")
    a, b = network(tmp_path, body), network(tmp_path, body)
    fill(a)
    write_weights(a, tmp_path / "a.weights")
    assert (tmp_path / "a.weights").stat().st_size == weights_size(a)
    read_weights(b, tmp_path / "a.weights")
    x = torch.randn(1, 3, 6, 7)
    torch.testing.assert_close(a(x)[0], b(x)[0], rtol=0, atol=0)


STOCK_CFGS = sorted(p for p in STOCK.glob("*/*.cfg") if any(
    line.strip() in ("[connected]", "[conn]", "[local]", "[local_avgpool]", "[local_avg]", "[crop]")
    for line in p.read_text().splitlines()))


def built_prefix(path: Path, tmp_path: Path) -> Path:
    """The cfg at ``path`` cut before its first section bigbatch does not build yet (built by others)."""
    from bigbatch.darknet.spec import SECTIONS

    lines = path.read_text().splitlines()
    for n, line in enumerate(lines):
        name = line.strip()
        if n and name.startswith("[") and name.endswith("]") and name[1:-1] not in {*SECTIONS, "net", "network"}:
            lines = lines[:n]
            break
    out = tmp_path / path.name
    out.write_text("\n".join(lines) + "\n")
    return out


RECURRENT = ("[rnn]", "[gru]", "[lstm]", "[crnn]")


@pytest.mark.slow  # the whole cfgs are compared with Darknet's outputs in tests/darknet/test_darknet_stock.py
@pytest.mark.parametrize("path", STOCK_CFGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_stock_cfgs_get_past_these_layers(path: Path, tmp_path: Path) -> None:
    """Each stock cfg with these layers, cut before the first layer kind not built yet (others add them), is built
    through its [connected]/[local]/[local_avgpool]/[crop] layers, and writes and reads its .weights."""
    text = path.read_text()
    if any(r in text for r in RECURRENT):
        with pytest.raises(UserError, match="recurrent"):
            read_darknet_cfg(path)
        return
    prefix = built_prefix(path, tmp_path)
    cfg = read_darknet_cfg(prefix)
    ours = cfg.of_kind("connected", "local", "local_avgpool", "crop")
    if not ours:
        pytest.skip("no layer of these kinds before the first kind not built yet")
    net = DarknetNetwork(cfg).eval()
    write_weights(net, tmp_path / "w.weights")
    assert (tmp_path / "w.weights").stat().st_size == weights_size(net)
    read_weights(net, tmp_path / "w.weights")


def _u(k: np.ndarray) -> np.ndarray:
    """benchmarks/darknet_oracle's u(k): hash32(k) >> 8, over 2**24 (float32)."""
    x = k.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7feb352d)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846ca68b)
    x ^= x >> np.uint32(16)
    return (x >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def _oracle_fill(net: DarknetNetwork) -> torch.Tensor:
    """The oracle's fill rule (benchmarks/darknet_oracle/README.md) on ``net``; -> its input rule's input."""
    f = np.float32
    k = 0
    with torch.no_grad():
        for layer in net.layers:
            tensors = dict(getattr(layer, "darknet_tensors", list)())
            if not tensors:
                continue
            fan_in = tensors["weights"].numel() // tensors["biases"].numel()
            for name, t in layer.darknet_tensors():
                u = _u(np.arange(k, k + t.numel(), dtype=np.uint64))
                k += t.numel()
                value = {"scales": f(0.8) + f(0.4) * u, "rolling_variance": f(0.5) + u,
                         "weights": (f(2) * u - f(1)) * np.sqrt(f(3) / f(fan_in))}.get(name, f(0.2) * (u - f(0.5)))
                t.copy_(torch.from_numpy(value.reshape(t.shape)))
    s = net.input_shape
    return torch.from_numpy(_u(np.arange(s.size, dtype=np.uint64) + 0x9E3779B9).reshape(1, *tuple(
        (s.channels, s.height, s.width))))


DARKNET_AVG = ("[local_avgpool]\nsize=3\nstride=1\n\n[local_avgpool]\nsize=2\nstride=2\n\n"
               "[local_avgpool]\nsize=3\nstride=2\npadding=1\n\n[connected]\noutput=7\nbatch_normalize=1\n"
               "activation=leaky\n")
DARKNET_LOCAL = ("[local]\nsize=3\nstride=2\npad=1\nfilters=4\nactivation=leaky\n\n[connected]\noutput=7\n"
                 "batch_normalize=1\nactivation=linear\n\n[crop]\ncrop_height=1\ncrop_width=1\n")
MEASURED = {  # Darknet's own outputs, measured with benchmarks/darknet_oracle's oracle_alexeyab (AlexeyAB 59596d7)
    # on these cfgs (7 x 6 x 3 input): each layer's values at floor(j * (outputs - 1) / 7), j = 0..7
    DARKNET_AVG: [
        [0.280775845, 0.341228843, 0.529003382, 0.527408063, 0.428132117, 0.347507596, 0.486902565, 0.514642119],
        [0.316124618, 0.390710056, 0.448619872, 0.453226775, 0.41214934, 0.34252584, 0.400033653, 0.522963405],
        [0.414902151, 0.414902151, 0.511322677, 0.419137895, 0.419137895, 0.426965326, 0.433152616, 0.381380409],
        [-0.00921631604, -0.00921631604, -0.0199561585, -0.0744873956, -0.0171962436, -0.0783070177,
         -0.0104216011, 0.482305557]],
    DARKNET_LOCAL: [
        [0.17007786, -0.122899987, 0.407377511, -0.00726883439, -0.0238710102, -0.0400358252, 0.643602669,
         -0.0167757329],
        [-0.131823614, -0.131823614, -0.275161564, -0.0205205753, 0.0925730765, 0.227452219, -0.0228856914,
         0.619751871],
        [-1.2636472, -1.2636472, -1.55032313, -1.04104114, -0.814853847, -0.545095563, -1.04577136, 0.239503741]],
}


@pytest.mark.fast
@pytest.mark.parametrize("body", [DARKNET_AVG, DARKNET_LOCAL], ids=["local_avgpool+connected", "local+connected+crop"])
def test_against_darknet_measured(tmp_path: Path, body: str) -> None:
    """The oracle's weights and input; outputs against the values Darknet (AlexeyAB, CPU) computed."""
    net = network(tmp_path, body)
    x = _oracle_fill(net)
    for out, want in zip(net.forward_layers(x), MEASURED[body], strict=True):
        y = out.detach().reshape(-1).numpy()
        idx = [j * (y.size - 1) // 7 for j in range(8)]
        np.testing.assert_allclose(y[idx], want, rtol=1e-5, atol=1e-6)
