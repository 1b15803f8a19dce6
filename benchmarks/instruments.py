"""The cost of the run's instruments: the same training run with them (phase timing, the gradient noise scale, the
per-layer update sizes) and without, side by side.

Each round trains the digits recipe (small CNN, batch 256 in 8 micro-batches) for ``--steps`` steps twice, once with
``log.timing=events log.noise_scale=true log.updates=true`` (the defaults) and once with all three off, in
alternating order; evaluation and checkpoints are pushed past the end. The time is the median step time of the
run's own training records (``images_per_s``, every ``--log-every`` steps after the first 10), so start-up is not
counted. The median over rounds of the ratio with / without is reported, and the same for the CPU time the whole run
took in the process (``time.process_time``: time the machine gave to other work is not in it).

    python benchmarks/instruments.py [--rounds 5] [--steps 60] [--log-every 10] [--only timing|noise_scale|updates]

``--clock`` measures instead, in isolation, what the phase clock adds: the cost of a phase switch (host clock), and
of a call through a sub-phase timer (``t_bn_sync``: each cross-device BN all-reduce goes through one) at a step
that is timed and at one that is not, each against the bare call.

    python benchmarks/instruments.py --clock [--calls 200000]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from pathlib import Path

import torch

INSTRUMENTS = {"timing": ("log.timing=events", "log.timing=off"),
               "noise_scale": ("log.noise_scale=true", "log.noise_scale=false"),
               "updates": ("log.updates=true", "log.updates=false")}


def step_and_cpu_seconds(out: Path, on: bool, steps: int, measured: list[str],
                         log_every: int = 10) -> tuple[float, float]:
    """The run's median wall-clock seconds per step, and the CPU seconds the whole run took in this process."""
    import time

    from bigbatch.config import load_config
    from bigbatch.engine.trainer import train

    flags = [INSTRUMENTS[name][0 if on else 1] for name in measured]
    flags += [INSTRUMENTS[name][1] for name in INSTRUMENTS if name not in measured]  # the others: off on both sides
    cfg = load_config("digits", [f"steps={steps}", "eval.every=100000", "checkpoint.every=100000",
                                 "log.tensorboard=false", f"log.every={log_every}", *flags])
    cpu = time.process_time()
    train(cfg, out)
    cpu = time.process_time() - cpu
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["images_per_s"] for r in records if "images_per_s" in r and r["step"] > 10]
    return cfg.batch / statistics.median(rates), cpu


def clock_costs(calls: int) -> None:
    """Microseconds per phase switch and per sub-phase call (timed step, untimed step), minus the bare loop."""
    import time

    from bigbatch.engine.phases import PhaseClock

    def per_call(body) -> float:
        best = float("inf")
        for _ in range(5):  # the best of five: the least disturbed by the rest of the machine
            start = time.perf_counter()
            body()
            best = min(best, time.perf_counter() - start)
        return best / calls * 1e6

    def nothing() -> None:
        return None

    clock = PhaseClock("events")
    timer = clock.sub_phase("bn_sync")

    def bare() -> None:
        for _ in range(calls):
            nothing()

    def switches() -> None:
        clock.begin("data")
        for _ in range(calls):
            clock.switch("forward")
        clock.end(False)

    def through_timer(measure: bool) -> None:
        clock.measure_next = measure
        clock.begin("data")
        for _ in range(calls):
            timer(nothing)
        clock.end(False)

    base = per_call(bare)
    print(f"bare call: {base:.3f} us")
    print(f"phase switch: {per_call(switches) - base:.3f} us more than a bare call")
    print(f"sub-phase call at a timed step: {per_call(lambda: through_timer(True)) - base:.3f} us more")
    print(f"sub-phase call at an untimed step: {per_call(lambda: through_timer(False)) - base:.3f} us more")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--only", choices=sorted(INSTRUMENTS), help="measure this instrument alone (default: all)")
    parser.add_argument("--log-every", type=int, default=10,
                        help="log.every on both sides: 1 times every step (the most the instruments can "
                             "cost) and gives the median more steps")
    parser.add_argument("--clock", action="store_true", help="the phase clock's own costs, in isolation")
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    if args.clock:
        clock_costs(args.calls)
        return
    measured = [args.only] if args.only else list(INSTRUMENTS)
    torch.set_num_threads(1)
    ratios, with_, without, cpu_ratios = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            times, cpu = {}, {}
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                times[on], cpu[on] = step_and_cpu_seconds(Path(tmp) / f"r{r}-{on}", on, args.steps, measured,
                                                          args.log_every)
            cpu_ratios.append(cpu[True] / cpu[False])
            with_.append(times[True])
            without.append(times[False])
            ratios.append(times[True] / times[False])
            print(f"round {r}: with {times[True] * 1000:.1f} ms/step, without {times[False] * 1000:.1f} ms/step, "
                  f"ratio {ratios[-1]:.4f}; CPU time of the whole run: ratio {cpu_ratios[-1]:.4f}", flush=True)
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} torch thread(s), torch {torch.__version__}; "
          f"measured: {', '.join(measured)}")
    print(f"median ms/step: with {statistics.median(with_) * 1000:.1f}, without "
          f"{statistics.median(without) * 1000:.1f}; median ratio {statistics.median(ratios):.4f} "
          f"(min {min(ratios):.4f}, max {max(ratios):.4f})")
    print(f"CPU time of the whole run (start-up and the final evaluation included, the same on both sides): median "
          f"ratio {statistics.median(cpu_ratios):.4f} (min {min(cpu_ratios):.4f}, max {max(cpu_ratios):.4f})")


if __name__ == "__main__":
    main()
