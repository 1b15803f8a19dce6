"""The command line: ``bigbatch train | eval | show``. Thin: parse, load the config, call in.

User mistakes print one ``error: ...`` line on stderr and exit with code 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

from bigbatch import __version__
from bigbatch.config import RunConfig
from bigbatch.errors import UserError

MAX_PROFILED_STEPS = 100
"""``profile --steps`` at most: the profiler keeps every event of every profiled step in memory (a trace of 100 steps
of a ResNet-50 is already hundreds of MB, more than a trace viewer opens), and no more than the run's own length."""
BENCH_SET_MULTIPLE = 10
"""``data bench --images`` at most this many times the training set: a measurement past a few epochs only repeats."""


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


def _add_config_args(parser: argparse.ArgumentParser, config_default: str | None = "digits") -> None:
    parser.add_argument("config", nargs="?", default=config_default,
                        help="a YAML file or a built-in recipe name (default: %(default)s)")
    _add_set_arg(parser)


def _add_set_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="override a config value by its dotted key, e.g. --set optim.lr=0.05 subdivisions=4")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="bigbatch", description="Train vision models with very large batches.")
    parser.add_argument("--version", action="version", version=f"bigbatch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a model")
    _add_config_args(train, config_default=None)
    train.add_argument("--out", type=Path, help="run directory (default: runs/<recipe>-<timestamp>)")
    train.add_argument("--resume", type=Path, metavar="DIR",
                       help="continue the run in DIR from DIR/checkpoints/last.pt up to the configured steps")

    evaluate = sub.add_parser("eval", help="evaluate a checkpoint on the validation set")
    evaluate.add_argument("checkpoint", type=Path, metavar="CHECKPOINT_OR_RUN_DIR")
    _add_set_arg(evaluate)
    evaluate.add_argument("--save-detections", type=Path, metavar="FILE.json",
                          help="detectors: also write the detections in the COCO results format")

    data = sub.add_parser("data", help="datasets: generate the shapes detection set; measure the input pipeline")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    shapes = data_sub.add_parser("shapes", help="write the generated shapes detection set (JPEG + COCO JSON)")
    shapes.add_argument("--out", type=Path, required=True,
                        help="the folder to write (train/, val/, annotations/): new, empty, or a set bigbatch "
                        "generated (replaced)")
    shapes.add_argument("--images", type=count, default=2000, help="images, train and val together "
                        "(default: %(default)s; 20%% go to val)")
    shapes.add_argument("--seed", type=count, default=0, help="the generator's seed (default: %(default)s)")
    shapes.add_argument("--format", choices=("coco", "yolo"), default="coco",
                        help="coco: JPEG + COCO JSON; yolo: the Darknet/YOLO layout as well (a label file beside "
                        "each image, train.txt, val.txt, shapes.names, shapes.data) (default: %(default)s)")
    data_bench = data_sub.add_parser("bench", help="measure the input pipeline alone (no model): images/s per "
                                     "number of DataLoader workers")
    _add_config_args(data_bench)
    data_bench.add_argument("--images", type=count, default=512,
                            help="images to read per measurement, after a first untimed step (default: %(default)s; "
                            f"at most {BENCH_SET_MULTIPLE} times the training set)")

    pack = sub.add_parser("pack", help="write an image folder (SRC/train/CLASS/*, SRC/val/CLASS/*) as tar shards "
                          "(WebDataset layout) with an index, for data.name: shards")
    pack.add_argument("src", type=Path, metavar="SRC", help="the image folder, ImageNet's layout")
    pack.add_argument("--out", type=Path, required=True, help="the folder to write: new or empty")
    pack.add_argument("--shard-size", default="256MB", metavar="SIZE",
                      help="the largest shard, e.g. 256MB, 1GiB (default: %(default)s)")
    pack.add_argument("--seed", type=count, default=0, help="the seed of the training samples' shuffle (default: "
                      "%(default)s)")

    export = sub.add_parser("export", help="write a Darknet network's weights (from a run, a checkpoint or a .cfg) as "
                            "Darknet .weights and/or a checkpoint")
    export.add_argument("source", type=Path, metavar="SOURCE",
                        help="a run directory, a checkpoint, or a Darknet .cfg (a new network, or --weights)")
    export.add_argument("--darknet-weights", type=Path, metavar="OUT.weights", help="write Darknet's .weights format")
    export.add_argument("--checkpoint", type=Path, metavar="OUT.pt", help="write the network's weights for "
                        "model.weights")
    export.add_argument("--weights", type=Path, metavar="IN.weights", help="with a .cfg SOURCE: start from these "
                        "weights (Darknet .weights or a state dict): a conversion")
    export.add_argument("--seed", type=count, default=0, help="with a .cfg SOURCE and no --weights: the seed of the "
                        "fresh network (default: %(default)s)")

    show = sub.add_parser("show", help="print the resolved config and the batch plan")
    _add_config_args(show)

    schedule = sub.add_parser("schedule", help="print, write and plot the learning rate per step")
    _add_config_args(schedule)
    schedule.add_argument("--csv", type=Path, help="write every step as CSV (step,lr)")
    schedule.add_argument("--png", type=Path, help="plot the schedule to this PNG file")
    schedule.add_argument("--lines", type=count, default=40,
                          help="about how many steps to print (default: %(default)s)")

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

    scale = sub.add_parser("scale", help="rescale a recipe to a new global batch")
    _add_config_args(scale)
    scale.add_argument("--batch", type=count, required=True, help="the new global batch")
    scale.add_argument("--out", type=Path, help="write the new recipe here (YAML); default: print it")
    return parser


