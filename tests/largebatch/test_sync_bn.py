"""CrossDeviceBatchNorm against a single-process BatchNorm2d on the concatenated global batch.

Two real processes (Gloo, TCP init on 127.0.0.1) run every case once per transport of the layer's sums (the
shared-memory channel of one machine, and Gloo's all-reduce), in one spawn, and write their results to files;
the tests compare them with a plain ``nn.BatchNorm2d`` run here on the concatenated batch.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bigbatch.floor import host_all_reduce
from bigbatch.floor.host_all_reduce import HostAllReduce
from bigbatch.largebatch.sync_bn import CrossDeviceBatchNorm, convert_batchnorm
from tests.helpers import join_gloo, run_spawned

WORLD = 2
C, H, W = 4, 3, 3
STEPS = 2
# name -> (per-rank batch sizes, momentum, bf16 input under autocast)
CASES = {
    "equal": ((3, 3), 0.1, False),
    "unequal": ((5, 2), 0.1, False),
    "empty_rank": ((4, 0), 0.1, False),
    "cumulative_momentum": ((2, 5), None, False),
    "bf16_unequal": ((5, 2), 0.1, True),
    "bf16_empty_rank": ((0, 4), 0.1, True),
}
COUNT_SIZES = (2, 1)
TRANSPORTS = ("shared_memory", "gloo")


def _data(case: str, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch X and the loss weights G (loss = sum(G * y)) of one step; same on every process."""
    gen = torch.Generator().manual_seed(1000 * list(CASES).index(case) + step)
    n = sum(CASES[case][0])
    x = torch.randn(n, C, H, W, generator=gen) * 2.0 + 0.5
    g = torch.randn(n, C, H, W, generator=gen)
    if CASES[case][2]:
        x = x.to(torch.bfloat16)
    return x, g


def _initial_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {
        "weight": torch.rand(C, generator=gen) + 0.5,
        "bias": torch.randn(C, generator=gen),
        "running_mean": torch.randn(C, generator=gen),
        "running_var": torch.rand(C, generator=gen) + 0.5,
        "num_batches_tracked": torch.tensor(3),
    }


def _run_cases(rank: int, group) -> dict:
    out = {}
    for case, (sizes, momentum, bf16) in CASES.items():
        bn = CrossDeviceBatchNorm(C, momentum=momentum, process_group=group)
        bn.load_state_dict(_initial_state())
        lo = sum(sizes[:rank])
        hi = lo + sizes[rank]
        steps = []
        for step in range(STEPS):
            x_all, g_all = _data(case, step)
            x = x_all[lo:hi].clone().requires_grad_()
            bn.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                y = bn(x)
            (y.float() * g_all[lo:hi]).sum().backward()
            grads = torch.cat([bn.weight.grad, bn.bias.grad])
            dist.all_reduce(grads)  # what DDP does for the parameters (sum; the loss is a sum over ranks)
            steps.append({"y": y.detach().clone(), "x_grad": x.grad.clone(),
                          "weight_grad": grads[:C].clone(), "bias_grad": grads[C:].clone()})
        out[case] = {"steps": steps, "state": {k: v.clone() for k, v in bn.state_dict().items()}}
    return out


