"""The advisor's arithmetic: steps and images to a target, and the time of a step on N devices (docs/recipe.md,
"Which batch, how many devices", has the model with its sources). Pure functions of measured numbers.

Steps and images to a target (McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch
Training", eq. 2.11-2.12), B_noise the gradient noise scale (B_simple, ``telemetry/noise_scale.py``):

    S(B) = S_min (1 + B_noise / B)          steps
    E(B) = E_min (1 + B / B_noise)          images, E_min = S_min B_noise

Time of a step at global batch B on N devices, micro-batch b, S = B / (N b) micro-batches per device:

    T_device = S t_mb + T_grad + T_wait + T_bn + T_update
    t_mb     = the forward and backward of one micro-batch, measured on one device (per image, times b)
    T_grad   = the gradient all-reduce, less what DDP hides behind the last micro-batch's backward:
               ring 2(N-1) alpha + 2(N-1)/N bytes/beta, tree 2 log2(N) alpha + the same bandwidth term (the
               cheaper of the two, as NCCL picks); hidden: overlap x the last backward, the overlap measured by
               DDP on two processes (``pair.py``); not measured: anywhere from none to all of that backward
    T_wait   = the wait for the slower process at the all-reduce, measured on two processes (0 on one device)
    T_bn     = cross-device BatchNorm: 2 all-reduces per BN layer per micro-batch (statistics forward, their
               gradients backward), on the critical path, of a few channels' sums: latency-bound; each the
               link's all-reduce or, where larger, one sum as measured on two training processes
    T_update = the optimizer step and the rest of the step, measured
    T_step   = T_device + T_data (data loaded in the training process) or max(T_device, T_data) (data workers
               load the next step meanwhile); T_data = the images per device x the pipeline's seconds per image
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from bigbatch.advisor.links import Link


def ring_all_reduce(devices: int, nbytes: float, link: Link) -> float:
    """Seconds of a ring all-reduce of ``nbytes``: 2(N-1) alpha + 2(N-1)/N nbytes/beta (0 on one device)."""
    if devices <= 1:
        return 0.0
    return 2 * (devices - 1) * link.alpha + 2 * (devices - 1) / devices * nbytes / link.beta


def tree_all_reduce(devices: int, nbytes: float, link: Link) -> float:
    """Seconds of a (double binary) tree all-reduce: about 2 log2(N) alpha + 2(N-1)/N nbytes/beta (0 on one)."""
    if devices <= 1:
        return 0.0
    return 2 * math.log2(devices) * link.alpha + 2 * (devices - 1) / devices * nbytes / link.beta


def all_reduce(devices: int, nbytes: float, link: Link) -> float:
    """The cheaper of the ring and the tree (NCCL picks the algorithm by size and device count)."""
    return min(ring_all_reduce(devices, nbytes, link), tree_all_reduce(devices, nbytes, link))


@dataclass(frozen=True)
class StepMeasurement:
    """What one device measured (``measure.py``), per micro-batch of ``micro_batch`` images unless said."""

    micro_batch: int
    compute_s: float
    """Forward and backward of one micro-batch, mean over the measured steps."""
    compute_sd: float
    """Its standard deviation over the measured steps (per micro-batch)."""
    backward_s: float
    """The backward of one micro-batch: the window DDP's gradient buckets can overlap."""
    update_s: float
    """Per step: the optimizer step and the rest (moving batches to the device, the step's hooks)."""
    data_s_per_image: float
    """The input pipeline's seconds per image."""
    data_workers: int
    gradient_bytes: int
    """The gradient all-reduced each step (every trainable parameter, in its own dtype)."""
    bn_layers: int
    bn_bytes: float
    """Bytes one BN layer's statistics all-reduce carries (sums and count, the mean over the layers)."""
    bn_sync: bool
    """Whether the config synchronises BatchNorm across devices (``norm.sync``)."""
    overlap: float | None = None
    """Fraction of the last backward that hides the gradient all-reduce, measured by DDP on two processes
    (``pair.py``); None: not measured, and the prediction spans no overlap to full overlap."""
    overlap_sd: float = 0.0
    wait_s: float = 0.0
    """The wait for the slower process at the gradient all-reduce, per step on several devices (measured on two)."""
    wait_sd: float = 0.0
    bn_collective_s: float | None = None
    """One cross-device BN sum as measured on two training processes (None: not measured: the link's cost)."""
    bn_collective_sd: float = 0.0