def cmd_train(args: argparse.Namespace) -> int:
    from bigbatch.batching import check_batch
    from bigbatch.engine import distributed
    from bigbatch.engine.run_dir import hold_run_dir, holder

    if args.resume is not None:
        if args.out is not None and args.out != args.resume:
            raise UserError("--out: with --resume the run continues in the --resume directory; drop --out")
        out_dir = args.resume
        if not out_dir.is_dir():
            raise UserError(f"--resume: {out_dir} is not a folder (expected the run directory of bigbatch train)")
        held_by = holder(out_dir) if distributed.rank_from_env() == 0 else None
        if held_by is not None:  # a run still going, perhaps before its first checkpoint
            raise UserError(f"--resume: {out_dir} is in use by {held_by}")
        if not (out_dir / "checkpoints" / "last.pt").is_file():
            raise UserError(f"--resume: {out_dir} holds no checkpoints/last.pt")
        source = args.config or str(out_dir / "config.yaml")
    else:
        source = args.config or "digits"
    # Everything that can be checked is checked before any work: the config, the machine, the run directory.
    cfg = load_checked(source, args.overrides)
    world = distributed.world_size_from_env()
    if args.resume is None:
        out_dir = args.out or Path("runs") / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    held = hold_run_dir(out_dir) if distributed.rank_from_env() == 0 else contextlib.nullcontext()
    with held:
        cfg = resolve_auto(cfg)
        check_batch(cfg, world)
        resume = args.resume is not None or holds_this_run(out_dir, cfg)

        from bigbatch.engine.trainer import train

        started = time.perf_counter()
        result = train(cfg, out_dir, resume=resume)
    if distributed.rank_from_env() != 0:
        return 0  # rank 0 reports
    minutes = (time.perf_counter() - started) / 60
    print(f"done: {result.steps} steps in {minutes:.1f} min; final:")
    print(result.report)
    if result.best.value is not None:
        print(f"best {result.best.metric} {result.best.value:.2f} at step {result.best.step}")
    print(f"run written to {out_dir}")
    return 0


