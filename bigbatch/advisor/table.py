"""The advisor's table: one row per device count and global batch, from a measurement (``measure.py``) and the
model (``model.py``); the recommendation is the row of the shortest predicted wall time (docs/recipe.md).

Without S_min (no ``--from RUN --target-loss L``), steps are S(B) / S_min = 1 + B_noise / B and the wall time is per
S_min step: the rows still compare, and the recommendation is the same. Without a noise scale (it could not be
measured), steps are not predicted and the recommendation is the highest images/s, which says nothing about the
steps a batch needs; the table says so.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bigbatch.advisor.links import Link
from bigbatch.advisor.measure import Measured
from bigbatch.advisor.model import (
    StepPrediction,
    combined_sd,
    micro_batch_for,
    nearest_device_counts,
    predict_step,
    scaling_efficiency,
    steps_relative_sd,
    steps_to_target,
)
from bigbatch.errors import UserError


@dataclass(frozen=True)
class Target:
    """What the steps are counted to: S_min and B_noise (None: relative to S_min) and the run they came from."""

    b_noise: float | None
    b_noise_sd: float | None
    s_min: float | None = None
    run_batch: int | None = None
    """The batch of the run S_min came from (its steps are known there: no uncertainty from B_noise)."""
    source: str = ""


@dataclass(frozen=True)
class Row:
    step: StepPrediction
    efficiency: float
    steps: float | None
    """Steps to the target (None: no noise scale); relative to S_min without one."""
    steps_sd: float
    """Relative."""
    wall_s: float | None
    """S(B) x T_step (per S_min step without S_min)."""
    wall_sd: float
    """Relative."""
    device_hours: float | None
    cost: float | None


@dataclass(frozen=True)
class Advice:
    rows: list[Row]
    best: int
    cheapest: int | None
    link: Link
    target: Target
    measured: Measured
    price: float | None


def check_layouts(batches: list[int], devices: list[int]) -> None:
    """Refuse, in one line naming the nearest device counts that work, a device count a batch cannot be cut for."""
    for batch in batches:
        for n in devices:
            if batch % n:
                below, above = nearest_device_counts(batch, n)
                near = " or ".join(str(k) for k in (below, above) if k is not None)
                raise UserError(f"--devices: batch {batch} cannot be cut for {n} devices ({batch}/{n} is not a whole "
                                f"number of images); the nearest that work: {near}")


def default_batches(batch: int, devices: list[int]) -> list[int]:
    """The config's batch and its halves and doubles (x1/4 .. x4), those every device count divides."""
    scaled = (batch * f for f in (0.25, 0.5, 1, 2, 4))
    candidates = sorted({int(b) for b in scaled if float(b).is_integer() and b >= 2})
    return [b for b in candidates if all(b % n == 0 for n in devices)] or [batch]


def advise(measured: Measured, batches: list[int], devices: list[int], largest_micro_batch: int, link: Link,
           target: Target, price: float | None = None) -> Advice:
    """Every (devices, batch) row, the recommended and (with a price) the cheapest."""
    check_layouts(batches, devices)
    rows: list[Row] = []
    for n in devices:
        for batch in batches:
            micro = micro_batch_for(batch, n, largest_micro_batch)
            one_micro = micro_batch_for(batch, 1, largest_micro_batch)
            assert micro is not None and one_micro is not None  # check_layouts
            step = predict_step(measured.step, batch, n, micro, link)
            alone = predict_step(measured.step, batch, 1, one_micro, link)
            steps, steps_sd = None, 0.0
            if target.b_noise is not None:
                steps = steps_to_target(target.s_min if target.s_min is not None else 1.0, target.b_noise, batch)
                steps_sd = steps_relative_sd(target.b_noise, target.b_noise_sd or 0.0, batch, target.run_batch)
            step_sd = step.step_sd / step.step
            wall = steps * step.step if steps is not None else None
            wall_sd = combined_sd(steps_sd, step_sd)
            hours = n * wall / 3600 if wall is not None and target.s_min is not None else None
            cost = hours * price if hours is not None and price is not None else None
            rows.append(Row(step, scaling_efficiency(step, alone), steps, steps_sd, wall, wall_sd, hours, cost))
    if target.b_noise is not None:
        best = min(range(len(rows)), key=lambda i: (rows[i].wall_s, rows[i].step.devices))
    else:
        best = max(range(len(rows)), key=lambda i: (rows[i].step.images_per_s, -rows[i].step.devices))
    cheapest = (min(range(len(rows)), key=lambda i: (rows[i].cost, rows[i].wall_s))
                if any(r.cost is not None for r in rows) else None)
    return Advice(rows, best, cheapest, link, target, measured, price)


def _time(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.3g} s"


