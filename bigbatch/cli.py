"""The command line: ``bigbatch train | eval | show | ...``. Thin: parse the arguments and dispatch to a command.

A command checks its arguments, loads its config (``engine/preflight.py``) and calls the module that does the work
(the run directory's rules: ``engine/run_dir.py``; evaluating a checkpoint: ``engine/eval_checkpoint.py``; a model's
text for ``show``: its ``MODELS`` entry's ``describe``); what it prints is the only logic it keeps.
``tests/project/test_layout.py`` holds it to that: every function here is the parser, ``main``, a ``cmd_*`` command, an
``_add_*`` argument helper or an argparse ``type=``.

User mistakes print one ``error: ...`` line on stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import sys
import time
from pathlib import Path

from bigbatch import __version__
from bigbatch.errors import TrainingStopped, UserError

DEFAULT_RECIPE = "digits"
"""The recipe ``train`` runs without a CONFIG (and without ``--resume``)."""

MAX_PROFILED_STEPS = 100
"""``profile --steps`` at most: the profiler keeps every event of every profiled step in memory (a trace of 100 steps
of a ResNet-50 is already hundreds of MB, more than a trace viewer opens), and no more than the run's own length."""
BENCH_SET_MULTIPLE = 10
"""``data bench --images`` at most this many times the training set: a measurement past a few epochs only repeats."""
MAX_SCHEDULE_LINES = 10_000
"""``schedule --lines`` at most: the steps printed (the phase starts and the last step are printed as well)."""
MAX_SCHEDULE_ROWS = 10_000_000
"""``schedule --csv`` and ``--png`` refuse a run of more steps than this: every step is computed and held (a CSV of
10^7 rows is about 300 MB); the printed table samples any length."""


