"""``subdivisions: auto`` under torchrun: one layout for every rank. Rank 0 alone measures, within the smallest budget
of any rank, and the others take its choice; every rank checks that all hold the same (batch, world, subdivisions).
The measuring process runs on its rank's device (``LOCAL_RANK`` kept), and on the CPU a rank's default budget is its
share of the machine (``LOCAL_WORLD_SIZE``).

The disagreement is made certain, not left to chance: in the torchrun run each rank's measurements and budget are
stand-ins (``WORKER``), rank 1's tighter, so ranks that planned on their own would choose different layouts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch.distributed as dist

from bigbatch.config import load_config
from bigbatch.engine import planner
from bigbatch.errors import UserError
from tests.helpers import COMMON, HANG_GUARD_S, ROOT, clean_env, join_gloo, run_spawned, standalone

MiB = 2**20

WORKER = """
import json, os, sys
from pathlib import Path

records = Path(sys.argv[1])
del sys.argv[1]
rank = os.environ["RANK"]

from bigbatch.engine import planner, trainer
from bigbatch.engine.planner import Measurement

MiB = 2**20
BUDGET = {"0": 4096 * MiB, "1": 1100 * MiB}[rank]  # rank 1 alone: micro-batch 4 fits, 8 does not

def budget(cfg):
    return BUDGET

def measure(cfg, micro_batch, per_device):  # 900 MiB + 10 MiB per image, 1 % more on rank 1: planned x 1.15
    with open(records / f"measured-rank{rank}.jsonl", "a") as f:
        f.write(json.dumps([micro_batch, per_device]) + "\\n")
    return Measurement(micro_batch, int((900 + 10 * micro_batch) * MiB * (1.01 if rank == "1" else 1.0)), 100.0)

make_plan = trainer.make_plan
def noted_plan(cfg, layout, images):  # the layout the rank trains with
    (records / f"layout-rank{rank}.json").write_text(json.dumps([layout.batch, layout.world, layout.subdivisions]))
    return make_plan(cfg, layout, images)

planner.default_budget, planner.measure, trainer.make_plan = budget, measure, noted_plan

from bigbatch.cli import main
sys.exit(main())
"""
"""``bigbatch train`` whose planner measures nothing (``planner.measure``: a line per micro-batch) within a budget of
its rank's (``planner.default_budget``), and which notes, in the folder ``argv[1]``, what each rank measured and the
layout it trains with."""


def test_the_ranks_of_a_torchrun_run_train_with_the_layout_rank_0_planned_within_the_smallest_budget(tmp_path):
    """Planned on its own, rank 0 (4 GiB) would train 1 x 32 and rank 1 (1,100 MiB: micro-batch 8 is planned at
    1,127 MiB) 8 x 4: the old planner did, each rank its own. Rank 0 alone measures, within the smaller budget, and
    both ranks train 8 micro-batches of 4."""
    records = tmp_path / "records"
    records.mkdir()
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *standalone(),
               "--no-python", sys.executable, "-c", WORKER, str(records),
               "train", "digits", "--out", str(tmp_path / "run"), "--set", *COMMON, "subdivisions=auto"]
    result = subprocess.run(command, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 0, result.stderr[-3000:]
    layouts = {rank: json.loads((records / f"layout-rank{rank}.json").read_text()) for rank in (0, 1)}
    assert layouts == {0: [64, 2, 8], 1: [64, 2, 8]}
    measured = [json.loads(line) for line in (records / "measured-rank0.jsonl").read_text().splitlines()]
    assert [m for m, _ in measured] == [1, 2, 4, 8]  # stops at the first that does not fit the smaller budget
    assert not (records / "measured-rank1.jsonl").exists(), "only rank 0 measures"
    assert result.stdout.count("subdivisions: auto -> 8 (micro-batch 4; planned on rank 0 for all 2 ranks") == 1
    assert "subdivisions: 8\n" in (tmp_path / "run" / "config.yaml").read_text()


def _stand_ins(budgets: dict[int, int]):
    """Stand-ins for the measurements (100 MiB + 1 MiB per image: planned at 1.15 times that, micro-batch 1 at
    116.15 MiB, 2 at 117.3, 4 at 119.6, 32 at 151.8) and for each rank's budget (rank -> MiB)."""
    def measure(cfg, micro_batch, per_device):
        return planner.Measurement(micro_batch, (100 + micro_batch) * MiB, 1.0)

    def budget(cfg):
        return budgets[dist.get_rank()] * MiB
    return measure, budget


