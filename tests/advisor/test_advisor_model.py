"""The advisor's arithmetic (bigbatch/advisor/model.py) pinned on synthetic measurements: numbers worked by hand."""

import math
import statistics

import pytest

from bigbatch.advisor.links import LINKS, Link, parse_link
from bigbatch.advisor.model import (
    StepMeasurement,
    all_reduce,
    images_to_target,
    micro_batch_for,
    nearest_device_counts,
    noise_scale_of_steps,
    predict_step,
    ring_all_reduce,
    s_min_from_run,
    scaling_efficiency,
    steps_relative_sd,
    steps_to_target,
    tree_all_reduce,
)
from bigbatch.errors import UserError

pytestmark = pytest.mark.fast

LINK = Link("test", alpha=1e-5, beta=1e9, source="synthetic")


def test_ring_and_tree_all_reduce():
    # ring on 4: 2*3*10 us + 2*3/4 * 1e8 B / 1e9 B/s = 60 us + 0.15 s
    assert ring_all_reduce(4, 1e8, LINK) == pytest.approx(6e-5 + 0.15)
    # tree on 8: 2*3*10 us + 2*7/8 * 1e8/1e9
    assert tree_all_reduce(8, 1e8, LINK) == pytest.approx(6e-5 + 0.175)
    assert ring_all_reduce(8, 1e8, LINK) == pytest.approx(14e-5 + 0.175)
    assert all_reduce(8, 1e8, LINK) == pytest.approx(tree_all_reduce(8, 1e8, LINK))  # the cheaper
    assert all_reduce(1, 1e8, LINK) == 0.0  # nothing to reduce on one device
    # latency-bound: a few bytes cost the alphas
    assert all_reduce(16, 8, LINK) == pytest.approx(2 * 4 * 1e-5, rel=1e-3)


def measured(**changes) -> StepMeasurement:
    values = dict(micro_batch=32, compute_s=0.1, compute_sd=0.01, backward_s=0.06, update_s=0.02,
                  data_s_per_image=0.001, data_workers=0, gradient_bytes=10**8, bn_layers=10, bn_bytes=1000,
                  bn_sync=False, overlap=None)
    values.update(changes)
    return StepMeasurement(**values)


def test_step_on_one_device_is_the_measured_parts():
    p = predict_step(measured(), batch=256, devices=1, micro_batch=32, link=LINK)
    assert p.subdivisions == 8
    assert p.compute == pytest.approx(0.8)
    assert p.grad_sync == 0.0 and p.bn_sync == 0.0
    assert p.data == pytest.approx(0.256)  # 256 images x 1 ms, in the training process: added
    assert p.step == pytest.approx(0.8 + 0.02 + 0.256)
    assert p.step_sd == pytest.approx(math.sqrt(8) * 0.01)
    assert p.images_per_s == pytest.approx(256 / p.step)


def test_step_on_four_devices_with_the_overlap_unmeasured_and_measured():
    m = measured()
    ar = all_reduce(4, 1e8, LINK)  # 0.15006 s, more than the 0.06 s backward that can hide it
    p = predict_step(m, 256, 4, 32, LINK)
    assert p.subdivisions == 2 and p.compute == pytest.approx(0.2)
    assert p.grad_sync == pytest.approx((ar + (ar - 0.06)) / 2)  # the middle of no overlap .. full overlap
    assert p.step_sd == pytest.approx(math.sqrt(2 * 0.01**2 + 0.03**2))
    assert p.data == pytest.approx(0.064)
    full = predict_step(measured(overlap=1.0), 256, 4, 32, LINK)
    assert full.grad_sync == pytest.approx(ar - 0.06) and full.step_sd == pytest.approx(math.sqrt(2) * 0.01)
    none = predict_step(measured(overlap=0.0), 256, 4, 32, LINK)
    assert none.grad_sync == pytest.approx(ar)
    one = predict_step(m, 256, 1, 32, LINK)
    assert scaling_efficiency(p, one) == pytest.approx((256 / p.step) / (4 * 256 / one.step))
    assert scaling_efficiency(one, one) == pytest.approx(1.0)