class Parser(argparse.ArgumentParser):
    """argparse, whose mistakes (an unknown option, ``--steps abc``) are one ``error:`` line and exit code 2, as
    every other mistake is, instead of the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"error: {self.prog}: {' '.join(message.split())} (see {self.prog} --help)\n")


def count(text: str) -> int:
    """A whole number from the command line: ``512``, ``1e4`` (a whole number in exponent form), at most 2^63 - 1."""
    try:
        value = int(text)
    except ValueError:
        try:
            number = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if not number.is_integer():
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        value = int(number)
    if not -(2**63) <= value < 2**63:
        raise argparse.ArgumentTypeError(f"{text!r} does not fit a 64-bit integer")
    return value


def _add_config_args(parser: argparse.ArgumentParser, config_default: str | None = "digits",
                     default_text: str = "%(default)s") -> None:
    from bigbatch.config import builtin_recipes

    parser.add_argument("config", nargs="?", default=config_default, metavar="CONFIG",
                        help=f"a YAML file, a Darknet .cfg, or a built-in recipe: {', '.join(builtin_recipes())} "
                        f"(default: {default_text})")
    _add_set_arg(parser)


def _add_set_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="override a config value by its dotted key, e.g. --set optim.lr=0.05 subdivisions=4")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bigbatch", description="Train vision models with very large batches.")
    parser.add_argument("--version", action="version", version=f"bigbatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model")
    _add_config_args(train, config_default=None, default_text="digits; with --resume, the run's own config")
    train.add_argument("--out", type=Path, help="run directory (default: runs/<recipe>-<timestamp>)")
    train.add_argument("--resume", type=Path, metavar="DIR",
                       help="continue the run in DIR from DIR/checkpoints/last.pt up to the configured steps")

    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on the validation set")
    evaluate.add_argument("checkpoint", type=Path, metavar="CHECKPOINT_OR_RUN_DIR",
                          help="a run directory (its checkpoints/last.pt), a checkpoint, or a model exported from a "
                               "run (.onnx, .torchscript, .xml), evaluated in its runtime")
    _add_set_arg(evaluate)
    evaluate.add_argument("--save-detections", type=Path, metavar="FILE.json",
                          help="detectors: also write the detections in the COCO results format")

    predict = sub.add_parser("predict", help="run a trained model on images, folders, lists and videos; write "
                             "predictions.jsonl (and COCO results, YOLO labels, drawn images)")
    predict.add_argument("sources", nargs="+", metavar="SOURCE", help="image or video files, folders, glob patterns "
                         "('imgs/**/*.jpg', quoted), or list files (one path a line, as Darknet's train.txt)")
    predict.add_argument("--from", dest="model", required=True, metavar="RUN|CHECKPOINT|NET.cfg",
                         help="a run directory (its last checkpoint), a checkpoint, or a Darknet .cfg with --weights")
    predict.add_argument("--out", type=Path, default=Path("predictions"), help="the folder to write: new, empty, or "
                         "an earlier predict's (its files replaced) (default: %(default)s)")
    predict.add_argument("--weights", metavar="W.weights", help="with a .cfg: its weights (Darknet .weights, .conv.N "
                         "or a state dict)")
    predict.add_argument("--names", metavar="FILE", help="with a .cfg: the class names (a .names file, or a .data "
                         "file's names=); default: the class numbers")
    predict.add_argument("--weights-from", choices=("ema", "raw"), help="a run's weights: the EMA's or the raw ones "
                         "(default: those eval uses)")
    predict.add_argument("--coco", type=Path, metavar="FILE.json", help="detectors: also write the detections as a "
                         "COCO results file (a new file)")
    predict.add_argument("--annotations", type=Path, metavar="A.json", help="with --coco: a COCO file of the same "
                         "images, whose image ids (by file name) and category ids (by name) the results take")
    predict.add_argument("--txt", action="store_true", help="detectors: write Darknet/YOLO label files (labels/)")
    predict.add_argument("--save-images", action="store_true", help="write each image drawn with its predictions "
                         "(images/)")
    predict.add_argument("--conf", type=number, help="detectors: the lowest score kept (default: 0.25)")
    predict.add_argument("--iou", type=number, help="detectors: the NMS IoU threshold (default: the model's own; "
                         "Darknet's 0.45)")
    predict.add_argument("--max-det", type=count, help="detectors: the most detections per image (default: the "
                         "model's own, as eval)")
    predict.add_argument("--top-k", type=count, help="classifiers: the classes listed per image (default: 5)")
    predict.add_argument("--size", type=count, help="with a .cfg: the network's input side (default: its [net])")
    predict.add_argument("--darknet-dialect", choices=("alexeyab", "pjreddie"), help="with a .cfg: whose detector "
                         "test to follow (default: alexeyab: resize unless letter_box=1, the cfg's NMS kind, conf "
                         "0.25; pjreddie: letterbox, IoU NMS, conf 0.5)")
    predict.add_argument("--batch", type=count, help="images per forward pass (default: the run's eval.batch; 1 "
                         "for a .cfg)")
    predict.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda where there is one)")
    predict.add_argument("--vid-stride", type=count, default=1, help="videos: every N-th frame (default: 1)")
    _add_set_arg(predict)

    data = sub.add_parser("data", help="datasets: generate the shapes detection set; convert between COCO and YOLO; "
                          "fit anchors; measure the input pipeline")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    shapes = data_sub.add_parser("shapes", help="write the generated shapes detection set (JPEG + COCO JSON)")
    shapes.add_argument("--out", type=Path, required=True,
                        help="the folder to write (train/, val/, annotations/): new, empty, or a set bigbatch "
                        "generated (replaced)")
    shapes.add_argument("--images", type=count, default=2000, help="images, train and val together "
                        "(default: %(default)s; 20%% go to val; at most 10,000,000)")
    shapes.add_argument("--seed", type=seed, default=0, help="the generator's seed (default: %(default)s)")
    shapes.add_argument("--format", choices=("coco", "yolo"), default="coco",
                        help="coco: JPEG + COCO JSON; yolo: the Darknet/YOLO layout as well (a label file beside "
                        "each image, train.txt, val.txt, shapes.names, shapes.data) (default: %(default)s)")
    data_bench = data_sub.add_parser("bench", help="measure the input pipeline alone (no model): images/s per "
                                     "number of DataLoader workers")
    _add_config_args(data_bench)
    data_bench.add_argument("--images", type=count, default=512,
                            help="images to read per measurement, after a first untimed step (default: %(default)s; "
                            f"at most {BENCH_SET_MULTIPLE} times the training set)")
    anchors = data_sub.add_parser("anchors", help="fit anchors to a set's boxes (Darknet's detector calc_anchors: "
                                  "k-means on 1 - IoU); print them and their average IoU, or write them into a .cfg")
    anchors.add_argument("data", type=Path, metavar="DATA", help="a COCO JSON file, a Darknet .data file (its train= "
                         "images) or a YOLO folder (as data shapes --format yolo writes it: its train/)")
    anchors.add_argument("--num", type=count, required=True, metavar="K", help="the number of anchors")
    anchors.add_argument("--size", metavar="WxH", help="the network's input, e.g. 416x416 (default: the --cfg's [net] "
                         "width and height)")
    anchors.add_argument("--cfg", type=Path, metavar="IN.cfg", help="with --out: a cfg whose [yolo] anchors, mask, "
                         "num and the filters before each are replaced")
    anchors.add_argument("--out", type=Path, metavar="OUT.cfg", help="with --cfg: the new cfg to write (a new file)")
    anchors.add_argument("--seed", type=seed, default=0, help="srand()'s seed for the first centres, as Darknet "
                         "started at that Unix time draws them (default: %(default)s)")
    anchors.add_argument("--tries", type=count, default=5, help="k-means runs, seeds S, S+1, ...: the best average "
                         "IoU kept (default: %(default)s; 1: one Darknet run)")

    convert = data_sub.add_parser("convert", help="write a detection set in the other format: COCO JSON to YOLO "
                                  "labels, or back")
    convert.add_argument("src", type=Path, metavar="SRC", help="a COCO folder (annotations/train.json, val.json, "
                         "train/, val/), a Darknet .data file (or its folder), or an Ultralytics folder (images/train, "
                         "images/val, labels/)")
    convert.add_argument("--to", choices=("coco", "yolo"), required=True, help="the format to write")
    convert.add_argument("--out", type=Path, required=True, help="the folder to write: new or empty")
    convert.add_argument("--layout", choices=("darknet", "ultralytics"), help="with --to yolo: Darknet's (a label "
                         "file beside each image; the default) or Ultralytics' (images/, labels/, data.yaml)")
    convert.add_argument("--copy", action="store_true", help="copy the images (default: hard links where possible, "
                         "else copies; never moved)")

    pack = sub.add_parser("pack", help="write an image folder (SRC/train/CLASS/*, SRC/val/CLASS/*) as tar shards "
                          "(WebDataset layout) with an index, for data.name: shards")
    pack.add_argument("src", type=Path, metavar="SRC", help="the image folder, ImageNet's layout")
    pack.add_argument("--out", type=Path, required=True, help="the folder to write: new or empty")
    pack.add_argument("--shard-size", default="256MB", metavar="SIZE",
                      help="the largest shard, e.g. 256MB, 1GiB (default: %(default)s)")
    pack.add_argument("--seed", type=seed, default=0, help="the seed of the training samples' shuffle (default: "
                      "%(default)s)")

    export = sub.add_parser("export", help="write a trained model as ONNX, TorchScript or OpenVINO (--format), each "
                            "checked in its runtime; or a Darknet network's weights as .weights and/or a checkpoint")
    export.add_argument("source", type=Path, metavar="SOURCE",
                        help="a run directory, a checkpoint, or a Darknet .cfg (a new network, or --weights)")
    export.add_argument("--darknet-weights", type=Path, metavar="OUT.weights", help="write Darknet's .weights format")
    export.add_argument("--checkpoint", type=Path, metavar="OUT.pt", help="write the network's weights for "
                        "model.weights")
    export.add_argument("--weights", type=Path, metavar="IN.weights", help="with a .cfg SOURCE: start from these "
                        "weights (Darknet .weights or a state dict): a conversion")
    export.add_argument("--upto", type=count, default=None, metavar="N",
                        help="write only the first N layers' weights (a backbone, as `darknet partial` writes)")
    export.add_argument("--seed", type=seed, default=0, help="with a .cfg SOURCE and no --weights: the seed of the "
                        "fresh network (default: %(default)s)")
    export.add_argument("--format", choices=("onnx", "torchscript", "openvino", "tensorrt"),
                        help="write the model for another runtime, checked in it first: onnx (onnxruntime), "
                        "torchscript, openvino (NAME.xml and NAME.bin); tensorrt is not written yet")
    export.add_argument("--out", type=Path, metavar="FILE", help="with --format: the file to write (*.onnx, "
                        "*.torchscript, *.xml; a new file)")
    export.add_argument("--names", type=Path, metavar="FILE", help="with --format and a .cfg: the class names (a "
                        ".names or .data file)")
    export.add_argument("--size", type=count, help="with --format and a .cfg: the input side (default: its [net])")
    export.add_argument("--dynamic-batch", action="store_true", help="with --format: a free batch dimension")
    export.add_argument("--opset", type=count, help="with --format onnx: the ONNX opset (default: 18)")
    export.add_argument("--postprocess", action="store_true", help="with --format and a Darknet detector: its box "
                        "decoding in the graph (a torchvision detector's graph always has its decoding and NMS)")
    export.add_argument("--half", action="store_true", help="with --format: fp16 weights (needs a CUDA device)")
    export.add_argument("--check", type=count, default=8, help="with --format: images the check runs (default: "
                        "%(default)s; 0: no check)")
    export.add_argument("--check-images", nargs="+", metavar="SOURCE", help="with --format: the images the check "
                        "runs (default: a run's validation images; random ones for a .cfg)")

    show = sub.add_parser("show", help="print the resolved config and the batch plan")
    _add_config_args(show)

    schedule = sub.add_parser("schedule", help="print, write and plot the learning rate per step")
    _add_config_args(schedule)
    schedule.add_argument("--csv", type=Path, help="write every step as CSV (step,lr); a run of at most "
                          f"{MAX_SCHEDULE_ROWS:,} steps")
    schedule.add_argument("--png", type=Path, help="plot the schedule to this PNG file; a run of at most "
                          f"{MAX_SCHEDULE_ROWS:,} steps")
    schedule.add_argument("--lines", type=count, default=40,
                          help=f"about how many steps to print (default: %(default)s; at most {MAX_SCHEDULE_LINES})")

    report = sub.add_parser("report", help="write one self-contained HTML report of one or more runs (charts of "
                            "loss, LR, metrics, memory, phases, update sizes, noise scale; runs overlaid)")
    report.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directories")
    report.add_argument("--out", type=Path, metavar="FILE.html", help="default: RUN/report.html for one run, "
                        "report.html here for several")

    profile = sub.add_parser("profile", help="profile training steps (torch.profiler): a Chrome trace and time by "
                             "operator kind")
    _add_config_args(profile)
    profile.add_argument("--steps", type=count, default=5, help="steps profiled, after one warm-up step (default: "
                         f"%(default)s; at most {MAX_PROFILED_STEPS} and the run's own length)")
    profile.add_argument("--out", type=Path, help="the folder for trace.json: new or empty (default: "
                         "runs/profile-<timestamp>)")

    plan = sub.add_parser("plan", help="measure memory per micro-batch and choose subdivisions")
    _add_config_args(plan)
    plan.add_argument("--memory-limit", metavar="SIZE",
                      help="the budget, e.g. 2GiB (default: memory.limit, else free memory less 10%%)")
    _add_advisor_args(plan)

    scale = sub.add_parser("scale", help="rescale a recipe to a new global batch")
    _add_config_args(scale)
    scale.add_argument("--batch", type=count, required=True, help="the new global batch")
    scale.add_argument("--out", type=Path, help="write the new recipe here (YAML); default: print it")
    return parser


def number(text: str) -> float:
    """A finite number from the command line (``inf``, ``nan`` and ``1e400`` refused)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def seed(text: str) -> int:
    """A seed from the command line: a whole number >= 0 (numpy's generators take no negative one)."""
    value = count(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def counts(text: str) -> list[int]:
    """A comma-separated list of whole numbers from the command line: ``1,2,4,8``."""
    return [count(part) for part in text.split(",") if part.strip()] or [count(text)]


def _add_advisor_args(plan: argparse.ArgumentParser) -> None:
    """``plan --devices``: which batch on how many devices, predicted from a short measurement (advisor/)."""
    plan.add_argument("--devices", type=counts, metavar="N,N,...", help="predict step time, steps and wall time "
                      "for these device counts (e.g. 1,2,4,8) from a short measurement on this device")
    plan.add_argument("--batches", type=counts, metavar="B,B,...", help="with --devices: the global batches "
                      "(default: the config's batch x1/4 to x4)")
    plan.add_argument("--link", default="nvlink", metavar="NAME|ALPHA_US,BETA_GBPS", help="with --devices: the "
                      "interconnect: nvlink, pcie, ib100, ib200, ib400, eth10, eth25, or latency in us and bandwidth "
                      "in GB/s (default: %(default)s)")
    plan.add_argument("--measure-steps", type=count, default=10, metavar="N", help="with --devices: training steps "
                      "measured, after one warm-up (default: %(default)s)")
    plan.add_argument("--from", dest="from_run", type=Path, metavar="RUN", help="with --devices and --target-loss: "
                      "a finished run whose steps to that loss give S_min")
    plan.add_argument("--target-loss", type=number, metavar="L", help="with --from: the loss (validation, else "
                      "training) the steps are counted to")
    plan.add_argument("--out", type=Path, metavar="RUN", help="with --devices: write RUN/advisor.json")
    plan.add_argument("--json", action="store_true", help="with --devices: print the table as JSON")
    plan.add_argument("--price", type=number, metavar="X", help="with --devices: the price of a device-hour (adds "
                      "device-hours and cost)")
    plan.add_argument("--no-pair", dest="pair", action="store_false", help="with --devices: no two-process "
                      "measurement of DDP's overlap, the wait and the BN sums (they are then assumed, with a wider "
                      "uncertainty)")


def cmd_train(args: argparse.Namespace) -> int:
    from bigbatch.engine.preflight import load_checked, resolve_batch
    from bigbatch.engine.relaunch import relaunch
    from bigbatch.engine.run_dir import (
        check_resumable,
        hold_run_dir,
        holds_this_run,
        interrupted_message,
        kept_run_files,
        run_name,
        timestamped,
    )
    from bigbatch.engine.step import Interrupted, terminate_as_interrupt
    from bigbatch.floor import distributed, run_files

    overrides = args.overrides
    if args.resume is not None:
        if args.out is not None and args.out != args.resume:
            raise UserError("--out: with --resume the run continues in the --resume directory; drop --out")
        out_dir = args.resume
        check_resumable(out_dir)
        source = args.config or str(out_dir / run_files.CONFIG)
        if args.config is None:  # the run's own config: with a Darknet run's cfg as it trained it
            overrides = [*kept_run_files(out_dir), *overrides]
    else:
        source = args.config or DEFAULT_RECIPE
    # Everything that can be checked is checked before any work: the config, the machine, the run directory.
    cfg = load_checked(source, overrides, run_dir=args.resume or args.out)
    world = distributed.world_size_from_env()
    if args.resume is None:
        out_dir = args.out or timestamped(run_name(cfg, overrides))
    held = hold_run_dir(out_dir) if distributed.rank_from_env() == 0 else contextlib.nullcontext()
    with held:
        resume = args.resume is not None or holds_this_run(out_dir, cfg)
        if resume:  # on another world size (a node lost or added), or with subdivisions: auto: the micro-batch kept
            cfg = relaunch(cfg, out_dir, world)
        # the boundary: subdivisions: auto measured, the batch checked; under torchrun the ranks join their group
        # here and settle one layout (rank 0 plans subdivisions: auto for all)
        cfg, layout = resolve_batch(cfg, world, join=True)

        from bigbatch.engine.trainer import train

        started = time.perf_counter()
        try:
            with terminate_as_interrupt(enabled=world == 1):  # kill, timeout, a scheduler's stop: as Ctrl-C
                result = train(cfg, out_dir, resume=resume, layout=layout)
        except Interrupted as stop:
            if distributed.rank_from_env() == 0:
                print(interrupted_message(stop, out_dir), file=sys.stderr, flush=True)
            return 128 + stop.signal
    if distributed.rank_from_env() != 0:
        return 0  # rank 0 reports
    minutes = (time.perf_counter() - started) / 60
    print(f"done: {result.steps} steps in {minutes:.1f} min; final:")
    print(result.report)
    if result.best.value is not None:
        from bigbatch.registry import TASKS

        text = TASKS.get(cfg.task).info.get("metric_text") or (lambda name, value: f"{value:.4g}")
        print(f"best {result.best.metric} {text(result.best.metric, result.best.value)} at step {result.best.step}")
    print(f"run written to {out_dir}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from bigbatch.engine.eval_checkpoint import evaluate_checkpoint
    from bigbatch.inference.loading import EXPORTED_SUFFIXES

    if args.checkpoint.suffix.lower() in EXPORTED_SUFFIXES:
        from bigbatch.inference.runtime import evaluate_exported

        evaluate_exported(args.checkpoint, args.overrides, args.save_detections)
        return 0
    evaluate_checkpoint(args.checkpoint, args.overrides, args.save_detections)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from bigbatch.inference.command import PredictArgs, predict

    fields = {key: value for key, value in vars(args).items() if key in PredictArgs.__dataclass_fields__}
    for line in predict(PredictArgs(**fields)):
        print(line)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from bigbatch.advisor.show import predicted_time
    from bigbatch.batching import layout_plan, make_plan
    from bigbatch.config import config_to_yaml, flatten
    from bigbatch.data.transforms.multiscale import describe as describe_multiscale
    from bigbatch.engine.preflight import load_checked, resolve_batch
    from bigbatch.floor import distributed
    from bigbatch.largebatch.schedule import build_schedule
    from bigbatch.registry import MODELS
    from bigbatch.tasks import counted_if_at_hand

    cfg = load_checked(args.config, args.overrides, reads_data=False, needs_length=False)
    cfg, layout = resolve_batch(cfg, distributed.world_size_from_env())
    has_length = cfg.steps is not None or cfg.epochs is not None
    if not has_length:  # a Darknet .cfg without max_batches (Darknet trains it until stopped): the layout only
        plan = layout_plan(layout)
    else:
        with counted_if_at_hand(cfg) as train_images:
            plan = make_plan(cfg, layout, train_images)
            build_schedule(cfg, plan)  # refuses what a run would (an LR step down at a batch milestone) first
    describe = MODELS.get(cfg.model.name).info.get("describe")
    model_text = describe(cfg) if describe is not None else None  # read (and checked) before anything is printed
    print(config_to_yaml(cfg).rstrip())
    print()
    if has_length:
        print(plan.describe())
        multiscale = describe_multiscale(cfg, plan.steps)
        if multiscale is not None:
            print(multiscale)
        predicted = predicted_time(args.config, plan)
        if predicted is not None:
            print(predicted)
    else:
        print("\n".join(plan.layout()))
        print("steps           not set: give steps (or epochs) to train, e.g. --set steps=1000")
    if model_text is not None:
        print()
        print(model_text)
    filled_in = cfg.filled_in()
    if filled_in:
        print()
        for key, source in filled_in.items():
            print(f"{key:<15} {flatten(cfg.model_dump(mode='json'))[key]}  (unset in the config: {source})")
    return 0


def cmd_schedule(args: argparse.Namespace) -> int:
    from bigbatch.batching import EPOCHS_UNKNOWN, make_plan
    from bigbatch.engine.preflight import load_checked, resolve_batch
    from bigbatch.floor import distributed
    from bigbatch.floor.outputs import check_output_file
    from bigbatch.largebatch.schedule import build_schedule, warmup_note
    from bigbatch.report.schedule_files import is_schedule_csv, is_schedule_png, plot_png, write_csv
    from bigbatch.tasks import counted_if_at_hand

    if not 1 <= args.lines <= MAX_SCHEDULE_LINES:
        raise UserError(f"--lines: expected 1 to {MAX_SCHEDULE_LINES} steps to print, got {args.lines}")
    if args.csv is not None and args.png is not None and args.csv.resolve() == args.png.resolve():  # links followed
        raise UserError(f"--png: {args.png} is also --csv; give the two files different paths")
    if args.csv is not None:
        check_output_file(args.csv, "--csv", ours=is_schedule_csv)
    if args.png is not None:
        check_output_file(args.png, "--png", ours=is_schedule_png)
    cfg = load_checked(args.config, args.overrides, reads_data=False)
    cfg, layout = resolve_batch(cfg, distributed.world_size_from_env())
    with counted_if_at_hand(cfg) as train_images:
        plan = make_plan(cfg, layout, train_images)
        lr_at = build_schedule(cfg, plan)
    note = warmup_note(cfg, plan)
    if note is not None:
        print(note)
    if plan.base is not None:  # AdaScale: the base recipe's schedule; the gain is measured during the run
        largest = plan.grow_to or plan.batch
        batch = (f"{plan.batch} = {plan.batch / plan.base:g} x {plan.base}" if plan.grow_to is None else
                 f"from {plan.base} growing to {largest}")
        print(f"adaptive batch {batch} (AdaScale): below, the base recipe's schedule at batch {plan.base}; each step "
              f"of the run takes r x the LR at its progress and advances r base steps, r measured (1 to the scale, "
              f"at most {largest / plan.base:g})")
        plan = plan.base_plan()
    for option, path in (("--csv", args.csv), ("--png", args.png)):
        if path is not None and plan.steps > MAX_SCHEDULE_ROWS:
            raise UserError(f"{option}: writes at most {MAX_SCHEDULE_ROWS} steps, and the run is {plan.steps} "
                            f"steps (steps); print the schedule without {option}")
    every = max(1, plan.steps // args.lines)
    shown = sorted({*range(0, plan.steps, every), plan.steps - 1,
                    *(phase.step for phase in plan.phases if phase.step < plan.steps)})
    scheduled = bool(plan.phases)
    largest = max(plan.batch_at(step) for step in {0, *shown})  # the batch changes only at a phase's start
    batch = f"global batch {plan.batch}" if not scheduled else f"global batch {plan.batch} to {largest}"
    print(f"{plan.steps} steps, {batch}; step counted from 0; every {every} shown")
    print(f"{'step':>10s}  {'epoch':>9s}  lr" + ("            batch" if scheduled else ""))
    if plan.train_images is None:
        print(f"(epochs unknown: {EPOCHS_UNKNOWN})")
    for step in shown:
        epoch = plan.epoch_at(step)
        lr = lr_at(step)
        print(f"{step:10d}  " + (f"{epoch:9.3f}" if epoch is not None else f"{'-':>9s}") + "  "
              + (f"{lr:<12.6g}  {plan.batch_at(step):5d}" if scheduled else f"{lr:.6g}"))
    if args.csv is None and args.png is None:
        return 0
    from array import array

    lrs = array("d", (lr_at(step) for step in range(plan.steps)))  # 8 bytes a step, at most MAX_SCHEDULE_ROWS
    batches = array("q", (plan.batch_at(step) for step in range(plan.steps))) if scheduled else None
    if args.csv is not None:
        write_csv(args.csv, lrs, batches)
        print(f"written to {args.csv}")
    if args.png is not None:
        title = f"batch {plan.batch}" if batches is None else f"batch {plan.batch} to {largest}"
        plot_png(args.png, lrs, f"{cfg.name}: {title}, {plan.steps} steps", batches)
        print(f"plotted to {args.png}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from bigbatch.config import parse_size
    from bigbatch.engine.planner import plan_layout
    from bigbatch.engine.preflight import load_checked
    from bigbatch.floor import distributed

    cfg = load_checked(args.config, args.overrides, run_dir=args.out)
    budget = None
    if args.memory_limit is not None:
        try:
            budget = parse_size(args.memory_limit)
        except ValueError as e:
            raise UserError(f"--memory-limit: {e}") from None
    if args.devices is not None:
        return cmd_plan_devices(args, cfg, budget)
    alone = [name for name, given in (("--batches", args.batches), ("--from", args.from_run), ("--out", args.out),
                                      ("--target-loss", args.target_loss), ("--json", args.json),
                                      ("--price", args.price), ("--link", args.link != "nvlink"),
                                      ("--measure-steps", args.measure_steps != 10),
                                      ("--no-pair", not args.pair)) if given not in (None, False)]
    if alone:
        raise UserError(f"{alone[0]}: goes with --devices (which batch on how many devices)")
    world = distributed.world_size_from_env()
    print(f"measuring a short run per micro-batch size at {cfg.data.size} px, {cfg.precision.dtype}, each in a fresh "
          "process: training steps beside the run's data, an evaluation batch and a checkpoint")
    plan = plan_layout(cfg, world, budget)
    print(plan.table())
    print(f"chosen: batch {cfg.batch} = world {world} x subdivisions {plan.subdivisions} x micro-batch "
          f"{plan.micro_batch}  (--set subdivisions={plan.subdivisions})")
    return 0


def cmd_plan_devices(args: argparse.Namespace, cfg, budget: int | None) -> int:
    import json

    from bigbatch.advisor.command import Options, plan_devices
    from bigbatch.advisor.links import parse_link
    from bigbatch.advisor.table import advice_json, format_advice

    options = Options(args.devices, args.batches, parse_link(args.link), args.measure_steps, args.from_run,
                      args.target_loss, args.price, args.out, budget, args.pair)
    advice, why = plan_devices(cfg, options, None if args.json else lambda text: print(text, flush=True))
    if args.json:
        print(json.dumps(advice_json(advice), indent=1))
    else:
        print(f"largest micro-batch: {why}")
        print(format_advice(advice))
        if args.out is not None:
            print(f"written to {args.out / 'advisor.json'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from bigbatch.report import write_report

    print(f"report written to {write_report(args.runs, args.out)}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from bigbatch.batching import total_steps
    from bigbatch.engine.preflight import load_checked, resolve_auto
    from bigbatch.engine.profile import make_trace_dir, profile
    from bigbatch.engine.run_dir import timestamped
    from bigbatch.tasks import train_set_size

    if not 1 <= args.steps <= MAX_PROFILED_STEPS:
        raise UserError(f"--steps: expected 1 to {MAX_PROFILED_STEPS} steps to profile, got {args.steps}")
    cfg = resolve_auto(load_checked(args.config, args.overrides), 1)  # profile runs one process
    length = total_steps(cfg, train_set_size(cfg))
    if args.steps > length:
        raise UserError(f"--steps: {args.steps} steps, but the run of {cfg.name} is {length} steps long")
    out: Path = args.out or timestamped("profile")
    make_trace_dir(out)
    print(f"profiling {args.steps} training step(s) of {cfg.name} after one warm-up step: {cfg.precision.dtype}, "
          f"batch {cfg.batch} in {cfg.subdivisions} micro-batch(es)")
    trace, table = profile(cfg, args.steps, out)
    print(table)
    print(f"trace written to {trace} (chrome://tracing or https://ui.perfetto.dev)")
    return 0


SCALE_MARK = b"by bigbatch scale"
"""In the first line of a recipe ``scale --out`` wrote (a label: what lets the next ``scale`` replace the file is
its record, ``floor/written.py``)."""


def cmd_scale(args: argparse.Namespace) -> int:
    from bigbatch.advisor.command import check_batch_fits
    from bigbatch.batching import batch_layout
    from bigbatch.config import config_to_yaml
    from bigbatch.engine.planner import with_auto_kept
    from bigbatch.engine.preflight import load_checked, resolve_batch
    from bigbatch.floor import distributed, written
    from bigbatch.floor.files import atomic_write
    from bigbatch.floor.outputs import check_output_file
    from bigbatch.largebatch.rescale import changes_table, rescale
    from bigbatch.telemetry.capacity import check_capacity

    if args.batch <= 0:
        raise UserError(f"--batch: expected a positive number of images, got {args.batch}")
    if args.out is not None:
        check_output_file(args.out, "--out", ours=written.is_ours,  # content proves nothing: its record does
                          what="bigbatch did not write it, or it changed since: remove it or choose another path")
    world = distributed.world_size_from_env()
    loaded = load_checked(args.config, args.overrides, reads_data=False, needs_length=False)
    check_batch_fits(loaded, args.batch, "--batch")  # bounded before the new layout is worked out
    cfg, _ = resolve_batch(loaded, world)
    new, changes = rescale(cfg, args.batch, world)
    batch_layout(new, world)  # the new recipe's layout, checked as its own run would check it
    check_capacity(new, world)  # and what could never fit this machine, as show and train refuse it
    kept = with_auto_kept(loaded, new)  # subdivisions: auto: the measured micro-batch checked the layout
    if kept is not new:  # and the recipe plans it where it trains: no number of this machine's is written
        new, changes = kept, [change for change in changes if change[0] != "subdivisions"]
    print(changes_table(changes))
    if args.out is not None:
        text = (f"# {cfg.name} rescaled from batch {cfg.batch} to {args.batch} {SCALE_MARK.decode()}\n"
                + config_to_yaml(new))
        atomic_write(args.out, lambda f: f.write(text), mode="w", record=True)
        print(f"written to {args.out}")
    else:
        print()
        print(config_to_yaml(new).rstrip())
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    if args.data_command == "bench":
        return cmd_data_bench(args)
    if args.data_command == "anchors":
        from bigbatch.darknet.anchors import anchors_command

        print("\n".join(anchors_command(args.data, args.num, args.size, args.cfg, args.out, args.seed,
                                         args.tries)))
        return 0
    if args.data_command == "convert":
        from bigbatch.darknet.convert import convert

        for line in convert(args.src, args.to, args.out, args.layout, args.copy):
            print(line)
        return 0
    from bigbatch.config.data_keys import MAX_SHAPES_IMAGES
    from bigbatch.data.formats.shapes import generate_shapes

    if args.images > MAX_SHAPES_IMAGES:
        raise UserError(f"--images: at most {MAX_SHAPES_IMAGES} images (about 80 GB), got {args.images}")
    counts = generate_shapes(args.out, args.images, args.seed, key="--out", yolo=args.format == "yolo")
    print(f"shapes set written to {args.out}: {counts['train_images']} train images ({counts['train_boxes']} boxes), "
          f"{counts['val_images']} val images ({counts['val_boxes']} boxes); classes {', '.join(counts['classes'])}")
    if args.format == "yolo":
        from bigbatch.config.loading import override_word

        path = override_word("data.path", str(args.out / "shapes.data"))
        print(f"YOLO layout: train with --set data.name=yolo {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.format is not None:
        from bigbatch.inference.export import CheckFailed, export_model

        if args.out is None or args.darknet_weights is not None or args.checkpoint is not None:
            raise UserError("--format: writes one file, --out FILE (not --darknet-weights or --checkpoint)")
        try:
            lines = export_model(args.source, args.format, args.out, args.weights, args.names, args.size,
                                 args.dynamic_batch, args.opset, args.check, args.check_images, args.postprocess,
                                 args.half)
        except CheckFailed as failed:
            print(f"error: {failed}", file=sys.stderr)
            return 1
        for line in lines:
            print(line)
        return 0
    given = [key for key, value in (("--out", args.out), ("--names", args.names), ("--size", args.size),
                                    ("--opset", args.opset), ("--check-images", args.check_images)) if value]
    flags = [key for key, value in (("--dynamic-batch", args.dynamic_batch), ("--postprocess", args.postprocess),
                                    ("--half", args.half)) if value]
    if given or flags:
        raise UserError(f"{(given + flags)[0]}: goes with --format onnx|torchscript|openvino")
    from bigbatch.darknet.export import export

    for line in export(args.source, args.darknet_weights, args.checkpoint, args.weights, args.seed, args.upto):
        print(line)
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from bigbatch.config import parse_size
    from bigbatch.data.formats.pack import pack

    try:
        shard_size = parse_size(args.shard_size)
    except ValueError as e:
        raise UserError(f"--shard-size: {e}") from None
    from bigbatch.config.loading import override_word

    counts = pack(args.src, args.out, shard_size, args.seed)
    for folder in counts["removed"]:
        print(f"removed {folder}, the unfinished output of a pack to {args.out} that was killed")
    train, val = counts["train"], counts["val"]
    print(f"shards written to {args.out}: {train['samples']} train images in {train['shards']} shards, "
          f"{val['samples']} val images in {val['shards']} shards, {counts['classes']} classes, "
          f"{counts['bytes'] / 1e6:.1f} MB; train with --set data.name=shards "
          f"{override_word('data.path', str(args.out))}")
    return 0


def cmd_data_bench(args: argparse.Namespace) -> int:
    import os

    from bigbatch.data.pipeline.bench import bench, table
    from bigbatch.engine.preflight import load_checked
    from bigbatch.tasks import build_task, train_set_size

    if args.images <= 0:
        raise UserError(f"--images: expected a positive number of images, got {args.images}")
    cfg = load_checked(args.config, args.overrides)
    most = BENCH_SET_MULTIPLE * train_set_size(cfg)
    if args.images > most:
        raise UserError(f"--images: {args.images} images a measurement, more than {BENCH_SET_MULTIPLE} times the "
                        f"training set ({most}); a measurement that long only repeats")
    task = build_task(cfg)
    print(f"input pipeline of {cfg.name}: data {cfg.data.name}, {len(task.train_set)} training images, "
          f"{args.images} images a measurement, {os.cpu_count()} cores")
    print(table(bench(cfg, task, args.images)))
    return 0


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "predict": cmd_predict, "show": cmd_show, "schedule": cmd_schedule,
            "scale": cmd_scale,
            "plan": cmd_plan, "data": cmd_data, "pack": cmd_pack,
            "export": cmd_export, "profile": cmd_profile, "report": cmd_report}


_STORAGE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
"""An ``OSError`` of these, naming its file, ends a command in one line (``floor/files.atomic_write`` names the file
it was writing), not a traceback."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = getattr(args, "config", None) or (DEFAULT_RECIPE if args.command == "train" else None)
        if config is not None and isinstance(getattr(args, "overrides", None), list) \
                and getattr(args, "resume", None) is None:  # said before torch loads: the file, its YAML, the
            from bigbatch.config.loading import check_keys, read_config  # overrides, an unknown key

            check_keys(read_config(config, args.overrides, getattr(args, "out", None)))
        return COMMANDS[args.command](args)
    except UserError as e:
        if os.environ.get("LOCAL_RANK", "0") == "0":  # under torchrun, once a machine: every rank finds a mistake
            print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingStopped as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the machine, not bigbatch or the input: a full disk, a quota, a read-only file system
        if e.errno not in _STORAGE_ERRORS or e.filename is None:
            raise
        print(f"error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:  # Ctrl-C; or SIGTERM while train sets up (engine.step.Terminated: its signal)
        print("interrupted", file=sys.stderr)
        return 128 + getattr(e, "signal", 2)