def load_checked(source: str, overrides: list[str], reads_data: bool = True) -> RunConfig:
    """Load a config and check what can be checked without any work: the batch layout (unless ``subdivisions``
    is ``auto``), the memory the run needs at the least against this machine's, and, for a command that
    ``reads_data`` (not ``show``, ``schedule``, ``scale``: they plan from ``data.train_images``), that the data is
    named."""
    from bigbatch.batching import check_batch
    from bigbatch.config import load_config
    from bigbatch.engine import distributed
    from bigbatch.telemetry.capacity import check_capacity

    cfg = load_config(source, overrides)
    if reads_data:
        from bigbatch.tasks import check_data_given

        check_data_given(cfg)
    world = distributed.world_size_from_env()
    if cfg.subdivisions != "auto":
        check_batch(cfg, world)
    check_capacity(cfg, world)
    return cfg


def holds_this_run(out_dir: Path, cfg: RunConfig) -> bool:
    """Whether ``out_dir`` already holds a checkpoint of this very run, which ``train`` then resumes (a worker
    restarted by ``torchrun --max-restarts`` runs the same command again). A checkpoint of another config is
    refused rather than overwritten. ``subdivisions`` may differ: the layout does not change the training."""
    if not (out_dir / "checkpoints" / "last.pt").is_file():
        return False
    from bigbatch.config import flatten, load_config

    try:
        saved = flatten(load_config(str(out_dir / "config.yaml")).model_dump(mode="json"))
    except UserError:
        saved = {}
    wanted = flatten(cfg.model_dump(mode="json"))
    differ = [k for k in sorted(saved.keys() | wanted.keys()) if k != "subdivisions" and saved.get(k) != wanted.get(k)]
    if differ:
        first = differ[0]
        raise UserError(f"--out: {out_dir} already holds a run of another config ({first}: {saved.get(first)!r} "
                        f"there, {wanted.get(first)!r} here); continue it with --resume {out_dir}, "
                        f"or choose another --out")
    from bigbatch.engine import distributed

    if distributed.rank_from_env() == 0:
        print(f"resuming the run in {out_dir} from its last checkpoint", flush=True)
    return True


def cmd_eval(args: argparse.Namespace) -> int:
    from bigbatch.config import apply_overrides, validate_config
    from bigbatch.engine import checkpoint, distributed
    from bigbatch.engine.state import load_weights
    from bigbatch.outputs import check_output_file, probe_writable
    from bigbatch.registry import TASKS
    from bigbatch.tasks import build_task
    from bigbatch.telemetry.capacity import check_capacity

    path: Path = args.checkpoint
    if path.is_dir():
        path = path / "checkpoints" / "last.pt"
    out = eval_record_path(path)
    probe_writable(out.parent, "eval")
    if args.save_detections is not None:
        check_output_file(args.save_detections, "--save-detections", ours=is_results_file)
    state = checkpoint.load(path, checkpoint.EVAL_KEYS)
    cfg = validate_config(apply_overrides(state["config"], args.overrides))
    check_capacity(cfg, distributed.world_size_from_env())
    task = build_task(cfg)
    if args.save_detections is not None and task.prediction_format is None:
        kind = TASKS.get(cfg.task).info.get("model_kind", cfg.task)
        raise UserError(f"--save-detections: the checkpoint is a {kind}; detections exist for detectors only")
    model = task.build_model(cfg)
    use_ema = state.get("ema") is not None and cfg.ema.evaluate
    load_weights(model, state["ema"]["module"] if use_ema else state["model"], "model")
    print(f"weights  {'EMA' if use_ema else 'raw'} from {path}")
    metrics, predictions = task.predict(model, cfg.eval.batch)
    if args.save_detections is not None:
        task.save_predictions(args.save_detections, predictions)
        note = getattr(task, "predictions_note", "")  # how the saved categories are numbered
        print(f"{len(predictions)} detections written to {args.save_detections} ({task.prediction_format} format"
              f"{', ' + note if note else ''})")
    record = {"checkpoint": str(path), "step": state["step"], "split": "val", "weights": "ema" if use_ema else "raw",
              **metrics}
    print(task.report(metrics))
    checkpoint.atomic_write(out, lambda f: f.write(json.dumps(record, indent=2) + "\n"), mode="w")
    print(f"written to {out}")
    return 0


