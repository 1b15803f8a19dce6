"""Starting a run from another run (``model.weights``, ``model.mismatched: reinit``, ``model.freeze``), measured
against training from scratch over several seeds, for a classifier and a detector.

Classification (timm's ResNet-18 at 64 px, on folders of real JPEGs this script writes):

  source    the pretraining run: 4 classes, crops of 96-160 px from the top or bottom half of scikit-learn's
            china.jpg or flower.jpg (``batch_schedule.write_halves``; 1,600 training, 400 validation images),
            batch 64, ``--source-steps`` steps;
  target    3 other classes, by another rule: crops of 96-160 px from the left, middle or right third of
            china.jpg (columns 0-212, 213-425, 426-639; 600 training, 300 validation images): the source's
            classes split the photographs across, these along. ``--target hopper``: the top, middle or bottom
            third of another photograph, matplotlib's grace_hopper.jpg (rows 0-199, 200-399, 400-599). Batch 32,
            ``--target-steps`` steps, in three arms of one recipe:
              scratch    from timm's initialisation;
              finetune   from the source (``model.weights=SOURCE model.mismatched=reinit``: the 4-class head is
                         left at the new 3-class head's initialisation, every other tensor loads);
              frozen     the same with ``model.freeze=backbone``: only the head trains. Checked from the two
                         checkpoints (``torch.load(weights_only=True)``): every tensor outside the head (timm's
                         ``pretrained_cfg["classifier"]``), BatchNorm statistics included, is bit-identical to the
                         source's, and the head moved from where it started (the model rebuilt in this process as
                         ``bigbatch train`` builds it: its config.yaml, its seed, ``model.weights``).

  The recipe is ``benchmarks/batch_schedule.py``'s ResNet-18 one (SGD with momentum, LR 0.1 at batch 256 scaled
  linearly, standard preprocessing at 64 px, a linear warmup, then a cosine decay), the same in every arm.

Detection (the ``shapes-detect`` recipe: bigbatch's small FCOS detector on the generated shapes set):

  source    ``shapes-detect`` on classes A = circle, square, triangle (``data.classes``) of one generated set
            (``bigbatch data shapes --seed 1``), ``--detect-source-steps`` steps;
  target    classes B = star, cross of another generated set (``--seed 2``: other images), ``--detect-steps``
            steps, evaluated every ``--detect-every`` steps: scratch against ``model.weights=SOURCE
            model.mismatched=reinit`` (the 3-class logits layer keeps its 2-class initialisation). Reported: the
            first evaluated step at which each arm reaches scratch's final mAP@0.5.

Each seed trains every run again (``seed=S``: initialisation, data order, augmentation); the data are written once.

    python benchmarks/finetune.py [--seeds 0 1 2] [--parts classify detect] [--target china|hopper] [--threads 2]
        [--workdir DIR] [--source-steps 150] [--target-steps 60] [--detect-source-steps 800] [--detect-steps 400]
        [--detect-every 50] [--shapes-images 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from batch_schedule import write_crops, write_halves  # benchmarks/ is on sys.path

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))  # the bigbatch of this checkout, in this process as in the runs (PYTHONPATH)

RESNET = ["model.name=timm/resnet18", "data.name=folder", "data.size=64", "subdivisions=1", "optim.lr=0.1",
          "optim.ref_batch=256", "data.preprocessing=standard", "data.standard.scale=[0.25,1.0]",
          "eval.batch=100", "data.workers=1", "log.every=10"]
SOURCE = ["batch=64", "schedule.warmup=[{kind: linear, length: 25, start_factor: 0.1}]"]
TARGET = ["batch=32", "schedule.warmup=[{kind: linear, length: 5, start_factor: 0.1}]"]

CLASSES_A = ["circle", "square", "triangle"]
CLASSES_B = ["star", "cross"]
DETECT = ["log.every=50", "data.workers=1"]


def steps(count: int, every: int | None = None) -> list[str]:
    """A run of ``count`` steps evaluated every ``every`` (None: at its end), its checkpoint written at its end."""
    return [f"steps={count}", f"eval.every={every or count}", f"checkpoint.every={count}"]


def write_thirds(root: Path, photograph: str, train: int = 600, val: int = 300, seed: int = 0) -> Path:
    """An ImageFolder tree of real JPEGs, 3 classes: crops (96-160 px) from three thirds of a photograph:
    ``china``, the left, middle or right third (columns 0-212, 213-425, 426-639) of scikit-learn's china.jpg
    (427 x 640); ``hopper``, the top, middle or bottom third (rows 0-199, 200-399, 400-599) of matplotlib's
    grace_hopper.jpg (600 x 512)."""
    if photograph == "china":
        from sklearn.datasets import load_sample_image

        photo = load_sample_image("china.jpg")
        thirds = [(photo, (0, 427), (213 * k, 213 * (k + 1) + (k == 2))) for k in range(3)]
    else:
        from matplotlib import cbook
        from PIL import Image

        photo = np.asarray(Image.open(cbook.get_sample_data("grace_hopper.jpg", asfileobj=False)).convert("RGB"))
        thirds = [(photo, (200 * k, 200 * (k + 1)), (0, 512)) for k in range(3)]
    return write_crops(root, thirds, train, val, seed)


def bigbatch(words: list[str], threads: int) -> float:
    """``python -m bigbatch WORDS``; -> its wall time in seconds. A failure stops the benchmark with its output."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(CHECKOUT)}
    command = [sys.executable, "-m", "bigbatch", *words]
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def train(recipe: str, sets: list[str], out: Path, threads: int) -> dict:
    """One ``bigbatch train RECIPE --set ...`` into ``out``: its evaluations ``[(step, metrics)]``, its ``weights``
    event (what ``model.weights`` loaded) and its wall time."""
    seconds = bigbatch(["train", recipe, "--out", str(out), "--set", *sets], threads)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    evals = [(r["step"], r) for r in records if r.get("split") == "val"]
    weights = next((r for r in records if r.get("event") == "weights"), None)
    return {"evals": evals, "weights": weights, "seconds": seconds, "out": out}