def test_cross_device_bn_is_two_latency_bound_collectives_per_layer_and_micro_batch():
    p = predict_step(measured(bn_sync=True), 256, 4, 32, LINK)
    assert p.bn_sync == pytest.approx(2 * 10 * 2 * all_reduce(4, 1000, LINK))
    assert predict_step(measured(bn_sync=True), 256, 1, 32, LINK).bn_sync == 0.0


def test_the_measured_overlap_wait_and_bn_sum_enter_the_step_with_their_spreads():
    ar = all_reduce(4, 1e8, LINK)  # 0.15006 s
    # half the 0.06 s backward hides the all-reduce (+/- 0.1 of it); a 0.02 s wait (+/- 0.005) on several devices
    m = measured(overlap=0.5, overlap_sd=0.1, wait_s=0.02, wait_sd=0.005)
    p = predict_step(m, 256, 4, 32, LINK)
    assert p.grad_sync == pytest.approx(ar - 0.03) and p.wait == pytest.approx(0.02)
    assert p.step == pytest.approx(0.2 + ar - 0.03 + 0.02 + 0.02 + 0.064)
    assert p.step_sd == pytest.approx(math.sqrt(2 * 0.01**2 + 0.006**2 + 0.005**2))
    alone = predict_step(m, 256, 1, 32, LINK)
    assert alone.wait == 0.0 and alone.grad_sync == 0.0  # one device waits for no one
    hidden = predict_step(measured(overlap=0.5, overlap_sd=0.1, gradient_bytes=10**6), 256, 4, 32, LINK)
    assert hidden.grad_sync == 0.0 and hidden.step_sd == pytest.approx(math.sqrt(2) * 0.01)  # all hidden: no spread
    # a BN sum measured at 1 ms, above the link's 2 log2(4) x 10 us: the measured bounds, 2 x 10 layers x 2 micro
    bn = predict_step(measured(bn_sync=True, bn_collective_s=1e-3, bn_collective_sd=2e-4), 256, 4, 32, LINK)
    assert bn.bn_sync == pytest.approx(40 * 1e-3)
    assert bn.step_sd == pytest.approx(math.sqrt(2 * 0.01**2 + 0.03**2 + (40 * 2e-4) ** 2))
    slow = Link("slow", alpha=1e-3, beta=1e9, source="synthetic")  # the link's 4 ms per sum bounds
    assert predict_step(measured(bn_sync=True, bn_collective_s=1e-3), 256, 4, 32, slow).bn_sync == pytest.approx(
        40 * all_reduce(4, 1000, slow))
    assert predict_step(measured(bn_sync=True, bn_collective_s=1e-3), 256, 1, 32, LINK).bn_sync == 0.0