def is_results_file(path: Path) -> bool:
    """Whether ``path`` is a COCO results file ``eval --save-detections`` wrote (``[]`` or a list of detections
    starting with an ``image_id``): such a file may be replaced by the next one, anything else is the user's."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    return head == b"[]" or head.startswith(b'[{"image_id": ')


def eval_record_path(path: Path) -> Path:
    """Where ``eval`` writes its record: ``eval-<name>.json`` in the run of ``checkpoints/<name>.pt``, else
    ``<checkpoint>.eval.json`` beside it. A file already there is replaced only if it is an earlier record of
    ``eval`` (a JSON object naming a checkpoint); anything else is the user's and stops ``eval`` before any work."""
    in_run = path.parent.name == "checkpoints"
    out = path.parent.parent / f"eval-{path.stem}.json" if in_run else path.with_suffix(".eval.json")
    if out.exists() or out.is_symlink():
        try:
            record = json.loads(out.read_text()) if out.is_file() and not out.is_symlink() else None
            ours = isinstance(record, dict) and "checkpoint" in record
        except (OSError, ValueError, TypeError):
            ours = False
        if not ours:
            raise UserError(f"eval: {out} exists and is not a record bigbatch eval wrote; bigbatch never overwrites "
                            f"a file it did not create: move it away first")
    return out


def cmd_show(args: argparse.Namespace) -> int:
    from bigbatch.batching import make_plan
    from bigbatch.config import config_to_yaml, flatten
    from bigbatch.engine import distributed
    from bigbatch.tasks import train_set_size

    cfg = load_resolved(args.config, args.overrides, reads_data=False)
    world = distributed.world_size_from_env()
    plan = make_plan(cfg, world, train_set_size(cfg))
    network = None
    if cfg.model.name == "darknet":  # read (and checked) before anything is printed
        from bigbatch.models.darknet_models import describe_network

        network = describe_network(cfg.model.cfg, cfg.data.size)
    print(config_to_yaml(cfg).rstrip())
    print()
    print(plan.describe())
    settings = cfg.data.multiscale
    if cfg.data.is_detection and settings.sizes is not None:
        from bigbatch.data.multiscale import draw_for

        sizes = draw_for(settings.sizes, cfg.data.size, settings.range).sizes
        rule = "Darknet's rule" if settings.sizes == "auto" else "drawn uniformly"
        print(f"multi-scale     {', '.join(map(str, sizes))} ({rule}, a new size every {settings.every} steps; the "
              f"first {settings.every} and the last {min(settings.final, plan.steps)} at {max(sizes)})")
    if network is not None:
        print()
        print(network)
    filled_in = cfg.filled_in()
    if filled_in:
        print()
        for key, source in filled_in.items():
            print(f"{key:<15} {flatten(cfg.model_dump(mode='json'))[key]}  (unset in the config: {source})")
    return 0


SCHEDULE_PNG_MARK = b"bigbatch schedule"
"""The ``Software`` text of a PNG ``schedule --png`` wrote: such a file may be replaced by the next one."""