def loaded(run: dict) -> str:
    """What ``model.weights`` loaded, from the run's ``weights`` event; "" for a run from scratch."""
    event = run["weights"]
    if event is None:
        return ""
    return f"  loaded {event['loaded']} of {event['total']}, reinitialised {', '.join(event['reinitialised'])}"


def model_tensors(run: Path) -> dict:
    """The model's tensors in a run's last checkpoint, read as ``model.weights`` reads them (its EMA weights where
    it kept an EMA, else its raw ones), with ``torch.load(weights_only=True)``."""
    import torch

    state = torch.load(run / "checkpoints" / "last.pt", map_location="cpu", weights_only=True)
    ema = state.get("ema")
    return ema["module"] if isinstance(ema, dict) and isinstance(ema.get("module"), dict) else state["model"]


def initial_tensors(run: Path) -> dict:
    """The model as the run started: rebuilt in this process as ``bigbatch train`` builds it (the run's
    config.yaml, ``seed_everything(seed)``, the task's model, ``model.weights`` loaded)."""
    from bigbatch.config.loading import load_config
    from bigbatch.engine.start_weights import start_weights
    from bigbatch.engine.trainer import seed_everything
    from bigbatch.tasks import build_task

    cfg = load_config(str(run / "config.yaml"))
    seed_everything(cfg.seed)
    task = build_task(cfg)
    model = task.build_model(cfg)
    start_weights(model, cfg)
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def frozen_check(source: Path, frozen: Path, head: str) -> dict:
    """Every tensor of ``frozen``'s checkpoint outside ``head`` against ``source``'s (bit for bit), and how far the
    head moved from its start."""
    import torch

    theirs, ours = model_tensors(source), model_tensors(frozen)
    in_head = [name for name in ours if name == head or name.startswith(head + ".")]
    outside = [name for name in ours if name not in in_head]
    differ = [name for name in outside if name not in theirs or not torch.equal(theirs[name], ours[name])]
    start = initial_tensors(frozen)
    rebuilt_differ = [name for name in outside if not torch.equal(start[name], theirs[name])]
    moved = {name: (ours[name].float() - start[name].float()).abs().max().item() for name in in_head}
    return {"outside": len(outside), "differ": differ, "head": in_head, "moved": moved,
            "rebuilt_differ": rebuilt_differ}