def test_the_pair_summary_from_ddp_timing_and_the_phase_clock():
    from bigbatch.advisor.pair import pair_layout, summarise

    def rank(compute, comm, overlap, bn, sync=0.05):
        ddp = [{"backward_compute_time": compute, "backward_comm_time": comm,
                "backward_compute_comm_overlap_time": overlap}] * 2
        times = [{"t_forward": 0.3, "t_backward": 0.5, "t_bn_sync": bn, "t_sync": sync}] * 2
        return {"ddp": ddp, "times": times, "all_reduce_s": 0.04, "small_s": 2e-4, "subdivisions": 2,
                "bn_layers": 5, "bn_sync": True, "device": "cpu"}

    # rank 0: 0.2 s backward, all-reduce launched 0.05 s before its end, done 0.03 s after it (0.08 s in all);
    # rank 1: 0.1 s backward, 0.02 s of overlap, 0.09 s of communication
    pair = summarise([rank(0.2, 0.08, 0.05, 0.02), rank(0.1, 0.09, 0.02, 0.04, sync=0.07)], batch=64, micro=16)
    assert pair.steps == 2 and pair.subdivisions == 2
    assert pair.overlap == pytest.approx((0.25 + 0.2) / 2)
    assert pair.overlap_sd == pytest.approx(statistics.stdev([0.25, 0.25, 0.2, 0.2]))
    assert pair.exposed_s == pytest.approx((0.03 + 0.07) / 2)
    # the wait: the phase clock's t_sync (0.06 s) less what the all-reduce alone (0.04 s) leaves after the overlap
    # of the mean backward (0.225 x 0.15 s)
    assert pair.sync_s == pytest.approx(0.06)
    assert pair.wait_s == pytest.approx(0.06 - (0.04 - 0.225 * 0.15))
    assert pair.wait_sd == pytest.approx(statistics.stdev([0.05, 0.05, 0.07, 0.07]))
    assert pair.bn_collective_s == pytest.approx((0.02 + 0.04) / 2 / 20)  # 2 x 5 layers x 2 micro-batches a step
    assert pair.compute_s == pytest.approx(((0.8 - 0.02) + (0.8 - 0.04)) / 2 / 2)
    assert pair.alpha_s == pytest.approx(1e-4)
    silent = summarise([{**rank(0.2, 0, 0, 0.0), "bn_sync": False}] * 2, batch=64, micro=16)
    assert silent.overlap is None and silent.bn_collective_s is None  # DDP timed no communication
    one = summarise([{**rank(0.2, 0.08, 0.05, 0.0), "subdivisions": 1}] * 2, batch=32, micro=16)
    assert one.sync_s == pytest.approx(0.03)  # one micro-batch a process: DDP's exposed communication stands in
    assert pair_layout(64, 32) == (64, 16)  # 32 a process, in two micro-batches
    assert pair_layout(64, 8) == (64, 8)
    assert pair_layout(6, 32) == (6, 1)
    assert pair_layout(3, 32) == (4, 1)


def test_data_workers_overlap_the_step_and_bound_it_when_slower():
    fast = predict_step(measured(data_workers=2), 256, 1, 32, LINK)
    assert fast.step == pytest.approx(0.82)  # the pipeline's 0.256 s hides behind the 0.82 s on the device
    slow = predict_step(measured(data_workers=2, data_s_per_image=0.01), 256, 1, 32, LINK)
    assert slow.step == pytest.approx(2.56)  # the pipeline bounds


def test_a_smaller_micro_batch_scales_the_per_image_compute():
    p = predict_step(measured(), 64, 4, 16, LINK)
    assert p.subdivisions == 1 and p.compute == pytest.approx(0.05)
    with pytest.raises(ValueError):
        predict_step(measured(), 100, 3, 32, LINK)


def test_steps_and_images_to_target():
    # McCandlish et al.: at B = B_noise twice the fewest steps and twice the fewest images
    assert steps_to_target(1000, 512, 512) == pytest.approx(2000)
    assert images_to_target(1000 * 512, 512, 512) == pytest.approx(1000 * 512 * 2)
    for batch in (16, 256, 4096):  # E(B) = B S(B)
        assert images_to_target(1000 * 512, 512, batch) == pytest.approx(batch * steps_to_target(1000, 512, batch))
    # a run that took 3000 steps at batch 256 with B_noise 512: S_min = 3000 / 3 = 1000
    assert s_min_from_run(3000, 256, 512) == pytest.approx(1000)
    assert steps_to_target(s_min_from_run(3000, 256, 512), 512, 256) == pytest.approx(3000)


def test_steps_uncertainty_from_the_noise_scale():
    # relative: at B = B_noise, half of B_noise's relative uncertainty
    assert steps_relative_sd(512, 51.2, 512) == pytest.approx(0.05)
    assert steps_relative_sd(512, 51.2, 256, at_batch=256) == 0.0  # at the run's own batch: its steps
    assert steps_relative_sd(512, 51.2, 4096, at_batch=256) == pytest.approx((2 / 3 - 1 / 9) * 0.1)


