"""Multi-scale sizes: Darknet's rule (AlexeyAB's detector.c) or a list, a new size every N steps, the largest
first and for the last steps, and a pure function of (seed, step): the same on every rank and after a resume."""

import collections
import math

import numpy as np
import pytest

from bigbatch.data.transforms.multiscale import DarknetDraw, ListDraw, MultiScale, c_round, darknet_size, darknet_sizes


def test_darknet_sizes_are_the_seeds_numbers():
    assert darknet_sizes(320) == list(range(256, 481, 32))  # the seed: 256..480
    assert darknet_sizes(416) == list(range(320, 609, 32))  # 320..608, as pjreddie's (rand() % 10 + 10) * 32
    assert darknet_sizes(416, 1.25) == list(range(352, 545, 32))  # random=1.25 is the range itself
    assert darknet_sizes(608) == list(range(480, 897, 32))
    assert darknet_sizes(300) == [256, 288, 300, 320, 352, 384, 416, 448]  # a base off the grid is kept


def test_darknet_size_rounds_as_c_and_keeps_the_base_below_one():
    assert [c_round(x) for x in (2.5, 3.5, -2.5, 2.49)] == [3, 4, -3, 2]
    assert darknet_size(1.0, 416) == 448  # the rule's "+1": r = 1 gives one step above the base
    assert darknet_size(0.99, 416) == 416  # below 1 but rounds to 448: stays at the base
    assert darknet_size(0.9, 416) == 416  # 0.9 * 13 + 1 = 12.7 -> 13 -> 416
    assert darknet_size(0.8, 416) == 352  # 11.4 -> 11
    assert darknet_size(1 / 1.4, 320) == 256 and darknet_size(1.4, 320) == 480
    assert darknet_size(0.1, 64) == 32  # never below one stride


def test_darknet_draw_follows_rand_scale():
    """r = u or 1/u with even odds, u ~ U[1, s]: half the draws are >= the size at r = 1."""
    draw, rng = DarknetDraw(416), np.random.default_rng(0)
    drawn = [draw(rng) for _ in range(20000)]
    assert sorted(set(drawn)) == darknet_sizes(416)
    assert abs(sum(d >= 448 for d in drawn) / len(drawn) - 0.5) < 0.02
    counts = collections.Counter(drawn)
    # sizes above: r in [1, 1.4] uniform, each 32 px step is 1/(0.4 * 13) of it (608 only half a step)
    for size in (480, 512, 544, 576):
        assert abs(counts[size] / len(drawn) - 0.5 / (0.4 * 13)) < 0.01


def test_the_first_period_and_the_last_steps_run_at_the_largest():
    ms = MultiScale(DarknetDraw(320), every=10, seed=0, stop=1000, final=100)
    sizes = [ms.size_at(s) for s in range(1000)]
    assert sizes[:10] == [480] * 10 and sizes[910:] == [480] * 90  # Darknet's 90: iterations 910..999
    assert len(set(sizes[10:910])) > 4
    assert MultiScale([96, 128], every=1, seed=0, stop=10, final=0).size_at(9) in (96, 128)


def darknet_forced_largest(max_batches: int, every: int = 10, last: int = 100) -> set[int]:
    """AlexeyAB's train_detector loop (src/detector.c), the iterations it trains at the largest size: at each pass,
    ``if (count++ % 10 == 0)`` it decides, the largest when ``avg_loss < 0`` (the first pass) or
    ``get_current_iteration(net) > net.max_batches - 100``; the iteration is the updates done before the pass."""
    forced, count, largest = set(), 0, False
    for iteration in range(max_batches):  # while (get_current_iteration(net) < net.max_batches)
        if count % every == 0:
            largest = count == 0 or iteration > max_batches - last
        count += 1
        if largest:
            forced.add(iteration)
    return forced


@pytest.mark.parametrize(("stop", "every", "final"), [(1000, 10, 100), (1005, 10, 100), (1001, 10, 100),
                                                       (999, 10, 100), (95, 10, 100), (100, 10, 100),
                                                       (250, 7, 30), (12, 1, 5)])