def classify(args: argparse.Namespace, work: Path) -> list[dict]:
    import timm

    halves = write_halves(work / "halves")
    thirds = write_thirds(work / f"thirds-{args.target}", args.target)
    head = timm.create_model("resnet18", pretrained=False, num_classes=3).pretrained_cfg["classifier"]
    rows = []
    for seed in args.seeds:
        sets = [*RESNET, *SOURCE, *steps(args.source_steps), f"data.path={halves}", f"seed={seed}"]
        source = train("digits", sets, work / f"cls-source-{seed}", args.threads)
        row = {"seed": seed, "source": source}
        print(f"classify  seed {seed}  source        top1 {source['evals'][-1][1]['top1']:6.2f}  "
              f"({source['seconds']:.0f} s)", flush=True)
        start = [f"model.weights={source['out']}", "model.mismatched=reinit"]
        for arm, extra in (("scratch", []), ("finetune", start), ("frozen", [*start, "model.freeze=backbone"])):
            sets = [*RESNET, *TARGET, *steps(args.target_steps), f"data.path={thirds}", f"seed={seed}", *extra]
            run = train("digits", sets, work / f"cls-{arm}-{seed}", args.threads)
            row[arm] = run
            print(f"classify  seed {seed}  {arm:12s}  top1 {run['evals'][-1][1]['top1']:6.2f}  ({run['seconds']:.0f} s)"
                  f"{loaded(run)}", flush=True)
        row["check"] = frozen_check(source["out"], row["frozen"]["out"], head)
        check = row["check"]
        print(f"classify  seed {seed}  frozen check: {check['outside'] - len(check['differ'])} of {check['outside']} "
              f"tensors outside {head!r} bit-identical to the source's (differ: {check['differ'] or 'none'}); head "
              f"moved by max |delta| {', '.join(f'{k} {v:.4g}' for k, v in check['moved'].items())} from its start "
              f"(rebuilt start: {len(check['rebuilt_differ'])} tensors outside the head differ from the source's)",
              flush=True)
        rows.append(row)
    return rows


def first_reaching(evals: list[tuple[int, dict]], target: float) -> int | None:
    return next((step for step, metrics in evals if metrics["mAP50"] >= target), None)


def detect(args: argparse.Namespace, work: Path) -> list[dict]:
    sets = {}
    for name, generator_seed in (("A", 1), ("B", 2)):
        sets[name] = work / f"shapes-{name}"
        bigbatch(["data", "shapes", "--out", str(sets[name]), "--images", str(args.shapes_images),
                  "--seed", str(generator_seed)], args.threads)
    classes_a, classes_b = f"data.classes=[{', '.join(CLASSES_A)}]", f"data.classes=[{', '.join(CLASSES_B)}]"
    rows = []
    for seed in args.seeds:
        source = train("shapes-detect", [*DETECT, f"data.path={sets['A']}", classes_a,
                                         *steps(args.detect_source_steps), f"seed={seed}"],
                       work / f"det-source-{seed}", args.threads)
        print(f"detect    seed {seed}  source (A)    mAP@0.5 {source['evals'][-1][1]['mAP50']:.4f}  "
              f"({source['seconds']:.0f} s)", flush=True)
        row = {"seed": seed, "source": source}
        target = [*DETECT, f"data.path={sets['B']}", classes_b, *steps(args.detect_steps, args.detect_every),
                  f"seed={seed}"]
        start = [f"model.weights={source['out']}", "model.mismatched=reinit"]
        for arm, extra in (("scratch", []), ("finetune", start)):
            run = train("shapes-detect", [*target, *extra], work / f"det-{arm}-{seed}", args.threads)
            row[arm] = run
            curve = " ".join(f"{m['mAP50']:.3f}" for _, m in run["evals"])
            print(f"detect    seed {seed}  {arm:12s}  mAP@0.5 every {args.detect_every} steps: {curve}  "
                  f"({run['seconds']:.0f} s){loaded(run)}", flush=True)
        goal = row["scratch"]["evals"][-1][1]["mAP50"]
        row["goal"] = goal
        row["reached"] = {arm: first_reaching(row[arm]["evals"], goal) for arm in ("scratch", "finetune")}
        print(f"detect    seed {seed}  scratch's final mAP@0.5 {goal:.4f} first reached at step: scratch "
              f"{row['reached']['scratch']}, finetune {row['reached']['finetune']}", flush=True)
        rows.append(row)
    return rows


