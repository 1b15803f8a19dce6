"""Per-layer update sizes (bigbatch/telemetry/update_sizes.py): against the update of plain SGD written by hand,
Delta W = -lr * grad; the top-k ranking; the CSV log and its refusal of a file it did not write."""

from __future__ import annotations

import csv

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bigbatch.telemetry.update_sizes import LayerUpdate, UpdatesCSV, UpdateSizes, top
from tests.helpers import count_host_transfers

pytestmark = pytest.mark.fast

LR = 0.1


class _Net(nn.Module):
    """Two used layers (the second with a zero bias: ||W|| = 0) and one the loss never reaches (no gradient)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = nn.Linear(4, 6)
        self.second = nn.Linear(6, 3)
        self.unused = nn.Linear(3, 3)
        with torch.no_grad():
            self.second.bias.zero_()
            self.second.weight.mul_(10)  # a layer whose update is small relative to its weights

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x)))


def _sgd_step() -> tuple[_Net, dict[str, torch.Tensor], dict[str, torch.Tensor], list[LayerUpdate]]:
    """One plain-SGD step measured by UpdateSizes; also the weights before it and the gradients."""
    model = _Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=gen), torch.randint(0, 3, (8,), generator=gen)
    F.cross_entropy(model(x), y).backward()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    sizes = UpdateSizes()
    sizes.before(model)
    optimizer.step()
    return model, weights, grads, sizes.after(model)


def test_plain_sgd_update_by_hand():
    """SGD: Delta W = -lr * grad, so max |Delta W| = lr max |grad| and ||Delta W|| / ||W|| = lr ||grad|| / ||W||."""
    model, weights, grads, updates = _sgd_step()
    assert [u.name for u in updates] == [n for n, _ in model.named_parameters()]
    by_name = {u.name: u for u in updates}
    for name, grad in grads.items():
        assert by_name[name].max_abs == pytest.approx(LR * float(grad.abs().max()), rel=1e-5), name
        if name == "second.bias":
            assert by_name[name].relative is None  # ||W_before|| = 0
        else:
            assert by_name[name].relative == pytest.approx(LR * float(grad.norm()) / float(weights[name].norm()),
                                                           rel=1e-5), name


def test_parameters_without_gradient_do_not_move():
    _, _, grads, updates = _sgd_step()
    untouched = [u for u in updates if u.name not in grads]
    assert {u.name for u in untouched} == {"unused.weight", "unused.bias"}
    assert all(u.max_abs == 0.0 and u.relative == 0.0 for u in untouched)


def test_snapshot_is_one_copy_of_the_weights_and_is_reused():
    model = _Net()
    sizes = UpdateSizes()
    sizes.before(model)
    first = [s.data_ptr() for s in sizes._snapshots]
    assert sizes.after(model)[0].max_abs == 0.0
    sizes.before(model)
    assert [s.data_ptr() for s in sizes._snapshots] == first
    assert sum(s.numel() for s in sizes._snapshots) == sum(p.numel() for p in model.parameters())  # one copy
    assert all(s.dtype == torch.float32 for s in sizes._snapshots)


def test_one_host_transfer_for_all_parameters(monkeypatch):
    model, sizes = _Net(), UpdateSizes()
    calls = count_host_transfers(monkeypatch)
    sizes.before(model)
    assert calls["n"] == 0
    sizes.after(model)
    assert calls["n"] == 1


def test_after_needs_before():
    model, sizes = _Net(), UpdateSizes()
    with pytest.raises(RuntimeError, match="before"):
        sizes.after(model)
    sizes.before(model)
    sizes.after(model)
    with pytest.raises(RuntimeError, match="before"):  # the snapshot is used up
        sizes.after(model)


def test_top_k_by_relative_size():
    _, _, _, updates = _sgd_step()
    ranked = top(updates, k=3)
    with_relative = sorted((u for u in updates if u.relative is not None), key=lambda u: -u.relative)
    assert [r["name"] for r in ranked] == [u.name for u in with_relative[:3]]
    assert ranked[0] == {"name": with_relative[0].name, "relative": with_relative[0].relative,
                         "max_abs": with_relative[0].max_abs}
    everything = top(updates, k=100)
    assert len(everything) == len(updates)
    assert everything[-1]["name"] == "second.bias"  # no relative size: last
    assert [r["relative"] for r in everything[:-1]] == sorted((r["relative"] for r in everything[:-1]), reverse=True)


def test_csv_rows_and_header(tmp_path):
    path = tmp_path / "updates.csv"
    _, _, _, updates = _sgd_step()
    with UpdatesCSV(path) as log:
        log.write(0, updates)
        assert len(path.read_text().splitlines()) == 1 + len(updates)  # flushed at each write
    with UpdatesCSV(path) as log:  # its own file: appended to, no second header
        log.write(1, updates[:2])
    lines = path.read_text().splitlines()
    assert lines[0] == "step,name,max_abs,relative"
    rows = list(csv.DictReader(lines))
    assert len(rows) == len(updates) + 2
    for row, u in zip(rows, [*updates, *updates[:2]], strict=True):
        assert row["name"] == u.name
        assert float(row["max_abs"]) == u.max_abs
        assert (row["relative"] == "") if u.relative is None else (float(row["relative"]) == u.relative)
    assert [row["step"] for row in rows] == ["0"] * len(updates) + ["1", "1"]


def test_empty_existing_file_gets_the_header(tmp_path):
    path = tmp_path / "updates.csv"
    path.touch()
    UpdatesCSV(path).close()
    assert path.read_text().splitlines() == ["step,name,max_abs,relative"]


def test_a_foreign_file_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("step,loss\n0,1.5\n")
    with pytest.raises(ValueError, match="metrics.csv"):
        UpdatesCSV(path)
    assert path.read_text() == "step,loss\n0,1.5\n"