def test_the_largest_size_is_decided_at_a_periods_top_as_darknets_loop(stop, every, final):
    """The steps at the largest size are Darknet's, the first period aside (bigbatch's step = Darknet's iteration
    at the top of the pass): none switch inside a period, and 1,000 steps end with 90 at the largest, not 100."""
    ms = MultiScale(ListDraw([32, 64]), every=every, seed=0, stop=stop, final=final)
    forced = {step for step in range(stop) if step < every or (step // every) * every > stop - final}
    assert forced == darknet_forced_largest(stop, every, final)  # the rule restated, against the loop
    start = ms.final_start()
    assert set(range(every)) | set(range(start, stop)) == darknet_forced_largest(stop, every, final)
    assert all(ms.size_at(step) == 64 for step in range(start, stop))
    assert all(ms.size_at(step) == ms.size_at(step - step % every) for step in range(stop))


def test_list_draw_is_uniform_over_the_list():
    draw, rng = ListDraw([320, 352, 384]), np.random.default_rng(1)
    counts = collections.Counter(draw(rng) for _ in range(9000))
    assert all(math.isclose(counts[s] / 9000, 1 / 3, abs_tol=0.03) for s in (320, 352, 384))


@pytest.mark.parametrize(
    "sizes, every, match",
    [([320, 300], 10, "300 is not a positive multiple of 32"), ([], 10, "empty"), ([0], 10, "0 is not"),
     ([-32], 10, "-32 is not"), ([320.0], 10, "320.0 is not"), ([320], 0, "every"), ([320], 2.5, "every")],
)
def test_validation(sizes, every, match):
    with pytest.raises(ValueError, match=match):
        MultiScale(sizes, every=every, seed=0)


def test_first_period_is_the_largest_and_size_is_constant_within_a_period():
    sizes = [320, 352, 384, 416, 448, 480, 512, 544, 576]
    ms = MultiScale(sizes, every=7, seed=3)
    seq = [ms.size_at(step) for step in range(7 * 200)]
    assert seq[:7] == [576] * 7
    for step, size in enumerate(seq):
        assert size in sizes
        assert size == seq[step - step % 7]  # only changes at multiples of `every`
    periods = [seq[k * 7] for k in range(200)]
    assert len(set(periods)) == len(sizes)  # every size gets used
    changes = sum(a != b for a, b in zip(periods, periods[1:], strict=False))
    assert changes > 100  # nine sizes drawn uniformly: a change ~8 times in 9


def test_two_ranks_agree_and_resume_out_of_order_matches():
    rank0, rank1 = MultiScale(DarknetDraw(608), every=10, seed=42), MultiScale(DarknetDraw(608), every=10, seed=42)
    in_order = [rank0.size_at(s) for s in range(400)]
    assert in_order == [rank1.size_at(s) for s in range(400)]
    resumed = MultiScale(DarknetDraw(608), every=10, seed=42)  # a fresh object, as after a restart at step 137
    assert [resumed.size_at(s) for s in range(137, 400)] == in_order[137:]
    assert [resumed.size_at(s) for s in reversed(range(400))] == in_order[::-1]


def test_different_seed_gives_a_different_sequence():
    a = [MultiScale(DarknetDraw(416), every=10, seed=0).size_at(s) for s in range(0, 1000, 10)]
    b = [MultiScale(DarknetDraw(416), every=10, seed=1).size_at(s) for s in range(0, 1000, 10)]
    assert a[0] == b[0] == 608  # both start at the largest
    assert a != b


def test_single_size_is_constant_and_negative_step_rejected():
    ms = MultiScale([800], every=1, seed=5)
    assert {ms.size_at(s) for s in range(50)} == {800}
    with pytest.raises(ValueError, match="step"):
        ms.size_at(-1)


def test_show_lists_the_sizes_a_run_can_take(tmp_path):
    from tests.helpers import run_main

    shown = run_main("show", "shapes-detect", "--set", "data.multiscale.sizes=auto", "data.size=320",
                     "data.max_size=null", f"data.path={tmp_path / 'not-written'}")
    assert shown.returncode == 0, shown.stderr
    assert ("multi-scale     256, 288, 320, 352, 384, 416, 448, 480 (Darknet's rule, a new size every 10 steps; "
            "the first 10 and the last 90 at 480)") in shown.stdout  # 1,200 steps: Darknet's 1110..1199
    assert not (tmp_path / "not-written").exists()