def format_advice(advice: Advice) -> str:
    m, target = advice.measured, advice.target
    relative = target.s_min is None
    estimated = f" (estimated: {advice.link.estimate}; sources: docs/recipe.md)" if advice.link.estimate else ""
    lines = [f"link {advice.link.name}: alpha {advice.link.alpha * 1e6:g} us, beta {advice.link.beta / 1e9:g} GB/s"
             + estimated]
    if target.b_noise is None:
        lines.append("noise scale: not measured (too few or too noisy steps): steps to the target not predicted; "
                     "the recommendation below is the most images/s only")
    else:
        lines.append(f"noise scale B_noise ~ {target.b_noise:,.3g} +/- {target.b_noise_sd or 0:,.2g} images "
                     f"({target.source})")
    steps_head = "steps/S_min" if relative else "steps"
    wall_head = "wall/S_min" if relative else "wall time"
    images_head = "images/S_min" if relative else "images"
    head = (f"  {'dev':>4} {'batch':>6} {'micro':>5} {'subd':>4} {'step':>9} {'+/-':>5} {'compute':>8} {'grad':>8} "
            f"{'wait':>7} {'bn':>7} {'update':>7} {'data':>7} {'img/s':>8} {'eff':>5} {steps_head:>11} "
            f"{images_head:>12} {wall_head:>10} {'+/-':>5}")
    if advice.price is not None and not relative:
        head += f" {'dev-h':>7} {'cost':>9}"
    lines.append(head)
    for i, row in enumerate(advice.rows):
        p = row.step
        mark = "*" if i == advice.best else ("$" if i == advice.cheapest else " ")
        steps = "-" if row.steps is None else (f"{row.steps:.3g}" if relative else f"{row.steps:,.0f}")
        images = "-" if row.steps is None else f"{row.steps * p.batch:.4g}"
        wall = "-" if row.wall_s is None else _time(row.wall_s)
        line = (f"{mark} {p.devices:>4} {p.batch:>6} {p.micro_batch:>5} {p.subdivisions:>4} {p.step:>8.4f}s "
                f"{100 * p.step_sd / p.step:>4.0f}% {p.compute:>8.4f} {p.grad_sync:>8.4f} {p.wait:>7.4f} "
                f"{p.bn_sync:>7.4f} "
                f"{p.update:>7.4f} {p.data:>7.4f} {p.images_per_s:>8.1f} {100 * row.efficiency:>4.0f}% "
                f"{steps:>11} {images:>12} {wall:>10} {100 * row.wall_sd:>4.0f}%")
        if advice.price is not None and not relative:
            line += f" {row.device_hours or 0:>7.3g} {row.cost or 0:>9.3g}"
        lines.append(line)
    best = advice.rows[advice.best].step
    lines.append(f"* recommended: batch {best.batch} on {best.devices} device(s), micro-batch {best.micro_batch} x "
                 f"{best.subdivisions} (--set batch={best.batch} subdivisions={best.subdivisions})"
                 + ("" if target.b_noise is not None else " (by images/s: no noise scale)"))
    if advice.cheapest is not None:
        cheap = advice.rows[advice.cheapest].step
        lines.append(f"$ cheapest: batch {cheap.batch} on {cheap.devices} device(s)")
    lines.append(f"measured on {m.device}: {m.steps} steps at batch {m.batch} = {m.subdivisions} x {m.step.micro_batch}"
                 f"; step parts in seconds; '+/-': the spread of the measured terms (or the range of an assumed "
                 f"one) and of B_noise (docs/recipe.md)")
    lines.append(pair_line(m))
    if target.s_min is None and target.b_noise is not None:
        lines.append("steps are relative to S_min (give --from RUN --target-loss L for steps and wall time); the "
                     "noise scale is the start's, lower than near a target: steps above it are overestimated")
    return "\n".join(lines)


def pair_line(m: Measured) -> str:
    """What the two-process measurement gave the model, or why there is none (the overlap then assumed)."""
    pair = m.pair
    if pair is None:
        why = f" ({m.pair_note})" if m.pair_note else ""
        return (f"DDP's overlap not measured{why}: assumed anywhere from none to all of the last backward (the "
                "middle, half the range in '+/-'); no wait for a slower process; BN sums at the link's latency")
    overlap = "DDP timed no all-reduce" if pair.overlap is None else (
        f"{pair.overlap:.2f} +/- {pair.overlap_sd:.2f} of the last backward hides the all-reduce")
    bn = "" if pair.bn_collective_s is None else (
        f"; a BN sum {1e6 * pair.bn_collective_s:.0f} +/- {1e6 * pair.bn_collective_sd:.0f} us while training")
    return (f"measured on 2 processes of this machine ({pair.device}, {pair.steps} steps at batch {pair.batch} = 2 x "
            f"{pair.subdivisions} x {pair.micro_batch}): {overlap}; the wait for the slower process "
            f"{pair.wait_s:.4f} +/- {pair.wait_sd:.4f} s a step{bn}; their compute per micro-batch "
            f"{pair.compute_s / pair.micro_batch * m.step.micro_batch:.4g} s against {m.step.compute_s:.4g} s alone "
            "(the table takes one process's: a device each)")


def advice_json(advice: Advice) -> dict[str, Any]:
    return {
        "measurement": advice.measured.to_json(),
        "link": asdict(advice.link),
        "target": asdict(advice.target),
        "price": advice.price,
        "rows": [{**asdict(row.step), "images_per_s": row.step.images_per_s, "step_sd": row.step.step_sd,
                  **{k: v for k, v in asdict(row).items() if k != "step"}} for row in advice.rows],
        "recommended": advice.best,
        "cheapest": advice.cheapest,
    }
