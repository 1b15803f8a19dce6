"""A run resumed on another world size keeps its global batch and its micro-batch, and re-derives ``subdivisions``
(``engine/relaunch.py``): the arithmetic, on configs of every batch kind, and its refusals. The relaunch of a real
run on another world size: tests/report/test_report.py (2 processes, then 1) and tests/engine/test_multinode.py
(a node lost, a node added)."""

from __future__ import annotations

import json

import pytest

from bigbatch.config import load_config
from bigbatch.engine.relaunch import SavedLayout, relaunched_subdivisions, saved_layout
from bigbatch.errors import UserError
from tests.helpers import run_main, torchrun


def subdivisions(settings: list[str], world: int, saved_world: int, micro: int, grown: tuple[int, ...] = ()) -> int:
    cfg = load_config("digits", ["steps=100", *settings])
    return relaunched_subdivisions(cfg, world, SavedLayout(saved_world, micro, grown))


@pytest.mark.parametrize(
    ("batch", "world", "saved_world", "micro", "expected"),
    [
        (64, 1, 2, 4, 16),  # a node lost: twice the micro-batches on the one left
        (64, 2, 1, 32, 1),  # a node added
        (64, 4, 2, 8, 2),
        (96, 3, 2, 16, 2),  # 32 images a process: 2 micro-batches of 16
        (96, 4, 2, 48, 1),  # 24 a process: 48 does not cut them, 24 does
        (60, 2, 1, 20, 2),  # 30 a process: the largest micro-batch at most 20 that cuts 30 is 15
        (64, 64, 1, 8, 1),  # one image a process
    ],
)
def test_the_micro_batch_is_kept_where_it_cuts_the_batch_else_the_largest_below_it(batch, world, saved_world, micro,
                                                                                   expected):
    got = subdivisions([f"batch={batch}"], world, saved_world, micro)
    assert got == expected
    assert batch % (world * got) == 0 and batch // (world * got) <= micro


def test_a_batch_schedule_keeps_a_micro_batch_that_cuts_every_phase():
    # 64 then 96 images; on 2 processes 32 and 48 a process: 32 does not cut 48, 16 cuts both
    settings = ["batch=64", "subdivisions=2", "schedule.batch=[{at: 5, batch: 96}]"]
    assert subdivisions(settings, 2, 1, 32) == 2
    assert subdivisions(settings, 1, 2, 16) == 4  # and back: 16 cuts 64 and 96


def test_an_adaptive_batch_keeps_two_micro_batches_a_process_and_cuts_the_batches_it_grew_to():
    settings = ["batch={mode: adaptive, base: 16, max: 64}", "subdivisions=2"]
    assert subdivisions(settings, 2, 1, 32) == 2  # 32 a process would be one micro-batch: 16, two of them
    grows = ["batch={mode: adaptive, base: 32, max: 96, grow: true}", "subdivisions=2"]  # from 32 up to 96
    assert subdivisions(grows, 2, 1, 16, grown=(64,)) == 2  # 16, 48 and 32 a process: 8, two micro-batches of 16
    assert subdivisions(grows, 2, 1, 16, grown=(72,)) == 4  # grown to 72: 36 a process, and 4 cuts 16, 48 and 36


@pytest.mark.parametrize(
    ("settings", "world", "named"),
    [
        (["batch=64"], 3, "world sizes that work: 1, 2, 4, 8, 16, 32, 64"),
        (["batch=64", "subdivisions=1", "schedule.batch=[{at: 5, batch: 96}]"], 64, "1, 2, 4, 8, 16, 32"),
        (["batch={mode: adaptive, base: 16, max: 64}", "subdivisions=2"], 64, "1, 2, 4, 8, 16, 32"),
        (["batch=5040"], 11, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, ..."),  # 60 divisors: the first 12
    ],
)
def test_a_world_size_that_cannot_cut_the_batch_is_one_line_naming_those_that_can(settings, world, named):
    with pytest.raises(UserError) as caught:
        subdivisions(settings, world, 2, 8)
    message = str(caught.value)
    assert message.startswith("batch: a batch of ") and f"cannot be cut over {world} processes" in message
    assert f"its checkpoint written on 2); world sizes that work: {named.split(': ')[-1]}" in message
    assert "\n" not in message


def test_a_checkpoint_without_a_layout_is_resumed_as_before_and_a_bad_one_is_refused():
    assert saved_layout({"step": 3}) is None  # written before the layout was kept
    assert saved_layout({"step": 3, "world": 2, "micro_batch": 8, "grown": [[4, 128]]}) == SavedLayout(2, 8, (128,))
    for bad in ({"world": 0, "micro_batch": 8}, {"world": 2, "micro_batch": True}, {"world": 2, "micro_batch": 2**50},
                {"world": 2, "micro_batch": "8"}, {"world": 2, "micro_batch": 8, "grown": [[4, -1]]}):
        with pytest.raises(UserError, match=r"^checkpoint: data\.\w+ is .*, not a positive whole number$"):
            saved_layout(bad)


@pytest.mark.slow
def test_an_adaptive_run_goes_on_with_its_gain_on_another_world_size(tmp_path):
    """AdaScale on 2 processes, resumed on 1: the micro-batch kept (subdivisions 2 -> 4), so its noise estimate has
    the same micro-batches, and the run goes on from the checkpoint's gain and progress."""
    out = tmp_path / "adaptive"
    settings = ["batch={mode: adaptive, base: 16, max: 64}", "subdivisions=2", "checkpoint.every=1", "model.norm=group"]
    launched = torchrun(out, *settings, "steps=4")
    assert launched.returncode == 0, launched.stderr[-3000:]
    resumed = run_main("train", "--resume", str(out), "--set", "steps=8")
    assert resumed.returncode == 0, resumed.stderr
    assert "subdivisions 4, micro-batch 16 (kept)" in resumed.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    starts = [(r["event"], r["world"], r["subdivisions"], r["micro_batch"]) for r in records
              if r.get("event") in ("started", "resumed")]
    assert starts == [("started", 2, 2, 16), ("resumed", 1, 4, 16)]
    gains = [r["gain"] for r in records if "gain" in r]
    assert gains and all(g >= 1 for g in gains)