def cmd_schedule(args: argparse.Namespace) -> int:
    from bigbatch.batching import make_plan
    from bigbatch.engine import distributed
    from bigbatch.engine.checkpoint import atomic_write
    from bigbatch.outputs import check_output_file, starts_with
    from bigbatch.recipe.schedule import build_schedule
    from bigbatch.tasks import train_set_size

    if args.csv is not None:
        check_output_file(args.csv, "--csv", ours=starts_with(b"step,lr\n", 8))
    if args.png is not None:
        check_output_file(args.png, "--png", ours=starts_with(SCHEDULE_PNG_MARK))
    cfg = load_resolved(args.config, args.overrides, reads_data=False)
    plan = make_plan(cfg, distributed.world_size_from_env(), train_set_size(cfg))
    lr_at = build_schedule(cfg, plan)
    lrs = [lr_at(step) for step in range(plan.steps)]
    every = max(1, plan.steps // max(args.lines, 1))
    print(f"{plan.steps} steps, global batch {plan.batch}; step counted from 0; every {every} shown")
    print(f"{'step':>10s}  {'epoch':>9s}  lr")
    for step in sorted({*range(0, plan.steps, every), plan.steps - 1}):
        print(f"{step:10d}  {plan.epoch_at(step):9.3f}  {lrs[step]:.6g}")
    if args.csv is not None:
        rows = "".join(f"{step},{lr!r}\n" for step, lr in enumerate(lrs))
        atomic_write(args.csv, lambda f: f.write("step,lr\n" + rows), mode="w")
        print(f"written to {args.csv}")
    if args.png is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 4))
        ax.plot(range(plan.steps), lrs)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("learning rate")
        ax.set_title(f"{cfg.name}: batch {plan.batch}, {plan.steps} steps")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        atomic_write(args.png, lambda f: fig.savefig(f, format="png", dpi=100,
                                                     metadata={"Software": SCHEDULE_PNG_MARK.decode()}))
        plt.close(fig)
        print(f"plotted to {args.png}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from bigbatch.config import parse_size
    from bigbatch.engine import distributed
    from bigbatch.engine.planner import plan_layout

    cfg = load_checked(args.config, args.overrides)
    budget = None
    if args.memory_limit is not None:
        try:
            budget = parse_size(args.memory_limit)
        except ValueError as e:
            raise UserError(f"--memory-limit: {e}") from None
    world = distributed.world_size_from_env()
    print(f"measuring one training step per micro-batch size at {cfg.data.size} px, {cfg.precision.dtype}, "
          "each in a fresh process")
    plan = plan_layout(cfg, world, budget)
    print(plan.table())
    print(f"chosen: batch {cfg.batch} = world {world} x subdivisions {plan.subdivisions} x micro-batch "
          f"{plan.micro_batch}  (--set subdivisions={plan.subdivisions})")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from bigbatch.report import write_report

    print(f"report written to {write_report(args.runs, args.out)}")
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    import time

    from bigbatch.batching import total_steps
    from bigbatch.engine.profile import profile
    from bigbatch.outputs import probe_writable
    from bigbatch.tasks import train_set_size

    if not 1 <= args.steps <= MAX_PROFILED_STEPS:
        raise UserError(f"--steps: expected 1 to {MAX_PROFILED_STEPS} steps to profile, got {args.steps}")
    cfg = load_checked(args.config, args.overrides)
    length = total_steps(cfg, train_set_size(cfg))
    if args.steps > length:
        raise UserError(f"--steps: {args.steps} steps, but the run of {cfg.name} is {length} steps long")
    out: Path = args.out or Path("runs") / f"profile-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out: {out} exists and is not an empty folder; bigbatch writes its trace into a new or "
                        "empty one")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out: cannot make {out}: {e.strerror}") from None
    probe_writable(out, "--out")
    print(f"profiling {args.steps} training step(s) of {cfg.name} after one warm-up step: {cfg.precision.dtype}, "
          f"batch {cfg.batch} in {cfg.subdivisions} micro-batch(es)")
    trace, table = profile(cfg, args.steps, out)
    print(table)
    print(f"trace written to {trace} (chrome://tracing or https://ui.perfetto.dev)")
    return 0


def load_resolved(source: str, overrides: list[str], reads_data: bool = True) -> RunConfig:
    """Load a config and, for ``subdivisions: auto``, measure and choose the subdivisions."""
    return resolve_auto(load_checked(source, overrides, reads_data))


