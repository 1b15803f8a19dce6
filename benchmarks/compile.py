"""``model.compile`` (torch.compile) against eager: the compile time, and the steady-state images/s side by side.

Cases: ResNet-18 (torchvision's, channels-last) on the digits set upscaled to 64 and to 128 px, SGD without warmup;
the ``yolov4-tiny-3l-shapes`` recipe (128 px letterboxed, AdamW, weight EMA) on a generated shapes set of ``--images``
images; each at ``--batch`` images a step in ``--subdivisions`` micro-batches, its input pipeline in the training
process (``data.workers=0``).

**Compile time**, from ``bigbatch train`` processes as a user runs them (``--steps`` steps, each step recorded), per
round: ``eager`` (``model.compile=false``); each mode of ``--modes`` with inductor's cache
(``TORCHINDUCTOR_CACHE_DIR``) a new, empty folder, what a first run pays; and ``MODE+``, the same again with the cache
that run left, what a later run of the same model pays. Compile = the compiled run's first ``t_step`` minus eager's
(both first steps also choose oneDNN's kernels and touch their memory first). The process's wall time is printed too.
Each compiled run's losses are compared with eager's, step by step (the largest relative gap).

**Steady state**, in one process (the machine is shared: a slow minute would weigh on one side only if the sides ran
one after the other): the eager and the compiled training steps are built side by side (``engine/parts.py``, as
``bigbatch train`` builds them, from the same weights), each compiles and warms up on ``--warmup`` steps, then they
take turns, step by step (the order of each pair alternating), on the same micro-batches from the task's loader, for
``--pairs`` pairs. Images/s = batch / the median step time of each side; the ratio is the median of the pairs'
ratios. The cache is the compile-time runs' (warm). For a classifier, one micro-batch's gradients, eager and
compiled, are also compared with the same computed in float64 from the same weights (how far each is from exact).

The report starts with the machine, the date, torch's version and the load (``uptime``); the load again at the end.

    python benchmarks/compile.py [--cases resnet18-64,resnet18-128,yolov4-tiny-3l] [--rounds 1] [--steps 8]
                                 [--pairs 16] [--warmup 3] [--threads 1] [--images 400] [--batch 32]
                                 [--subdivisions 1] [--modes default[,reduce-overhead,max-autotune]] [--gpu]
                                 [--workdir DIR]

On a GPU (``--gpu``: the runs see the CUDA devices; benchmarks/gpu_check.sh runs it) each mode of ``--modes`` is a
side of its own against the same eager one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMON = ["log.every=1", "log.tensorboard=false", "data.workers=0"]

CASES = {
    "resnet18-64": ("digits", ["model.name=resnet18", "data.size=64", "eval.batch=64", "schedule.warmup=[]"]),
    "resnet18-128": ("digits", ["model.name=resnet18", "data.size=128", "eval.batch=64", "schedule.warmup=[]"]),
    "yolov4-tiny-3l": ("yolov4-tiny-3l-shapes", []),  # its warmup kept: without it the box loss diverges at once
}
"""Case name -> (recipe, its settings); ``--batch``, ``--subdivisions`` and ``COMMON`` are added to each."""


def machine() -> str:
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (f"{platform.node()}: {os.cpu_count()} cores, {cpu}; Python {platform.python_version()}, "
            f"torch {torch.__version__}")


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def environment(threads: int, cache: Path, gpu: bool) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TORCHINDUCTOR_CACHE_DIR": str(cache),
           "PYTHONUNBUFFERED": "1", **({} if gpu else {"CUDA_VISIBLE_DEVICES": ""})}
    env.pop("WORLD_SIZE", None)
    return env


def train(recipe: str, settings: list[str], out: Path, env: dict[str, str]) -> dict:
    """One ``bigbatch train`` process: its first step, its losses and its wall time."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bigbatch", "train", recipe, "--out", str(out), "--set", *settings],
                          env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bigbatch train failed ({' '.join(settings)}):\n{done.stderr[-3000:]}")
    if "model.compile" in done.stderr:
        sys.exit(f"the compiled run fell back to eager:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "lr" in r]
    return {"first": steps[0]["t_step"], "losses": [r["loss"] for r in steps], "wall": wall}


def gap(losses: list[float], reference: list[float]) -> float:
    """The largest relative difference of two runs' losses, step by step."""
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


def interleaved(recipe: str, settings: list[str], modes: list[str], pairs: int, warmup: int) -> dict:
    """The steady state (the module docstring): {side: median seconds a step}, {mode: median ratio eager / mode}."""
    import torch

    from bigbatch.batching import make_plan
    from bigbatch.config import load_config
    from bigbatch.data.pipeline.loader import batches_by_step
    from bigbatch.data.pipeline.order import order_of
    from bigbatch.engine.events import EventStorage
    from bigbatch.engine.parts import build_parts
    from bigbatch.engine.preflight import resolve_batch
    from bigbatch.floor.distributed import Process
    from bigbatch.largebatch.optim import set_lr
    from bigbatch.tasks import build_task

    cfg, layout = resolve_batch(load_config(recipe, settings), 1)
    task = build_task(cfg, 0)
    plan = make_plan(cfg, layout, len(task.train_set))
    task.set_plan(plan)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    steps = {}
    for mode in ["false", *modes]:
        torch.manual_seed(cfg.seed)  # the same initial weights on every side
        side = load_config(recipe, [*settings, f"model.compile={mode}"])
        parts = build_parts(side, task, plan, Process(device=device), EventStorage())
        parts.model.train()
        steps[mode] = parts
    loader = batches_by_step(task.train_set, order_of(task.train_set, plan, cfg.seed, 1), 0, warmup + pairs, 0, 1,
                             plan.subdivisions_at, 0, task.sample_keys)
    batches = list(loader)

    def run(mode: str, step: int) -> float:
        parts = steps[mode]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        set_lr(parts.step.optimizer, parts.lr_at(step))
        parts.step(step, batches[step])
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    errors = gradient_errors(task, cfg, modes[0], batches[0][0], device)
    for step in range(warmup):  # each side compiles (the cache is warm) and settles
        for mode in steps:
            run(mode, step)
    seconds: dict[str, list[float]] = {mode: [] for mode in steps}
    ratios: dict[str, list[float]] = {mode: [] for mode in modes}
    for i in range(pairs):
        step = warmup + i
        order = list(steps) if i % 2 == 0 else list(reversed(steps))
        took = {mode: run(mode, step) for mode in order}
        for mode in steps:
            seconds[mode].append(took[mode])
        for mode in modes:
            ratios[mode].append(took["false"] / took[mode])
    return {"seconds": {m: statistics.median(s) for m, s in seconds.items()},
            "ratios": {m: (statistics.median(r), min(r), max(r)) for m, r in ratios.items()}, "gradients": errors}


def gradient_errors(task, cfg, mode: str, micro_batch, device) -> dict | None:
    """One micro-batch's gradient, eager and compiled (``mode``), each against the same computed in float64 from the
    same weights: per parameter |g - g64| / |g64| (norms), its median and largest over the parameters. Classifiers
    only (a detector's loss builds float32 targets of its own)."""
    import copy

    import torch

    from bigbatch.engine.compile import compile_model

    if not (isinstance(micro_batch, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in micro_batch)):
        return None
    torch.manual_seed(cfg.seed)
    eager = task.build_model(cfg).to(device).train()
    reference = copy.deepcopy(eager).double()
    compiled = copy.deepcopy(eager)
    compile_model(compiled, mode, device)
    data = [t.to(device) for t in micro_batch]
    wide = [t.double() if t.is_floating_point() else t for t in data]
    grads = {}
    for name, model, batch in (("eager", eager, data), ("compiled", compiled, data), ("float64", reference, wide)):
        task.loss(model, batch).backward()
        grads[name] = [p.grad.double() for p in model.parameters() if p.grad is not None]
    errors = {}
    for name in ("eager", "compiled"):
        each = [((g - r).norm() / r.norm()).item() for g, r in zip(grads[name], grads["float64"], strict=True)]
        errors[name] = (statistics.median(each), max(each))
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--rounds", type=int, default=1, help="rounds of compile-time runs (sides alternated)")
    parser.add_argument("--steps", type=int, default=8, help="steps of each compile-time run")
    parser.add_argument("--pairs", type=int, default=16, help="steady state: steps of each side, taking turns")
    parser.add_argument("--warmup", type=int, default=3, help="steady state: steps of each side before the pairs")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS")
    parser.add_argument("--images", type=int, default=400, help="images of the generated shapes set")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--subdivisions", type=int, default=1)
    parser.add_argument("--modes", default="default", help="model.compile modes compared with eager, comma-separated "
                        "(reduce-overhead: CUDA graphs on a GPU)")
    parser.add_argument("--gpu", action="store_true", help="let the runs see the CUDA devices (else the CPU)")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--interleaved", default=None, help=argparse.SUPPRESS)  # the steady state's own process
    args = parser.parse_args()
    modes = args.modes.split(",")
    if args.interleaved is not None:
        print(json.dumps(interleaved(CASES[args.interleaved][0], json.loads(os.environ["BENCH_SETTINGS"]), modes,
                                     args.pairs, args.warmup)))
        return
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bigbatch-compile-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"# {machine()}\n# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; before: {load()}", flush=True)
    print(f"# {' '.join(sys.argv)}", flush=True)
    shapes = work / "shapes"
    if "yolov4-tiny-3l" in args.cases and not shapes.exists():
        subprocess.run([sys.executable, "-m", "bigbatch", "data", "shapes", "--out", str(shapes), "--images",
                        str(args.images)], check=True, capture_output=True)
    for case in args.cases.split(","):
        recipe, settings = CASES[case]
        settings = [*settings, *COMMON, f"batch={args.batch}", f"subdivisions={args.subdivisions}",
                    *([f"data.path={shapes}"] if "shapes" in recipe else [])]
        for r in range(args.rounds):
            sides = [("eager", "false")]
            for mode in modes:  # the first run of a mode fills its new cache; the second finds it full
                sides += [(mode, mode), (f"{mode}+", mode)]
            order = sides if r % 2 == 0 else sides[1:] + sides[:1]
            got = {}
            for name, mode in order:
                cache = work / f"cache-{case}-{mode}"
                if not name.endswith("+"):
                    shutil.rmtree(cache, ignore_errors=True)
                got[name] = train(recipe, [*settings, f"steps={args.steps}", f"model.compile={mode}"],
                                  work / f"run-{case}", environment(args.threads, cache, args.gpu))
            eager = got["eager"]
            print(f"{case} compile time, round {r + 1} ({', '.join(n for n, _ in order)}):", flush=True)
            for name, _ in sides:
                side = got[name]
                extra = "" if name == "eager" else (f"  compile {side['first'] - eager['first']:6.1f} s  losses "
                                                    f"within {gap(side['losses'], eager['losses']):.1e}")
                print(f"  {name:16s} first step {side['first']:6.1f} s  process {side['wall']:6.1f} s{extra}",
                      flush=True)
        env = {**environment(args.threads, work / f"cache-{case}-{modes[0]}", args.gpu),
               "BENCH_SETTINGS": json.dumps(settings), "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        done = subprocess.run([sys.executable, __file__, "--interleaved", case, "--modes", args.modes, "--pairs",
                               str(args.pairs), "--warmup", str(args.warmup)], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"the steady-state run failed:\n{done.stderr[-3000:]}")
        steady = json.loads(done.stdout.strip().splitlines()[-1])
        eager = steady["seconds"]["false"]
        print(f"{case} steady state, {args.pairs} pairs of steps taking turns (load now: {load()}):", flush=True)
        print(f"  eager            {args.batch / eager:7.1f} img/s", flush=True)
        for mode in modes:
            median, low, high = steady["ratios"][mode]
            print(f"  {mode:16s} {args.batch / steady['seconds'][mode]:7.1f} img/s  x{median:.2f} eager's "
                  f"(pairs: {low:.2f}-{high:.2f})", flush=True)
        if steady["gradients"] is not None:
            shown = "; ".join(f"{name} median {m:.1e}, largest {x:.1e}" for name, (m, x) in steady["gradients"].items())
            print(f"  one micro-batch's gradients against float64's, per parameter: {shown}", flush=True)
    print(f"# after: {load()}", flush=True)


if __name__ == "__main__":
    main()