def summary(args: argparse.Namespace, classified: list[dict], detected: list[dict]) -> None:
    if classified:
        print(f"\nclassification: top-1 (%) on the 300 target ({args.target}) validation images after "
              f"{args.target_steps} steps")
        print("| seed | source top-1 (4 classes) | scratch | finetune | frozen backbone | finetune > scratch | "
              "frozen: tensors outside the head bit-identical | head moved (max abs change) |")
        print("|---|---|---|---|---|---|---|---|")
        for row in classified:
            top = {arm: row[arm]["evals"][-1][1]["top1"] for arm in ("source", "scratch", "finetune", "frozen")}
            check = row["check"]
            identical = f"{check['outside'] - len(check['differ'])} of {check['outside']}"
            moved = ", ".join(f"{name} {value:.3g}" for name, value in check["moved"].items())
            print(f"| {row['seed']} | {top['source']:.2f} | {top['scratch']:.2f} | {top['finetune']:.2f} | "
                  f"{top['frozen']:.2f} | {'yes' if top['finetune'] > top['scratch'] else 'NO'} | {identical} | "
                  f"{moved} |")
        for arm in ("scratch", "finetune", "frozen"):
            tops = [row[arm]["evals"][-1][1]["top1"] for row in classified]
            spread = f" +- {statistics.stdev(tops):.2f}" if len(tops) > 1 else ""
            print(f"  {arm:8s} mean {statistics.mean(tops):.2f}{spread}")
    if detected:
        print(f"\ndetection: classes {', '.join(CLASSES_B)} after a source on {', '.join(CLASSES_A)}; mAP@0.5 on the "
              f"target's validation images, evaluated every {args.detect_every} steps of {args.detect_steps}")
        print("| seed | source mAP@0.5 (A) | scratch final mAP@0.5 | finetune final mAP@0.5 | "
              "first step at scratch's final: scratch | finetune | finetune in fewer steps |")
        print("|---|---|---|---|---|---|---|")
        for row in detected:
            reached = row["reached"]
            fewer = reached["finetune"] is not None and reached["finetune"] < reached["scratch"]
            print(f"| {row['seed']} | {row['source']['evals'][-1][1]['mAP50']:.4f} | {row['goal']:.4f} | "
                  f"{row['finetune']['evals'][-1][1]['mAP50']:.4f} | {reached['scratch']} | {reached['finetune']} | "
                  f"{'yes' if fewer else 'NO'} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--parts", nargs="+", default=["classify", "detect"], choices=["classify", "detect"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--target", choices=["china", "hopper"], default="china",
                        help="the classification target: thirds of china.jpg (the default) or of grace_hopper.jpg")
    parser.add_argument("--source-steps", type=int, default=150, help="the classification source's steps")
    parser.add_argument("--target-steps", type=int, default=60, help="each classification target arm's steps")
    parser.add_argument("--detect-source-steps", type=int, default=800, help="the detection source's steps")
    parser.add_argument("--detect-steps", type=int, default=400, help="each detection target arm's steps")
    parser.add_argument("--detect-every", type=int, default=50, help="steps between the detection targets' evaluations")
    parser.add_argument("--shapes-images", type=int, default=2000, help="images of each generated shapes set")
    parser.add_argument("--workdir", type=Path, default=None, help="a new or empty folder for the runs (kept)")
    args = parser.parse_args()
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir: {args.workdir} is not empty")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"{args.threads} torch threads; seeds {args.seeds}", flush=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        classified = classify(args, work) if "classify" in args.parts else []
        detected = detect(args, work) if "detect" in args.parts else []
        summary(args, classified, detected)
    print(f"\n{(time.perf_counter() - start) / 60:.1f} min in all", flush=True)


if __name__ == "__main__":
    main()