def resolve_auto(cfg: RunConfig) -> RunConfig:
    """``subdivisions: auto``: measure and choose the subdivisions (printing the measurements)."""
    from bigbatch.engine import distributed
    from bigbatch.engine.planner import resolve_auto_subdivisions

    cfg, plan = resolve_auto_subdivisions(cfg, distributed.world_size_from_env())
    if plan is not None:
        print(plan.table())
        print(f"subdivisions: auto -> {cfg.subdivisions} (micro-batch {plan.micro_batch})")
    return cfg


SCALE_MARK = b"by bigbatch scale"
"""In the first line of a recipe ``scale --out`` wrote: such a file may be replaced by the next one."""


def cmd_scale(args: argparse.Namespace) -> int:
    from bigbatch.batching import check_batch
    from bigbatch.config import config_to_yaml
    from bigbatch.engine import distributed
    from bigbatch.engine.checkpoint import atomic_write
    from bigbatch.outputs import check_output_file, starts_with
    from bigbatch.recipe.rescale import changes_table, rescale

    if args.batch <= 0:
        raise UserError(f"--batch: expected a positive number of images, got {args.batch}")
    if args.out is not None:
        check_output_file(args.out, "--out", ours=starts_with(SCALE_MARK, 200))
    cfg = load_resolved(args.config, args.overrides, reads_data=False)
    world = distributed.world_size_from_env()
    new, changes = rescale(cfg, args.batch, world)
    check_batch(new, world)
    print(changes_table(changes))
    if args.out is not None:
        text = (f"# {cfg.name} rescaled from batch {cfg.batch} to {args.batch} {SCALE_MARK.decode()}\n"
                + config_to_yaml(new))
        atomic_write(args.out, lambda f: f.write(text), mode="w")
        print(f"written to {args.out}")
    else:
        print()
        print(config_to_yaml(new).rstrip())
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    if args.data_command == "bench":
        return cmd_data_bench(args)
    from bigbatch.data.shapes import generate_shapes

    counts = generate_shapes(args.out, args.images, args.seed, key="--out", yolo=args.format == "yolo")
    print(f"shapes set written to {args.out}: {counts['train_images']} train images ({counts['train_boxes']} boxes), "
          f"{counts['val_images']} val images ({counts['val_boxes']} boxes); classes {', '.join(counts['classes'])}")
    if args.format == "yolo":
        print(f"YOLO layout: train with --set data.name=yolo data.path={args.out / 'shapes.data'}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from bigbatch.export import export

    for line in export(args.source, args.darknet_weights, args.checkpoint, args.weights, args.seed):
        print(line)
    return 0


def cmd_pack(args: argparse.Namespace) -> int:
    from bigbatch.config import parse_size
    from bigbatch.data.pack import pack

    try:
        shard_size = parse_size(args.shard_size)
    except ValueError as e:
        raise UserError(f"--shard-size: {e}") from None
    if args.seed < 0:
        raise UserError(f"--seed: expected a whole number >= 0, got {args.seed}")
    counts = pack(args.src, args.out, shard_size, args.seed)
    for folder in counts["removed"]:
        print(f"removed {folder}, the unfinished output of a pack to {args.out} that was killed")
    train, val = counts["train"], counts["val"]
    print(f"shards written to {args.out}: {train['samples']} train images in {train['shards']} shards, "
          f"{val['samples']} val images in {val['shards']} shards, {counts['classes']} classes, "
          f"{counts['bytes'] / 1e6:.1f} MB; train with data.name=shards data.path={args.out}")
    return 0


def cmd_data_bench(args: argparse.Namespace) -> int:
    import os

    from bigbatch.data.bench import bench, table
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


COMMANDS = {"train": cmd_train, "eval": cmd_eval, "show": cmd_show, "schedule": cmd_schedule, "scale": cmd_scale,
            "plan": cmd_plan, "data": cmd_data, "pack": cmd_pack,
            "export": cmd_export, "profile": cmd_profile, "report": cmd_report}


def main(argv: list[str] | None = None) -> int:
    from bigbatch.engine.step import TrainingStopped

    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except TrainingStopped as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
