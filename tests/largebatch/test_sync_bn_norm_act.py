"""``norm.sync`` on timm models whose BatchNorm layers carry their activation (timm's ``BatchNormAct2d``: BN, then
``drop``, then ``act``): the converted model computes what the unconverted one does, in eval and in training (one
process: the synced layers are plain batch norm there), and keeps its state-dict keys, so a checkpoint loads into the
unconverted model that ``bigbatch eval`` and export build. A BatchNorm class with a forward of its own is refused.

The oracle is the unconverted timm model itself.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

timm = pytest.importorskip("timm")
from timm.layers import BatchNormAct2d, SyncBatchNormAct  # noqa: E402

from bigbatch.engine.parts import sync_batchnorm  # noqa: E402
from bigbatch.errors import UserError  # noqa: E402
from bigbatch.floor.distributed import Process  # noqa: E402
from bigbatch.largebatch.sync_bn import CrossDeviceBatchNorm, CrossDeviceBatchNormAct, convert_batchnorm  # noqa: E402

# norm.sync -> (the process it converts for, the class a BatchNormAct2d becomes). norm.sync=torch is only converted
# for a CUDA process; the conversion itself moves nothing, and on one process SyncBatchNorm runs on the CPU too.
MODES = {
    "bigbatch": (Process(rank=0, world=2), CrossDeviceBatchNormAct),
    "torch": (Process(rank=0, world=2, device=torch.device("cuda", 0)), SyncBatchNormAct),
}


class Negate(nn.Module):
    """A ``drop`` layer that tells the order apart: act(-x) differs from -act(x) for a ReLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -x


def _timm_model() -> nn.Module:
    torch.manual_seed(0)
    model = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=10)
    with torch.no_grad():  # BN parameters and statistics away from their identity defaults
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0, 0.5)
                m.running_mean.normal_(0, 0.2)
                m.running_var.uniform_(0.5, 2.0)
    return model


def _small_model() -> nn.Module:
    """A drop layer and an activation with a parameter (PReLU: the key ``act.weight``) in a BatchNormAct2d."""
    torch.manual_seed(1)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), BatchNormAct2d(4, act_layer=nn.ReLU, drop_layer=Negate),
                         nn.Conv2d(4, 4, 1), BatchNormAct2d(4, act_layer=nn.PReLU, inplace=False),
                         nn.Conv2d(4, 4, 1), nn.BatchNorm2d(4))


def _assert_same_function(model: nn.Module, mode: str, x: torch.Tensor) -> None:
    proc, act_type = MODES[mode]
    n_act = sum(isinstance(m, BatchNormAct2d) for m in model.modules())
    keys = list(model.state_dict())
    converted = sync_batchnorm(copy.deepcopy(model), mode, proc)
    assert sum(type(m) is act_type for m in converted.modules()) == n_act > 0
    assert not any(isinstance(m, BatchNormAct2d) for m in converted.modules())
    assert list(converted.state_dict()) == keys  # a checkpoint's keys: those of the unconverted model
    with torch.no_grad():
        torch.testing.assert_close(converted.eval()(x), model.eval()(x), rtol=0, atol=0)
        # training: batch statistics, and the running statistics updated alike
        torch.testing.assert_close(converted.train()(x), model.train()(x), rtol=0, atol=0)
    for k, v in converted.state_dict().items():
        torch.testing.assert_close(v, model.state_dict()[k], rtol=0, atol=0)
    # the checkpoint loads into the unconverted model (bigbatch eval, export) and computes the same
    fresh = copy.deepcopy(model)
    fresh.load_state_dict(converted.state_dict(), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(fresh.eval()(x), converted.eval()(x), rtol=0, atol=0)


@pytest.mark.parametrize("mode", list(MODES))
def test_norm_sync_keeps_the_activations_of_a_timm_model(mode):
    _assert_same_function(_timm_model(), mode, torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(2)))


@pytest.mark.parametrize("mode", list(MODES))
def test_norm_sync_keeps_drop_then_act_and_their_parameters(mode):
    model = _small_model()
    assert "1.act.weight" not in model.state_dict() and "3.act.weight" in model.state_dict()
    _assert_same_function(model, mode, torch.randn(3, 3, 5, 5, generator=torch.Generator().manual_seed(3)))


def test_converted_norm_act_layer_shares_the_old_tensors():
    model = _small_model()
    old = model[1]
    new = convert_batchnorm(model)[1]
    assert type(new) is CrossDeviceBatchNormAct and isinstance(new, CrossDeviceBatchNorm)
    assert new.weight is old.weight and new.running_mean is old.running_mean and new.drop is old.drop
    assert new.act is old.act and [name for name, _ in new.named_children()] == ["drop", "act"]
    assert type(model[5]) is CrossDeviceBatchNorm  # plain BatchNorm2d as before


class ScaledBN(nn.BatchNorm2d):
    """A BatchNorm whose own forward a synced layer would not run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


class WideCheckBN(nn.BatchNorm2d):
    """A subclass that keeps BatchNorm's forward: converted as before."""

    def _check_input_dim(self, input: torch.Tensor) -> None:
        pass


@pytest.mark.parametrize("mode", list(MODES))
def test_a_batchnorm_class_with_its_own_forward_is_refused_before_any_change(mode):
    model = nn.Sequential(nn.BatchNorm2d(3), nn.Sequential(nn.Conv2d(3, 3, 1), ScaledBN(3)))
    with pytest.raises(UserError, match=r"^norm\.sync: cannot synchronise layer 1\.1 \(ScaledBN\): its class "
                                        r"overrides BatchNorm's forward"):
        sync_batchnorm(model, mode, MODES[mode][0])
    assert type(model[0]) is nn.BatchNorm2d and type(model[1][1]) is ScaledBN  # nothing converted
    with pytest.raises(UserError, match=r"\(the model\) \(ScaledBN\)"):
        convert_batchnorm(ScaledBN(3))


def test_a_subclass_keeping_batchnorms_forward_is_converted():
    model = nn.Sequential(nn.Conv2d(3, 3, 1), WideCheckBN(3))
    assert type(convert_batchnorm(model)[1]) is CrossDeviceBatchNorm
    torch_model = sync_batchnorm(nn.Sequential(WideCheckBN(3)), "torch", MODES["torch"][0])
    assert type(torch_model[0]) is nn.SyncBatchNorm