def test_noise_scale_of_steps_is_a_ratio_of_means_with_a_bootstrap_spread():
    b, sd = noise_scale_of_steps([1.0, 3.0], [100.0, 500.0])
    assert b == pytest.approx(600 / 4)  # not the mean of the ratios (100 and 166.7)
    assert sd > 0
    b, sd = noise_scale_of_steps([2.0] * 5, [200.0] * 5)
    assert (b, sd) == (pytest.approx(100.0), pytest.approx(0.0))
    assert noise_scale_of_steps([-1.0, 0.5], [10.0, 10.0]) is None  # mean |G|^2 <= 0: not defined
    assert noise_scale_of_steps([], []) is None
    assert noise_scale_of_steps([1.0, 2.0], [5.0, 7.0]) == noise_scale_of_steps([1.0, 2.0], [5.0, 7.0])


def test_micro_batch_and_the_device_counts_a_batch_can_be_cut_for():
    assert micro_batch_for(256, 1, 32) == 32
    assert micro_batch_for(256, 4, 32) == 32
    assert micro_batch_for(256, 16, 32) == 16
    assert micro_batch_for(96, 1, 64) == 32  # 64 does not divide 96
    assert micro_batch_for(48, 2, 32) == 24  # the per-device batch itself fits
    assert micro_batch_for(256, 3, 32) is None
    assert nearest_device_counts(256, 3) == (2, 4)
    assert nearest_device_counts(256, 6) == (4, 8)
    assert nearest_device_counts(100, 3) == (2, 4)
    assert nearest_device_counts(7, 3) == (1, 7)


def test_link_presets_and_given_links():
    assert set(LINKS) == {"nvlink", "pcie", "ib100", "ib200", "ib400", "eth10", "eth25"}
    for link in LINKS.values():
        assert link.alpha > 0 and link.beta > 0 and link.source
    assert LINKS["ib400"].beta == pytest.approx(4 * LINKS["ib100"].beta)
    given = parse_link("25,12")
    assert given.alpha == pytest.approx(25e-6) and given.beta == pytest.approx(12e9)
    assert parse_link("NVLink") is LINKS["nvlink"]
    for bad in ("fast", "1,2,3", "-1,5", "5,0", "inf,1"):
        with pytest.raises(UserError, match="--link"):
            parse_link(bad)


def test_the_table_recommends_the_shortest_wall_time_or_without_a_noise_scale_the_most_images_per_second():
    from bigbatch.advisor.measure import Measured
    from bigbatch.advisor.table import Target, advise, default_batches, format_advice

    m = Measured(measured(), batch=256, subdivisions=8, steps=5, noise_scale=512.0, noise_scale_sd=51.2, device="cpu")
    advice = advise(m, [64, 256, 1024], [1, 4], 32, LINK, Target(512.0, 51.2, s_min=1000.0, run_batch=256), price=2.0)
    walls = [row.wall_s for row in advice.rows]
    assert advice.best == walls.index(min(walls))
    row = advice.rows[0]  # 1 device, batch 64
    assert row.steps == pytest.approx(1000 * (1 + 512 / 64))
    assert row.wall_s == pytest.approx(row.steps * row.step.step)
    assert row.cost == pytest.approx(2.0 * row.wall_s / 3600)
    text = format_advice(advice)
    starred = [line for line in text.splitlines() if line.startswith("*")]
    assert len(starred) == 2 and starred[1].startswith("* recommended: batch")  # the row, and the line naming it
    blind = advise(m, [64, 256, 1024], [1, 4], 32, LINK, Target(None, None))
    rates = [row.step.images_per_s for row in blind.rows]
    assert blind.best == rates.index(max(rates)) and blind.rows[0].steps is None
    assert "by images/s: no noise scale" in format_advice(blind)
    assert default_batches(256, [1, 2, 4, 8]) == [64, 128, 256, 512, 1024]
    assert default_batches(36, [1, 2]) == [18, 36, 72, 144]  # 9 is not cut for 2 devices
    with pytest.raises(UserError, match="nearest that work: 2 or 4"):
        advise(m, [256], [3], 32, LINK, Target(None, None))