def _count_collectives(rank: int, group) -> dict:
    """Collectives of a two-BN model, whichever transport carries them (dist.* calls and shared-memory sums)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, C, 3, padding=1), nn.BatchNorm2d(C), nn.ReLU(),
                          nn.Conv2d(C, C, 3, padding=1), nn.BatchNorm2d(C))
    model = convert_batchnorm(model, group)
    calls = {"all_reduce": 0, "all_gather": 0}
    originals = {name: getattr(dist, name) for name in calls}
    original_sum = HostAllReduce.sum_

    def counting(name):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return originals[name](*args, **kwargs)
        return wrapper

    def counting_sum(self, tensor):
        calls["all_reduce"] += 1
        return original_sum(self, tensor)

    x = torch.randn(COUNT_SIZES[rank], 3, H, W)
    for name in calls:
        setattr(dist, name, counting(name))
    HostAllReduce.sum_ = counting_sum
    try:
        y = model(x)
        forward = dict(calls)
        y.square().sum().backward()
        backward = {k: calls[k] - forward[k] for k in calls}
        model.eval()
        before = dict(calls)
        with torch.no_grad():
            model(x)
        evaluation = {k: calls[k] - before[k] for k in calls}
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)
        HostAllReduce.sum_ = original_sum
    return {"forward": forward, "backward": backward, "eval": evaluation}


def _one_value_error(rank: int, group) -> str:
    """A global batch of one value per channel (rank 0: one 1x1 image, rank 1: none): every rank must raise."""
    bn = CrossDeviceBatchNorm(C, process_group=group)
    try:
        bn(torch.randn(1 - rank, C, 1, 1))
    except ValueError as e:
        return str(e)
    return ""


def _worker(rank: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    join_gloo(rank, WORLD, port)
    try:
        result = {}
        for transport in TRANSPORTS:
            group = dist.new_group(backend="gloo")
            if transport == "gloo":
                host_all_reduce.use_torch_distributed(group)
            channel = host_all_reduce.channel_for(group)  # made here, so that the counts below hold sums only
            result[transport] = {"cases": _run_cases(rank, group), "counts": _count_collectives(rank, group),
                                 "shared_memory": channel is not None, "one_value": _one_value_error(rank, group)}
        torch.save(result, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    return run_spawned(_worker, WORLD, tmp_path_factory.mktemp("sync_bn"))


def _reference(case: str) -> dict:
    """Plain single-process BatchNorm2d on the concatenated batch, in fp32 (bf16 inputs upcast exactly)."""
    _, momentum, _ = CASES[case]
    bn = nn.BatchNorm2d(C, momentum=momentum)
    bn.load_state_dict(_initial_state())
    steps = []
    for step in range(STEPS):
        x_all, g_all = _data(case, step)
        x = x_all.float().requires_grad_()
        bn.zero_grad()
        y = bn(x)
        (y * g_all).sum().backward()
        steps.append({"y": y.detach(), "x_grad": x.grad, "weight_grad": bn.weight.grad.clone(),
                      "bias_grad": bn.bias.grad.clone()})
    return {"steps": steps, "state": bn.state_dict()}


def _of(results: list[dict], transport: str) -> list[dict]:
    if transport == "shared_memory" and not results[0][transport]["shared_memory"]:
        pytest.skip("no shared-memory all-reduce on this machine (x86-64 Linux only)")
    assert results[0]["gloo"]["shared_memory"] is False
    return [r[transport] for r in results]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_single_process_batchnorm(results, case, transport):
    results = _of(results, transport)
    sizes, _, bf16 = CASES[case]
    ref = _reference(case)
    # fp32: exact up to summation order. bf16: the statistics are fp32 on the same (bf16-rounded) inputs, so the
    # running stats still match to 1e-5, but y and dL/dx are rounded to bf16 (8-bit mantissa, relative step
    # 2**-8 = 0.0039, |y| up to ~4) and dL/dweight sums bf16-rounded grad_output: 2e-2 bounds that rounding
    # while a wrong (per-rank or bf16-accumulated) statistic would be off by far more.
    tol = {"rtol": 2e-2, "atol": 2e-2} if bf16 else {"rtol": 1e-5, "atol": 1e-5}
    for step in range(STEPS):
        got = [results[r]["cases"][case]["steps"][step] for r in range(WORLD)]
        want = ref["steps"][step]
        for r in range(WORLD):
            assert got[r]["y"].shape == (sizes[r], C, H, W)
            assert got[r]["y"].dtype == (torch.bfloat16 if bf16 else torch.float32)
        torch.testing.assert_close(torch.cat([g["y"].float() for g in got]), want["y"], **tol)
        torch.testing.assert_close(torch.cat([g["x_grad"].float() for g in got]), want["x_grad"], **tol)
        for r in range(WORLD):  # all-reduced parameter gradients: the global ones, on every rank
            torch.testing.assert_close(got[r]["weight_grad"], want["weight_grad"], **tol)
            torch.testing.assert_close(got[r]["bias_grad"], want["bias_grad"], **tol)
    for r in range(WORLD):
        state = results[r]["cases"][case]["state"]
        torch.testing.assert_close(state["running_mean"], ref["state"]["running_mean"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(state["running_var"], ref["state"]["running_var"], rtol=1e-5, atol=1e-5)
        assert int(state["num_batches_tracked"]) == int(ref["state"]["num_batches_tracked"]) == 3 + STEPS


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_one_all_reduce_per_layer_and_direction(results, transport):
    results = _of(results, transport)
    for r in range(WORLD):
        counts = results[r]["counts"]
        assert counts["forward"] == {"all_reduce": 2, "all_gather": 0}  # two BN layers
        assert counts["backward"] == {"all_reduce": 2, "all_gather": 0}
        assert counts["eval"] == {"all_reduce": 0, "all_gather": 0}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_one_value_per_channel_in_the_global_batch_raises_on_every_rank(results, transport):
    for r in _of(results, transport):
        assert r["one_value"] == "Expected more than 1 value per channel when training, got 1 in the global batch"


def test_convert_batchnorm_nested_keeps_state():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 1),
        nn.BatchNorm2d(4, eps=1e-3, momentum=None),
        nn.Sequential(nn.Flatten(2), nn.BatchNorm1d(4, affine=False)),
        nn.ModuleDict({"deep": nn.Sequential(nn.Unflatten(2, (1, 2, 2)),
                                             nn.BatchNorm3d(4, track_running_stats=False))}),
    )
    bns = [model[1], model[2][1], model[3]["deep"][1]]
    with torch.no_grad():
        for bn in bns:
            if bn.affine:
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.normal_()

    def run(m, x):
        return m[3]["deep"](m[2](m[1](m[0](x))))

    x = torch.randn(5, 3, 2, 2)
    run(model, x)  # non-default running stats
    model[2][1].eval()
    expected_state = {k: v.clone() for k, v in model.state_dict().items()}
    old_params = [(bn.weight, bn.bias) for bn in bns]
    with torch.no_grad():
        model_eval_ref = run(model, x)
    expected_state_after = {k: v.clone() for k, v in model.state_dict().items()}

    model.load_state_dict(expected_state)
    converted = convert_batchnorm(model)
    new_bns = [converted[1], converted[2][1], converted[3]["deep"][1]]
    for old, new, (w, b) in zip(bns, new_bns, old_params, strict=True):
        assert type(new) is CrossDeviceBatchNorm
        assert (new.eps, new.momentum, new.affine, new.track_running_stats, new.training) == (
            old.eps, old.momentum, old.affine, old.track_running_stats, old.training)
        assert new.weight is w and new.bias is b
    assert not any(isinstance(m, nn.modules.batchnorm._BatchNorm) and type(m) is not CrossDeviceBatchNorm
                   for m in converted.modules())
    for k, v in converted.state_dict().items():
        torch.testing.assert_close(v, expected_state[k], rtol=0, atol=0)
    # Without torch.distributed it is plain batch norm (2D, 3D and 5D inputs, train and eval layers alike).
    with torch.no_grad():
        torch.testing.assert_close(run(converted, x), model_eval_ref)
    for k, v in converted.state_dict().items():
        torch.testing.assert_close(v, expected_state_after[k])

    top = nn.BatchNorm1d(3)
    new_top = convert_batchnorm(top.eval())
    assert type(new_top) is CrossDeviceBatchNorm and not new_top.training and new_top.weight is top.weight


@pytest.mark.parametrize("shape", [(6, 3), (6, 3, 5), (4, 3, 4, 5), (2, 3, 2, 3, 2)])
@pytest.mark.parametrize("affine", [True, False])
def test_the_function_alone_equals_batch_norm(monkeypatch, shape, affine):
    """One process whose sums are the global ones (the all-reduce made a no-op): exactly torch's BatchNorm, for
    every input rank, with and without weight and bias."""
    from bigbatch.largebatch import sync_bn

    monkeypatch.setattr(sync_bn, "_all_reduce_sum", lambda packed, group: None)
    gen = torch.Generator().manual_seed(len(shape) + affine)
    x = torch.randn(shape, generator=gen) * 3 + 1
    g = torch.randn(shape, generator=gen)
    weight = (torch.rand(3, generator=gen) + 0.5).requires_grad_() if affine else None
    bias = torch.randn(3, generator=gen).requires_grad_() if affine else None
    results = []
    for fn in ("ours", "torch"):
        xi = x.clone().requires_grad_()
        stats = [torch.zeros(3), torch.ones(3)]
        if fn == "ours":
            y = sync_bn.CrossDeviceBatchNormFunction.apply(xi, weight, bias, *stats, 1e-5, 0.1, None)
        else:
            y = torch.nn.functional.batch_norm(xi, *stats, weight, bias, True, 0.1, 1e-5)
        params = [p for p in (weight, bias) if p is not None]
        grads = torch.autograd.grad(y, [xi, *params], g)
        results.append([y, *grads, *stats])
    for ours, theirs in zip(*results, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