SCENARIOS = {
    "plan": ({0: 1000, 1: 118}, ["batch=64", "subdivisions=auto"]),
    "no fit": ({0: 1000, 1: 100}, ["batch=64", "subdivisions=auto"]),
    "mismatch": ({0: 1000, 1: 1000}, ["batch={64 if rank == 0 else 32}", "subdivisions=2"]),
}
"""What the two ranks of a joined group (``train`` called under one) resolve, one after the other: digits at batch
64, ``subdivisions: auto`` where rank 0 alone fits micro-batch 32 and rank 1 micro-batch 2, then where rank 1 fits
none; and a batch of 64 on rank 0 but 32 on rank 1 (a --set given on one node only)."""


def _resolve_worker(rank: int, port: int, out_dir: str) -> None:
    import torch

    from bigbatch.engine import preflight

    join_gloo(rank, 2, port)
    outcomes = {}
    try:
        for name, (budgets, overrides) in SCENARIOS.items():
            planner.measure, planner.default_budget = _stand_ins(budgets)
            overrides = [o.replace("{64 if rank == 0 else 32}", str(64 if rank == 0 else 32)) for o in overrides]
            try:
                cfg, layout = preflight.resolve_batch(load_config("digits", overrides), 2)
                outcomes[name] = [cfg.subdivisions, layout.subdivisions]
            except UserError as error:
                outcomes[name] = str(error)
        torch.save(outcomes, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_ranks_in_a_joined_group_take_rank_0s_plan_or_its_error_and_stop_on_different_layouts(tmp_path):
    """Rank 0's plan within the smallest budget (16 micro-batches of 2, where rank 0 alone would take 1 of 32); its
    failure (not even micro-batch 1 fits rank 1's budget) is every rank's error; ranks that hold different layouts
    stop with one line naming both."""
    ranks = run_spawned(_resolve_worker, 2, tmp_path)
    assert ranks[0] == ranks[1]
    outcome = ranks[0]
    assert outcome["plan"] == [16, 16]
    assert outcome["no fit"].startswith("memory: even a micro-batch of 1 image needs 116 MiB")  # memory.limit unset
    assert "over the budget of 100 MiB (" in outcome["no fit"]  # the free memory, as this machine has it
    assert outcome["mismatch"] == (
        "batch: the ranks hold different layouts: rank 0 batch 64 on 2 processes x subdivisions 2, rank 1 batch 32 on "
        "2 processes x subdivisions 2; every rank must run the same config and --set")


@pytest.mark.fast
def test_the_measuring_process_runs_on_its_ranks_device_as_a_process_of_its_own(monkeypatch):
    """``LOCAL_RANK`` reaches the measuring process (``floor/distributed.setup`` takes ``cuda:LOCAL_RANK``); ``RANK``
    and ``WORLD_SIZE`` do not (it joins no group)."""
    seen: dict[str, str] = {}

    class Started(Exception):
        pass

    def popen(command, **kwargs):
        seen.update(kwargs["env"])
        raise Started

    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setattr(planner.subprocess, "Popen", popen)
    with pytest.raises(Started):
        planner.measure(load_config("digits", ["batch=64", "subdivisions=auto"]), 4)
    assert seen["LOCAL_RANK"] == "3"
    assert "RANK" not in seen and "WORLD_SIZE" not in seen


@pytest.mark.fast
def test_on_the_cpu_a_ranks_default_budget_is_its_share_of_the_machines_available_memory(monkeypatch):
    import psutil

    class Memory:
        available = 10_000 * MiB

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory)
    monkeypatch.setattr(planner.torch.cuda, "is_available", lambda: False)
    cfg = load_config("digits", ["batch=64", "subdivisions=auto"])
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert planner.default_budget(cfg) == 9_000 * MiB  # less the 10 % margin
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert planner.default_budget(cfg) == 9_000 * MiB // 4
    assert planner.default_budget(load_config("digits", ["memory.limit=1GiB"])) == 1024 * MiB  # a limit is per process
