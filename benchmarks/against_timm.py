"""bigbatch's classification training against timm's ``train.py`` on the same work, side by side.

Both sides train timm's ResNet-18 from scratch on the same folder of real JPEGs (crops of the two photographs
that ship with scikit-learn, 300-427 x 375-500 px, quality 90; 4 classes in an ImageFolder tree), at 128 px,
batch 256 as 8 micro-batches of 32, SGD with momentum, a cosine LR, no warmup, no label smoothing, the same
training preprocessing (RandomResizedCrop with scale 0.1-1 and ratio 3/4-4/3, bilinear; a flip with p 0.5; no
colour jitter; ImageNet normalisation), the same number of DataLoader workers and torch threads, evaluation on
the (small) val split after each epoch:

  timm      ``train.py --model resnet18 --img-size 128 -b 32 --grad-accum-steps 8 --scale 0.1 1
            --color-jitter 0 --train-interpolation bilinear --no-prefetcher --device cpu ...``
            (timm's defaults would add colour jitter 0.4 and a random interpolation);
  bigbatch  ``bigbatch train digits --set model.name=timm/resnet18 data.name=folder data.size=128 batch=256
            subdivisions=8 data.preprocessing=standard data.standard.scale=[0.1,1] ...``.

timm's ``train.py`` is not part of bigbatch: it is taken at run time from a copy of timm's repository
(``--timm-repo``: a git directory, bare or not, e.g. the one ``git clone`` makes), at the tag of the installed
timm when the repository has it (else at its HEAD, said so); the script runs with that commit's own ``timm``
package first on ``PYTHONPATH``, so script and library match. Without a repository the benchmark says so and
stops (exit code 0): nothing of timm's is fetched.

Each measurement is one whole command, as a user runs it: start-up, two epochs, evaluations, checkpoints.
images/s = training images / wall seconds. Rounds alternate which side goes first; the median is reported and
the ratio bigbatch / timm.

bigbatch keeps the host memory a step frees for the next micro-batch (``memory.keep_freed``: glibc's malloc
thresholds raised; docs/memory.md); timm's ``train.py`` runs with glibc's defaults, as its users run it.
``--timm-keep-freed`` gives timm's process the same malloc settings (``GLIBC_TUNABLES``), to show the ratio
without that difference.

``--peers timm timm-tuned`` measures two peers beside bigbatch, each a side of its own: ``timm`` as its users run
it, and ``timm-tuned``, timm at its best on this work: the same malloc settings as bigbatch (``GLIBC_TUNABLES``),
``--channels-last`` (bigbatch's layout for timm's models) and, with ``--compile MODE`` (which gives bigbatch
``model.compile=MODE``), ``--torchcompile``. For each peer the table gives bigbatch's images/s over the peer's and
the peer's whole-process wall time over bigbatch's (start-up, evaluations and checkpoints included, as a user
times the command; ``--images`` a multiple of 256 gives both sides the same number of training images).

``--fwd-bwd`` also times the model's forward and backward alone on 32 x 3 x 128 x 128 (the shapes of either
side's micro-batches), each in a fresh process, one with glibc's malloc as it is and contiguous tensors, one with
the kept-freed malloc settings and channels-last (what bigbatch and the tuned peer run with): no trainer with
that model and layout takes less per image, so the second over a side's images/s bounds what any trainer can
gain over that side.

``--floor`` adds a side that is a lower bound of any trainer's whole command: a fresh process that imports timm and
torch, builds the model (channels-last, the kept-freed malloc settings) and does the run's model work and nothing
else: the same training steps (8 forward and backward passes of 32 x 3 x 128 x 128 each, then an SGD step) and the
same evaluation forward passes, on tensors already in memory: no file read, no decode, no augmentation, no checkpoint,
no log. It starts and ends as bigbatch's command does: Python's garbage collector held back through its imports
(``bigbatch/floor/collector.py``), and no teardown of modules and objects at its exit
(``bigbatch/floor/process_exit.py``); the peers' ``train.py`` pays both. It runs in the rounds like the other sides.
Beside it, bigbatch's input pipeline alone (its training loader at 0 workers over the run's training images, in one
process) is timed once for its CPU seconds: whatever the workers, those seconds are spent on the same cores as the
model's, so bigbatch's whole command takes at least the floor's wall time plus the pipeline's CPU seconds over the
cores. The peers' wall times over that sum bound what bigbatch can reach against them. A looser bound assumes that the
pipeline could run in every core-second the floor leaves idle (its single-threaded imports', and whatever the model's
threads leave between their parallel regions): the floor's CPU seconds plus the pipeline's, over the cores, or the
floor's wall time where that is more. A third side, "fed floor", does the floor's model work on the batches of
bigbatch's own training loader at the run's workers (one loader for the whole run) and nothing else of a trainer (no
evaluation loader, checkpoint, log or telemetry): with workers, the cost of their decoding beside the model's threads
is in it as measured, not as the share of the cores the bounds above grant it. A peer's wall time over it is the most
bigbatch can reach against that peer with its input pipeline and this model as they are.

``--precision bf16`` trains in mixed precision on every side: bigbatch ``precision=bf16``, both peers ``--amp
--amp-dtype bfloat16`` (torch's autocast on the CPU), the floors under the same autocast.

    python benchmarks/against_timm.py --timm-repo DIR [--workers 0 1 2] [--rounds 2] [--threads 2]
        [--peers timm [timm-tuned]] [--compile MODE] [--precision fp32|bf16] [--images 1600] [--fwd-bwd] [--floor]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

SIZE, MICRO, ACCUM, LR, CLASSES = 128, 32, 8, 0.1, 4


def write_folder(root: Path, train: int, val: int, classes: int = CLASSES, seed: int = 0) -> Path:
    """An ImageFolder tree of real JPEGs: random crops of scikit-learn's two sample photographs."""
    from sklearn.datasets import load_sample_image

    rng = np.random.default_rng(seed)
    photos = [load_sample_image(name) for name in ("china.jpg", "flower.jpg")]
    for split, count in (("train", train), ("val", val)):
        for i in range(count):
            photo = photos[(i // classes) % 2]
            h, w = int(rng.integers(300, 428)), int(rng.integers(375, 501))
            top, left = int(rng.integers(0, 428 - h)), int(rng.integers(0, 641 - w))
            folder = root / split / f"class{i % classes}"
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(photo[top:top + h, left:left + w]).save(folder / f"{i:05d}.jpg", quality=90)
    return root


def timm_source(repo: Path, into: Path) -> tuple[Path, str]:
    """``train.py`` and ``timm/`` from ``repo`` at the installed timm's tag (else HEAD), extracted into ``into``."""
    import timm

    git = ["git", f"--git-dir={repo / '.git' if (repo / '.git').exists() else repo}"]
    tags = subprocess.run(git + ["tag", "--list", f"v{timm.__version__}"], capture_output=True, text=True,
                          check=True).stdout.split()
    rev = tags[0] if tags else "HEAD"
    commit = subprocess.run(git + ["rev-parse", "--short", rev], capture_output=True, text=True,
                            check=True).stdout.strip()
    archive = subprocess.run(git + ["archive", rev, "train.py", "timm"], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    version = re.search(r"__version__ = '([^']+)'", (into / "timm" / "version.py").read_text()).group(1)
    note = "" if tags else f" (the repository has no tag v{timm.__version__}, the installed version: its HEAD)"
    return into, f"timm's train.py at {rev} ({commit}, timm {version}){note}"


CHECKOUT = Path(__file__).resolve().parent.parent
"""The bigbatch measured: this checkout's (first on ``PYTHONPATH``, whatever the venv has installed)."""


def thread_env(threads: int, python_path: Path) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONPATH=str(python_path))


PY_SPY: list[str] = []
"""``--py-spy PATH``: each side's command runs under ``py-spy record`` (its main thread, waits included)."""

PHASES = (
    ("imports", ("_find_and_load (",)),
    ("evaluation", ("validate (train.py", "evaluate (bigbatch/", "(bigbatch/engine/evaluation")),
    ("checkpoint", ("save_checkpoint (", "(bigbatch/engine/checkpoint", "torch/serialization.py")),
    ("backward", ("_engine_run_backward (", "backward (torch/_tensor.py", "backward (torch/autograd/")),
    ("optimizer step", ("(torch/optim/",)),
    ("data", ("(torch/utils/data/", "(bigbatch/data/", "(timm/data/")),
    ("forward", ("_call_impl (torch/nn/modules/module.py",)),
)
"""A sampled stack's phase: the first whose frames one of these name (an import wherever it happens, then the
outermost phases first)."""


def profile_split(raw: Path) -> tuple[dict[str, float], list[tuple[float, str]]]:
    """Seconds of the main thread in each phase, from ``py-spy record --idle --threads --format raw`` at 100 Hz, and
    the five frames under which the most of the rest ("other") was sampled."""
    seconds: dict[str, float] = {}
    other: dict[str, float] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack.startswith("thread") or ": MainThread" not in stack.split(";", 1)[0]:
            continue
        phase = next((name for name, marks in PHASES if any(mark in stack for mark in marks)), "other")
        seconds[phase] = seconds.get(phase, 0.0) + int(count) / 100
        if phase == "other":
            frames = stack.split(";")
            own = [frame for frame in frames if "(train.py" in frame or "(bigbatch/" in frame or "(timm/" in frame]
            where = f"{own[-1] if own else frames[0]} > {frames[-1]}"  # the sides' own deepest frame, and the leaf
            other[where] = other.get(where, 0.0) + int(count) / 100
    return seconds, sorted(((value, where) for where, value in other.items()), reverse=True)[:5]


LAST_CPU_SECONDS = [0.0]
"""The CPU time of the last command ``timed`` ran, its DataLoader workers' included."""


def timed(command: list[str], env: dict[str, str], cwd: Path, log: Path) -> float:
    if PY_SPY:
        command = [*PY_SPY, "record", "--idle", "--threads", "--format", "raw", "--rate", "100", "--nonblocking",
                   "-o", str(log.with_name("profile.txt")), "--", *command]
    start, used = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    with log.open("w") as out:
        done = subprocess.run(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command and its waited-for children: its workers
    LAST_CPU_SECONDS[0] = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    if done.returncode != 0:
        sys.exit(f"{' '.join(command[:3])} ... failed (exit {done.returncode}); its output: {log}")
    return seconds


TIMM_WITHOUT_WORKERS = """
import runpy, sys, timm.data
create_loader = timm.data.create_loader
def without_persistent_workers(*args, **kwargs):
    kwargs.setdefault("persistent_workers", kwargs.get("num_workers", 1) > 0)
    return create_loader(*args, **kwargs)
timm.data.create_loader = without_persistent_workers
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""
"""timm's ``train.py`` cannot load in the training process (``--workers 0``): its loaders ask for persistent
workers, which torch refuses without workers. The script runs under this wrapper, which asks for them only
with workers; nothing else of timm's changes."""


KEEP_FREED_TUNABLES = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=1073741824"
"""glibc's environment form of what ``bigbatch/engine/host_memory.py`` sets with ``mallopt``."""


def run_timm(src: Path, data: Path, workers: int, threads: int, epochs: int, out: Path,
             extra: tuple[str, ...] = (), keep_freed: bool = False) -> tuple[float, int]:
    command = [sys.executable, "-c", TIMM_WITHOUT_WORKERS, str(src / "train.py"), "--data-dir", str(data),
               "--val-split", "val",
               "--model", "resnet18", "--num-classes", str(CLASSES), "--img-size", str(SIZE), "-b", str(MICRO),
               "--grad-accum-steps", str(ACCUM), "--epochs", str(epochs), "--lr", str(LR), "--sched", "cosine",
               "--warmup-epochs", "0", "--smoothing", "0", "--scale", "0.1", "1", "--color-jitter", "0",
               "--train-interpolation", "bilinear", "--device", "cpu", "--workers", str(workers),
               "--no-prefetcher", "--output", str(out), "--log-interval", "1000", "--seed", "0", *extra]
    env = thread_env(threads, src)
    if keep_freed:
        env["GLIBC_TUNABLES"] = KEEP_FREED_TUNABLES
    seconds = timed(command, env, out, out / "log.txt")
    train_images = sum(1 for _ in (data / "train").rglob("*.jpg"))
    return seconds, epochs * (train_images // MICRO) * MICRO  # timm's training loader drops the last partial batch


def bigbatch_sets(data: Path, workers: int, epochs: int, compile_mode: str = "false",
                  precision: str = "fp32") -> list[str]:
    """The ``--set`` overrides of bigbatch's side: the work above, on the ``digits`` recipe's other defaults."""
    return [f"data.path={data}", "data.name=folder", f"data.size={SIZE}", "model.name=timm/resnet18",
            f"batch={MICRO * ACCUM}", f"subdivisions={ACCUM}", f"epochs={epochs}", f"data.workers={workers}",
            f"optim.lr={LR}", f"optim.ref_batch={MICRO * ACCUM}", "schedule.warmup=[]", "data.preprocessing=standard",
            "data.standard.scale=[0.1,1.0]", "eval.every=1 epoch", "checkpoint.every=1 epoch", "eval.batch=32",
            f"model.compile={compile_mode}", f"precision={precision}"]


def run_bigbatch(data: Path, workers: int, threads: int, epochs: int, out: Path,
                 compile_mode: str = "false", precision: str = "fp32") -> tuple[float, int]:
    sets = bigbatch_sets(data, workers, epochs, compile_mode, precision)
    command = [sys.executable, "-m", "bigbatch", "train", "digits", "--out", str(out / "run"), "--set", *sets]
    seconds = timed(command, thread_env(threads, CHECKOUT), out, out / "log.txt")
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = max(r["step"] for r in records if r.get("kind", "train") == "train" and "step" in r)
    return seconds, steps * MICRO * ACCUM


FWD_BWD = """
import sys, time, timm, torch
threads, channels_last, steps = int(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
classes, micro, size = (int(v) for v in sys.argv[4:7])
bf16 = sys.argv[7] == "bf16"
torch.set_num_threads(threads)
torch.manual_seed(0)
model = timm.create_model("resnet18", num_classes=classes).train()
if channels_last:
    model = model.to(memory_format=torch.channels_last)
x, y = torch.randn(micro, 3, size, size), torch.randint(0, classes, (micro,))
def pass_():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
for _ in range(2):
    pass_()
start, cpu = time.perf_counter(), time.process_time()
for _ in range(steps):
    pass_()
wall = time.perf_counter() - start
print(steps * x.shape[0] / wall, (time.process_time() - cpu) / wall)
"""
"""timm's ResNet-18 forward + backward alone on one micro-batch's shapes, ``steps`` passes after 2 of warm-up: images/s
and the cores it kept busy (the process's CPU time over the wall time)."""


def fwd_bwd_rate(threads: int, tuned: bool, steps: int = 8, precision: str = "fp32") -> tuple[float, float]:
    """images/s of the forward + backward alone in a fresh process, and the cores it kept busy: glibc's malloc and
    contiguous tensors, or (``tuned``) the kept-freed malloc settings and channels-last, bigbatch's settings and the
    tuned peer's.

    With workers, the cores bound a trainer too: the model's CPU time (images / rate x cores) and the workers'
    decoding share the machine's cores, so no trainer's wall time is under their sum over the cores."""
    env = thread_env(threads, CHECKOUT)
    if tuned:
        env["GLIBC_TUNABLES"] = KEEP_FREED_TUNABLES
    done = subprocess.run([sys.executable, "-c", FWD_BWD, str(threads), "1" if tuned else "0", str(steps),
                           str(CLASSES), str(MICRO), str(SIZE), precision],
                          env=env, capture_output=True, text=True, check=True)
    rate, cores = (float(v) for v in done.stdout.split()[-2:])
    return rate, cores


FLOOR = """
import sys
from bigbatch.floor import collector
collector.hold()
import timm, torch
threads, steps, evals, val, classes, micro, accum, size = (int(v) for v in sys.argv[1:9])
bf16 = sys.argv[9] == "bf16"
torch.set_num_threads(threads)
torch.manual_seed(0)
model = timm.create_model("resnet18", num_classes=classes).to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(micro, 3, size, size).contiguous(memory_format=torch.channels_last)
y = torch.randint(0, classes, (micro,))
autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
collector.settle()
for epoch in range(evals):
    model.train()
    for step in range(steps // evals):
        for _ in range(accum):
            with autocast():
                loss = torch.nn.functional.cross_entropy(model(x), y) / accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad(), autocast():
        for start in range(0, val, micro):
            model(x[:min(micro, val - start)])
from bigbatch.floor.process_exit import exit_now
exit_now(0)
"""
"""The least of any trainer's whole command on this work (``--floor``): imports, the model, the training steps'
forward, backward and SGD update, and the evaluations' forward passes, on tensors already in memory; it starts and
ends as bigbatch's command does (``bigbatch/floor/collector.py``: no full collection through the imports, about 0.6 s;
``bigbatch/floor/process_exit.py``: without the interpreter's teardown, about 1 s), so that it stays under bigbatch's
time."""


def run_floor(threads: int, epochs: int, images: int, val: int, out: Path, precision: str) -> tuple[float, int]:
    steps = epochs * (images // (MICRO * ACCUM))
    env = thread_env(threads, CHECKOUT)
    env["GLIBC_TUNABLES"] = KEEP_FREED_TUNABLES
    command = [sys.executable, "-c", FLOOR, str(threads), str(steps), str(epochs), str(val), str(CLASSES),
               str(MICRO), str(ACCUM), str(SIZE), precision]
    return timed(command, env, out, out / "log.txt"), steps * MICRO * ACCUM


FED_FLOOR = """
import sys
from bigbatch.floor import collector
collector.hold()
import timm, torch
from bigbatch.data.pipeline.loader import batches_by_step
from bigbatch.data.pipeline.order import order_of
from bigbatch.engine.preflight import load_checked
from bigbatch.tasks import build_task
threads, steps, evals, val = (int(v) for v in sys.argv[1:5])
bf16 = sys.argv[5] == "bf16"
cfg = load_checked("digits", sys.argv[6:])
torch.set_num_threads(threads)
torch.manual_seed(0)
task = build_task(cfg)
model = timm.create_model("resnet18", num_classes=task.num_classes).to(memory_format=torch.channels_last)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
held = torch.randn(cfg.eval.batch, 3, cfg.data.size, cfg.data.size).contiguous(memory_format=torch.channels_last)
autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16)
order = order_of(task.train_set, cfg.batch, cfg.seed, 1)
stream = batches_by_step(task.train_set, order, 0, steps, 0, 1, cfg.subdivisions, cfg.data.workers, task.sample_keys)
collector.settle()
for step, micro_batches in enumerate(stream, start=1):
    model.train()
    for images, labels, _ in micro_batches:
        with autocast():
            loss = torch.nn.functional.cross_entropy(
                model(images.contiguous(memory_format=torch.channels_last)), labels) / len(micro_batches)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if step % (steps // evals) == 0:
        model.eval()
        with torch.no_grad(), autocast():
            for start in range(0, val, cfg.eval.batch):
                model(held[:min(cfg.eval.batch, val - start)])
from bigbatch.floor.process_exit import exit_now
exit_now(0)
"""
"""The floor fed by bigbatch's input pipeline (``--floor``, at each worker count): the floor's model work on the
batches of bigbatch's own training loader at the run's workers (one loader for the whole run), and nothing else of a
trainer: no evaluation loader, checkpoint, log or telemetry. It starts and ends as the floor does."""


def run_fed_floor(data: Path, workers: int, threads: int, epochs: int, images: int, val: int, out: Path,
                  precision: str) -> tuple[float, int]:
    steps = epochs * (images // (MICRO * ACCUM))
    env = thread_env(threads, CHECKOUT)
    env["GLIBC_TUNABLES"] = KEEP_FREED_TUNABLES
    command = [sys.executable, "-c", FED_FLOOR, str(threads), str(steps), str(epochs), str(val), precision,
               *bigbatch_sets(data, workers, epochs)]
    return timed(command, env, out, out / "log.txt"), steps * MICRO * ACCUM


PIPELINE = """
import math, sys, time
from bigbatch.data.pipeline.bench import images_in
from bigbatch.data.pipeline.loader import batches_by_step
from bigbatch.data.pipeline.order import order_of
from bigbatch.engine.preflight import load_checked
from bigbatch.tasks import build_task
images = int(sys.argv[1])
cfg = load_checked("digits", sys.argv[2:])
task = build_task(cfg)
order = order_of(task.train_set, cfg.batch, cfg.seed, 1)
steps = 1 + math.ceil(images / cfg.batch)
stream = batches_by_step(task.train_set, order, 0, steps, 0, 1, cfg.subdivisions, 0, task.sample_keys)
next(stream)
start, cpu, read = time.perf_counter(), time.process_time(), 0
for micro_batches in stream:
    read += images_in(micro_batches)
print(read, time.perf_counter() - start, time.process_time() - cpu)
"""
"""bigbatch's training loader alone at 0 workers (its batches decoded by the training process's threads), as ``bigbatch
data bench`` reads it, after one untimed step: images read, wall seconds and CPU seconds."""


def pipeline_cpu(data: Path, threads: int, images: int) -> tuple[float, float]:
    """bigbatch's input pipeline alone over ``images`` training images: wall and CPU seconds, scaled to ``images``."""
    done = subprocess.run([sys.executable, "-c", PIPELINE, str(images), *bigbatch_sets(data, 0, 1)],
                          env=thread_env(threads, CHECKOUT), capture_output=True, text=True, check=True)
    read, wall, cpu = (float(v) for v in done.stdout.split()[-3:])
    return wall * images / read, cpu * images / read


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timm-repo", type=Path, default=os.environ.get("TIMM_REPO"),
                        help="a git directory of timm's repository (huggingface/pytorch-image-models); env TIMM_REPO")
    parser.add_argument("--images", type=int, default=1600, help="training JPEGs")
    parser.add_argument("--val", type=int, default=64, help="validation JPEGs")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--peers", nargs="+", choices=["timm", "timm-tuned"], default=["timm"],
                        help="timm as its users run it, and/or timm at its best (malloc settings, channels-last, "
                             "--torchcompile with --compile)")
    parser.add_argument("--compile", default="false", choices=["false", "default", "max-autotune"],
                        help="bigbatch's model.compile, and --torchcompile for the tuned peer when not false")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                        help="bf16: every side in mixed precision (bigbatch precision=bf16, the peers --amp "
                             "--amp-dtype bfloat16)")
    parser.add_argument("--fwd-bwd", action="store_true", help="also time the model's forward and backward alone")
    parser.add_argument("--floor", action="store_true",
                        help="add the whole-command lower bound as a side (the model's work alone, in a fresh process) "
                             "and time bigbatch's input pipeline alone")
    parser.add_argument("--py-spy", type=Path, help="profile each side's command with this py-spy (slower: for "
                        "where the time goes, not for the ratios)")
    parser.add_argument("--timm-channels-last", action="store_true",
                        help="give the 'timm' peer --channels-last (bigbatch's default layout for timm's models)")
    parser.add_argument("--timm-keep-freed", action="store_true",
                        help="give the 'timm' peer the malloc thresholds bigbatch sets (memory.keep_freed)")
    args = parser.parse_args()
    if args.timm_repo is None or not args.timm_repo.exists():
        print("skipped: no copy of timm's repository (--timm-repo DIR or TIMM_REPO): its train.py is the peer, "
              "and it is not fetched by this script")
        return
    import timm
    import torch

    if args.py_spy:
        PY_SPY.append(str(args.py_spy))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "timm-src").mkdir()
        src, described = timm_source(args.timm_repo, tmp / "timm-src")
        data = write_folder(tmp / "folder", args.images, args.val)
        amp = ("--amp", "--amp-dtype", "bfloat16") if args.precision == "bf16" else ()
        plain = (("--channels-last",) if args.timm_channels_last else ()) + amp
        tuned = ("--channels-last",) + (() if args.compile == "false" else ("--torchcompile", "inductor")) + amp
        peers = {"timm": (plain, args.timm_keep_freed), "timm-tuned": (tuned, True)}
        peers = {name: peers[name] for name in args.peers}
        for name, (extra, kept) in peers.items():
            print(f"peer {name}: {described} {' '.join(extra)}"
                  f"{' with malloc keeping freed memory' if kept else ''}", flush=True)
        print(f"machine: {platform.machine()}, {os.cpu_count()} cores; torch {torch.__version__}, installed timm "
              f"{timm.__version__}; bigbatch model.compile={args.compile}; precision {args.precision}; "
              f"{args.images} training JPEGs, "
              f"{args.epochs} epochs, {args.threads} torch threads on both sides, {args.rounds} rounds", flush=True)
        sides = {name: (lambda w, out, extra=extra, kept=kept:
                        run_timm(src, data, w, args.threads, args.epochs, out, extra, kept))
                 for name, (extra, kept) in peers.items()}
        sides["bigbatch"] = lambda w, out: run_bigbatch(data, w, args.threads, args.epochs, out, args.compile,
                                                        args.precision)
        train_images = args.epochs * (args.images // (MICRO * ACCUM)) * MICRO * ACCUM
        if args.floor:
            sides["floor"] = lambda w, out: run_floor(args.threads, args.epochs, args.images, args.val, out,
                                                      args.precision)
            sides["fed floor"] = lambda w, out: run_fed_floor(data, w, args.threads, args.epochs, args.images,
                                                              args.val, out, args.precision)
            pipeline = [pipeline_cpu(data, args.threads, train_images) for _ in range(3)]
            pipeline_seconds = statistics.median(cpu for _, cpu in pipeline)
            print(f"bigbatch's input pipeline alone over {train_images} training images, 0 workers (3 runs): CPU "
                  f"{', '.join(f'{cpu:.1f}' for _, cpu in pipeline)} s, wall "
                  f"{', '.join(f'{wall:.1f}' for wall, _ in pipeline)} s", flush=True)
        for workers in args.workers:
            rates: dict[str, list[float]] = {name: [] for name in sides}
            walls: dict[str, list[float]] = {name: [] for name in sides}
            cpus: dict[str, list[float]] = {name: [] for name in sides}
            for r in range(args.rounds):
                for name in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                    out = tmp / f"{name}-w{workers}-r{r}"
                    out.mkdir()
                    before = load()
                    seconds, images = sides[name](workers, out)
                    rates[name].append(images / seconds)
                    walls[name].append(seconds)
                    cpus[name].append(LAST_CPU_SECONDS[0])
                    print(f"  workers {workers} round {r} {name}: {images} images in {seconds:.1f} s, "
                          f"{images / seconds:.1f} img/s"
                          f"{'' if PY_SPY else f', {LAST_CPU_SECONDS[0] / seconds:.2f} cores busy'} "
                          f"(load before {before}, after {load()})", flush=True)  # py-spy: its own CPU, not the side's
                    if PY_SPY:
                        split, other = profile_split(out / "profile.txt")
                        print("    main thread, s: " + ", ".join(f"{phase} {value:.1f}" for phase, value in
                                                               sorted(split.items(), key=lambda kv: -kv[1])),
                              flush=True)
                        print("    of the other: " + "; ".join(f"{value:.1f} s {where}" for value, where in other),
                              flush=True)
            print(f"workers {workers}: " + ", ".join(
                f"{name} {statistics.median(rates[name]):.1f} img/s {statistics.median(walls[name]):.1f} s"
                for name in sides), flush=True)
            if args.floor:
                bound = [floor + pipeline_seconds / args.threads for floor in walls["floor"]]
                print(f"workers {workers}: bigbatch takes at least the floor plus its pipeline's CPU over "
                      f"{args.threads} cores, {statistics.median(bound):.1f} s (rounds "
                      f"{', '.join(f'{v:.1f}' for v in bound)}); against it bigbatch is at "
                      f"{statistics.median(walls['bigbatch']) / statistics.median(bound):.2f}x", flush=True)
                # The same, had the pipeline used every core-second the floor left idle (its imports' one thread
                # included): no trainer's wall time is under its CPU seconds over the cores, nor under the floor's.
                packed = [max(floor, (cpu + pipeline_seconds) / args.threads)
                          for floor, cpu in zip(walls["floor"], cpus["floor"], strict=True)]
                print(f"workers {workers}: with the pipeline packed into the floor's idle cores, at least "
                      f"{statistics.median(packed):.1f} s (rounds {', '.join(f'{v:.1f}' for v in packed)})", flush=True)
                fed = walls["fed floor"]
                print(f"workers {workers}: the floor fed by bigbatch's pipeline at {workers} workers takes "
                      f"{statistics.median(fed):.1f} s; against it bigbatch is at "
                      f"{statistics.median(walls['bigbatch']) / statistics.median(fed):.2f}x", flush=True)
                for peer in peers:
                    most_fed = [t / f for f, t in zip(fed, walls[peer], strict=True)]
                    print(f"workers {workers}: with bigbatch's pipeline, the most bigbatch can reach against {peer}: "
                          f"{statistics.median(walls[peer]) / statistics.median(fed):.2f}x "
                          f"(rounds {', '.join(f'{v:.2f}' for v in most_fed)})", flush=True)
                for peer in peers:
                    most = [t / b for b, t in zip(bound, walls[peer], strict=True)]
                    most_packed = [t / b for b, t in zip(packed, walls[peer], strict=True)]
                    print(f"workers {workers}: the most bigbatch can reach against {peer}: "
                          f"{statistics.median(walls[peer]) / statistics.median(bound):.2f}x "
                          f"(rounds {', '.join(f'{v:.2f}' for v in most)}); packed "
                          f"{statistics.median(walls[peer]) / statistics.median(packed):.2f}x "
                          f"(rounds {', '.join(f'{v:.2f}' for v in most_packed)})", flush=True)
            for peer in peers:
                ratio = statistics.median(rates["bigbatch"]) / statistics.median(rates[peer])
                speed = [b / t for b, t in zip(rates["bigbatch"], rates[peer], strict=True)]
                wall = [t / b for b, t in zip(walls["bigbatch"], walls[peer], strict=True)]
                print(f"workers {workers}: bigbatch / {peer}: images/s {ratio:.2f} "
                      f"(rounds {', '.join(f'{v:.2f}' for v in speed)}); wall time {peer} / bigbatch "
                      f"{statistics.median(walls[peer]) / statistics.median(walls['bigbatch']):.2f} "
                      f"(rounds {', '.join(f'{v:.2f}' for v in wall)})", flush=True)
        if args.fwd_bwd:
            floors: dict[str, list[tuple[float, float]]] = {"glibc, contiguous": [], "kept-freed, channels-last": []}
            for _ in range(3):
                for name in floors:
                    floors[name].append(fwd_bwd_rate(args.threads, name.startswith("kept"),
                                                     precision=args.precision))
            print("forward + backward alone, a fresh process each (median of 3): " + ", ".join(
                f"{name} {statistics.median(r for r, _ in values):.1f} img/s "
                f"({', '.join(f'{r:.1f} on {c:.2f} cores' for r, c in values)})"
                for name, values in floors.items()), flush=True)


if __name__ == "__main__":
    main()
