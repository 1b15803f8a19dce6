"""Multi-scale sizes: multiples of 32 within [base / 1.4, base * 1.4], a new size every N steps, the
largest first, and a pure function of (seed, step): the same on every rank and after a resume."""

import pytest

from bigbatch.data.multiscale import MultiScale, default_sizes


def test_default_sizes_exact_lists():
    # 416 / 1.4 = 297.1 -> 320; 416 * 1.4 = 582.4 -> 576 (Darknet's own range is 320..608)
    assert default_sizes(416) == [320, 352, 384, 416, 448, 480, 512, 544, 576]
    # 608 / 1.4 = 434.3 -> 448; 608 * 1.4 = 851.2 -> 832
    assert default_sizes(608) == list(range(448, 833, 32))
    assert default_sizes(608)[0] == 448 and default_sizes(608)[-1] == 832
    # 800 / 1.4 = 571.4 -> 576; 800 * 1.4 = 1120 exactly, included
    assert default_sizes(800) == [576 + 32 * i for i in range(18)]
    assert default_sizes(800)[-1] == 1120


@pytest.mark.parametrize("base", [96, 224, 320, 416, 512, 608, 640, 800, 1024])
def test_default_sizes_are_multiples_of_32_within_range(base):
    sizes = default_sizes(base)
    assert all(s % 32 == 0 for s in sizes)
    assert all(base / 1.4 <= s <= base * 1.4 for s in sizes)
    # rounded inwards and complete: the next multiple outside each end is out of range
    assert sizes[0] - 32 < base / 1.4 and sizes[-1] + 32 > base * 1.4
    assert sizes == list(range(sizes[0], sizes[-1] + 1, 32))


def test_default_sizes_rejects_an_empty_range():
    with pytest.raises(ValueError, match="no multiple of 32"):
        default_sizes(20)


@pytest.mark.parametrize(
    "sizes, every, match",
    [([320, 300], 10, "300 is not a positive multiple of 32"), ([], 10, "empty"), ([0], 10, "0 is not"),
     ([-32], 10, "-32 is not"), ([320.0], 10, "320.0 is not"), ([320], 0, "every"), ([320], 2.5, "every")],
)
def test_validation(sizes, every, match):
    with pytest.raises(ValueError, match=match):
        MultiScale(sizes, every=every, seed=0)


def test_first_period_is_the_largest_and_size_is_constant_within_a_period():
    sizes = default_sizes(416)
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
    sizes = default_sizes(608)
    rank0, rank1 = MultiScale(sizes, every=10, seed=42), MultiScale(list(sizes), every=10, seed=42)
    in_order = [rank0.size_at(s) for s in range(400)]
    assert in_order == [rank1.size_at(s) for s in range(400)]
    resumed = MultiScale(sizes, every=10, seed=42)  # a fresh object, as after a restart at step 137
    assert [resumed.size_at(s) for s in range(137, 400)] == in_order[137:]
    assert [resumed.size_at(s) for s in reversed(range(400))] == in_order[::-1]


def test_different_seed_gives_a_different_sequence():
    sizes = default_sizes(416)
    a = [MultiScale(sizes, every=10, seed=0).size_at(s) for s in range(0, 1000, 10)]
    b = [MultiScale(sizes, every=10, seed=1).size_at(s) for s in range(0, 1000, 10)]
    assert a[0] == b[0] == 576  # both start at the largest
    assert a != b


def test_single_size_is_constant_and_negative_step_rejected():
    ms = MultiScale([800], every=1, seed=5)
    assert {ms.size_at(s) for s in range(50)} == {800}
    with pytest.raises(ValueError, match="step"):
        ms.size_at(-1)