@dataclass(frozen=True)
class StepPrediction:
    devices: int
    batch: int
    micro_batch: int
    subdivisions: int
    compute: float
    grad_sync: float
    wait: float
    bn_sync: float
    update: float
    data: float
    step: float
    step_sd: float
    """The step's uncertainty (seconds): the measured spread of the compute, of the overlap (or its range where not
    measured), of the wait and of the BN sums."""

    @property
    def images_per_s(self) -> float:
        return self.batch / self.step


def predict_step(m: StepMeasurement, batch: int, devices: int, micro_batch: int, link: Link) -> StepPrediction:
    """The time of one step at global ``batch`` on ``devices``, ``micro_batch`` images per micro-batch (module
    docstring). The compute per image is taken as measured at ``m.micro_batch`` (an approximation where
    ``micro_batch`` differs: a smaller micro-batch uses a device less well)."""
    if batch % (devices * micro_batch):
        raise ValueError(f"batch {batch} is not a whole number of micro-batches of {micro_batch} on {devices}")
    subdivisions = batch // (devices * micro_batch)
    scale = micro_batch / m.micro_batch
    per_mb, sd_mb, backward = m.compute_s * scale, m.compute_sd * scale, m.backward_s * scale
    compute = subdivisions * per_mb
    exposed_most = all_reduce(devices, m.gradient_bytes, link)
    exposed_least = max(0.0, exposed_most - backward)
    if m.overlap is None:  # not measured: the middle of the range, the half range as its uncertainty
        grad_sync, grad_sd = (exposed_most + exposed_least) / 2, (exposed_most - exposed_least) / 2
    else:
        grad_sync = max(0.0, exposed_most - m.overlap * backward)
        grad_sd = m.overlap_sd * backward if grad_sync > 0 else 0.0
    several = devices > 1
    wait, wait_sd = (m.wait_s, m.wait_sd) if several else (0.0, 0.0)
    bn, bn_sd = 0.0, 0.0
    if m.bn_sync and several:
        calls = 2 * m.bn_layers * subdivisions
        one = all_reduce(devices, m.bn_bytes, link)
        if m.bn_collective_s is not None and m.bn_collective_s > one:  # the measured sum bounds
            one, bn_sd = m.bn_collective_s, calls * m.bn_collective_sd
        bn = calls * one
    device = compute + grad_sync + wait + bn + m.update_s
    data = batch // devices * m.data_s_per_image
    step = max(device, data) if m.data_workers > 0 else device + data
    # the micro-batches' spreads add as variances; the other terms' spreads as independent ones
    step_sd = math.sqrt(subdivisions * sd_mb**2 + grad_sd**2 + wait_sd**2 + bn_sd**2)
    return StepPrediction(devices, batch, micro_batch, subdivisions, compute, grad_sync, wait, bn, m.update_s, data,
                          step, step_sd)


def scaling_efficiency(on_n: StepPrediction, on_one: StepPrediction) -> float:
    """Images/s on N devices over N times images/s on one, at the same global batch."""
    return on_n.images_per_s / (on_n.devices * on_one.images_per_s)


def steps_to_target(s_min: float, b_noise: float, batch: float) -> float:
    """S(B) = S_min (1 + B_noise / B) (McCandlish et al. 2018, eq. 2.11)."""
    return s_min * (1 + b_noise / batch)


def images_to_target(e_min: float, b_noise: float, batch: float) -> float:
    """E(B) = E_min (1 + B / B_noise) (McCandlish et al. 2018, eq. 2.11); equal to B S(B) with E_min = S_min
    B_noise."""
    return e_min * (1 + batch / b_noise)


def s_min_from_run(steps: float, batch: float, b_noise: float) -> float:
    """S_min from a run that took ``steps`` at ``batch`` to the target: S / (1 + B_noise / B)."""
    return steps / (1 + b_noise / batch)


def steps_relative_sd(b_noise: float, b_noise_sd: float, batch: float, at_batch: float | None = None) -> float:
    """Relative uncertainty of S(B) from B_noise's (first order). Without a run, S(B) / S_min = 1 + B_noise/B:
    d ln S = (B_noise/B) / (1 + B_noise/B) d ln B_noise. With S_min from a run at ``at_batch``, S(B) = S_run
    (1 + B_noise/B) / (1 + B_noise/B_run), and the two terms partly cancel (none at B = B_run)."""
    rel = b_noise_sd / b_noise if b_noise > 0 else 0.0
    here = (b_noise / batch) / (1 + b_noise / batch)
    there = (b_noise / at_batch) / (1 + b_noise / at_batch) if at_batch is not None else 0.0
    return abs(here - there) * rel


def noise_scale_of_steps(gradient_sq: Sequence[float], trace_sigma: Sequence[float], resamples: int = 200,
                         seed: int = 0) -> tuple[float, float] | None:
    """B_simple over the measured steps, with its uncertainty: the ratio of the means of the per-step unbiased
    estimates of tr(Sigma) and |G|^2 (McCandlish et al. 2018, A.1: a ratio of averages, not an average of
    ratios), and the standard deviation of that ratio over bootstrap resamples of the steps (a fixed seed: the
    same numbers give the same answer). None where the mean |G|^2 <= 0 or the mean tr(Sigma) < 0 (too few or too
    noisy steps to say)."""
    n = len(gradient_sq)
    if n == 0 or n != len(trace_sigma):
        return None
    g, t = sum(gradient_sq) / n, sum(trace_sigma) / n
    if g <= 0 or t < 0:
        return None
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        picks = [rng.randrange(n) for _ in range(n)]
        gs, ts = sum(gradient_sq[i] for i in picks), sum(trace_sigma[i] for i in picks)
        if gs > 0 and ts >= 0:
            ratios.append(ts / gs)
    if len(ratios) < 2:
        return t / g, math.inf
    mean = sum(ratios) / len(ratios)
    return t / g, math.sqrt(sum((r - mean) ** 2 for r in ratios) / (len(ratios) - 1))


def micro_batch_for(batch: int, devices: int, largest: int) -> int | None:
    """The micro-batch a device takes at global ``batch`` on ``devices``: the largest of 1, 2, 4, ... (or the
    per-device batch itself) that divides the per-device batch and is at most ``largest`` (what fits, from the
    memory plan), as the planner chooses; None where the batch cannot be cut for that many devices."""
    if devices < 1 or batch % devices:
        return None
    per_device = batch // devices
    sizes, m = [], 1
    while m <= per_device:
        if per_device % m == 0:
            sizes.append(m)
        m *= 2
    sizes.append(per_device)
    fitting = [s for s in sizes if s <= largest]
    return max(fitting) if fitting else None


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` >= 1, ascending: its prime factors by trial division (up to the square root of what is
    left, so a batch of 2^k or 3 x 2^k is factored in k steps), then their products."""
    factors: dict[int, int] = {}
    left, p = n, 2
    while p * p <= left:
        while left % p == 0:
            factors[p] = factors.get(p, 0) + 1
            left //= p
        p += 1 if p == 2 else 2
    if left > 1:
        factors[left] = factors.get(left, 0) + 1
    found = [1]
    for prime, power in factors.items():
        found = [d * prime**k for d in found for k in range(power + 1)]
    return sorted(found)


def nearest_device_counts(batch: int, devices: int) -> tuple[int | None, int | None]:
    """The nearest device counts below and above ``devices`` that ``batch`` can be cut for (its divisors)."""
    counts = divisors(batch)
    i = bisect.bisect_left(counts, devices)
    below = counts[i - 1] if i > 0 else None
    j = bisect.bisect_right(counts, devices)
    above = counts[j] if j < len(counts) else None
    return below, above


def combined_sd(*relative: float) -> float:
    """Independent relative uncertainties of a product, in quadrature."""
    return math.sqrt(sum(r * r for r in relative))
