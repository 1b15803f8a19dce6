"""bigbatch's detection training against Ultralytics' on the same work, side by side, scored by one evaluator.

Both sides train from scratch on bigbatch's generated shapes set (``bigbatch data shapes``: 5 classes, about
128 px JPEGs, COCO JSON; ``--images`` images, 80 % train and 20 % val), on the CPU (``CUDA_VISIBLE_DEVICES`` is
emptied for both), at the same image size, batch and number of epochs over the same training images, with the same
number of torch threads and DataLoader workers:

  Ultralytics  ``yolo detect train model=yolov3-tinyu.yaml pretrained=False data=shapes.yaml imgsz=128 epochs=16
               batch=32 amp=False plots=False val=False device=cpu workers=0 seed=0`` (its Python API, the same
               call), every other setting its default (optimizer ``auto``, mosaic, ``nbs=64``, EMA, ...);
               ``--peer-model`` names the model (``yolov3-tinyu.yaml``; ``yolo11n.yaml``, ``yolo26n.yaml``: a
               scale's letter after the family's number picks that scale of the family's YAML, built from scratch),
               or several, each a side of its own;
  bigbatch     ``bigbatch train yolov3-tiny-shapes --set data.path=SET epochs=16 data.size=128 batch=32
               data.workers=0 'eval.every=16 epochs'`` (``--recipe``: any detection recipe on the shapes set).

Both evaluate once, at the end (Ultralytics validates after its last epoch and then its ``best.pt`` again; its
``val=False`` only drops the validations of the other epochs). Each training is one whole command, as a user runs
it: start-up, data checks, epochs, the final evaluation, checkpoints; its wall time is the time measured.

One evaluator: after training, each side's detections on the val images become COCO results with the category ids
of the set's ``val.json`` and are scored by bigbatch's ``tasks.coco_eval.evaluate_detections`` (faster-coco-eval)
against that file, unchanged. bigbatch's detections come from ``bigbatch eval RUN --save-detections`` (its
decoding: score > 0.005, NMS IoU 0.45, 100 per image); Ultralytics' from ``YOLO(last.pt).predict`` with
``conf=0.001``, its default NMS IoU (0.7), ``max_det=100``, boxes in original image pixels, turned into COCO
results by bigbatch's ``detections_to_coco`` with label ``l`` = the ``l``-th category by id, bigbatch's own rule
(``data.coco.class_mapping``). Parameters: ``sum(p.numel() for p in model.parameters())`` of each side's model.

The peer's data: the set converted into Ultralytics' layout in the work folder (``images/{train,val}`` holding the
same JPEGs, hard-linked or copied; ``labels/{train,val}/*.txt`` with ``class xc yc w h`` normalised, written by
``data.shapes.yolo_line``; a ``shapes.yaml``); its label caches are removed before each training.

Ultralytics is not part of bigbatch: it is taken at run time, from ``--ultralytics-path DIR`` (a folder that
``pip install --target DIR ultralytics`` and its light dependencies made; first on the peer's ``PYTHONPATH``) or
from the interpreter's own packages. Where it cannot be imported, the benchmark says so and stops (exit code 0).
It runs in subprocesses of its own, offline: ``YOLO_OFFLINE=1`` (no connectivity check, hence no analytics
events, no update check), ``YOLO_AUTOINSTALL=0``, its settings (``YOLO_CONFIG_DIR``) in the work folder with
``sync`` and the logger integrations off, and a local TrueType font (matplotlib's DejaVu Sans) in place of the
``Arial.ttf`` its dataset check downloads otherwise (``plots=False``: never drawn with). An audit hook refuses any
DNS look-up or internet socket in its processes, and the report lists any attempt (``none``: it made none).

Threads: bigbatch uses torch's default, ``OMP_NUM_THREADS``, set to ``--threads``. Ultralytics sets
``OMP_NUM_THREADS=1`` when unset and, on the CPU, ``torch.set_num_threads(min(8, cores - 1))`` in its
``select_device``; the peer process gets ``OMP_NUM_THREADS=--threads`` and its ``torch_utils.NUM_THREADS`` is set to
``--threads`` before training, and the thread count it trained with is read back and shown. Ultralytics also
forces ``workers=0`` on the CPU; with ``--workers`` above 0 a callback gives its trainer the number back.

Each round trains every side once, one after the other; rounds alternate the order (the second round runs the
sides in reverse). The median of each number is reported, and bigbatch / each Ultralytics model, with the
training time ratio of each round (two sides' times in one round, measured minutes apart).

    python benchmarks/against_ultralytics.py [--ultralytics-path DIR] [--recipe yolov3-tiny-shapes]
        [--peer-model yolov3-tinyu.yaml [MODEL ...]] [--epochs 16] [--imgsz 128] [--batch 32] [--images 2000]
        [--rounds 2] [--threads 2] [--workers 0] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from against_timm import timed  # a whole command, timed (benchmarks/ is on sys.path)

CHECKOUT = Path(__file__).resolve().parent.parent
"""The bigbatch measured: this checkout's (first on ``PYTHONPATH``, whatever the venv has installed)."""
sys.path.insert(0, str(CHECKOUT))

PEER_MODEL = "yolov3-tinyu.yaml"
"""The default peer: Ultralytics' YOLOv3-tiny (its anchor-free head); ``--peer-model`` names others."""
CONF, MAX_DET = 0.001, 100

PEER = r'''
import json, os, socket, sys, traceback

args = json.loads(sys.argv[1])


def refuse_network(event, details):
    """Refuse DNS look-ups and internet sockets (local sockets, e.g. of DataLoader workers, pass), noting each."""
    if event in ("socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr"):
        target = details[0]
    elif event in ("socket.connect", "socket.sendto") and details[0].family in (socket.AF_INET, socket.AF_INET6):
        target = details[1]
    elif event in ("urllib.Request", "http.client.connect"):
        target = details[0] if event == "urllib.Request" else f"{details[1]}:{details[2]}"
    else:
        return
    callers = [f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in traceback.extract_stack()[:-1]
               if f"{os.sep}ultralytics{os.sep}" in f.filename]
    attempt = f"{event} {target}" + (f" (from {callers[-1]})" if callers else "")
    with open(args["network_log"], "a") as log:
        log.write(attempt + "\n")
    raise PermissionError(f"network refused by the benchmark: {event} {target}")


sys.addaudithook(refuse_network)

import torch  # noqa: E402
import ultralytics  # noqa: E402
from ultralytics.utils import SETTINGS, torch_utils  # noqa: E402

SETTINGS.update({key: False for key in ("sync", "clearml", "comet", "dvc", "mlflow", "raytune", "tensorboard",
                                        "wandb", "vscode_msg", "openvino_msg", "hub") if key in SETTINGS})
SETTINGS.update(datasets_dir=args["home"], weights_dir=os.path.join(args["home"], "weights"),
                runs_dir=os.path.join(args["home"], "runs"))
torch_utils.NUM_THREADS = args["threads"]  # select_device: torch.set_num_threads(NUM_THREADS) on the CPU
from ultralytics import YOLO  # noqa: E402

if args["mode"] == "versions":
    import cv2
    print(json.dumps({"ultralytics": ultralytics.__version__, "torch": torch.__version__, "cv2": cv2.__version__,
                      "from": os.path.dirname(ultralytics.__file__)}))
elif args["mode"] == "train":
    model = YOLO(args["model"])
    seen = {}

    def keep_workers(trainer):
        trainer.args.workers = args["workers"]  # the trainer sets 0 on the CPU; equal workers on both sides

    def note(trainer):
        seen.update(threads=torch.get_num_threads(), workers=trainer.args.workers, accumulate=trainer.accumulate,
                    batch=trainer.batch_size, train_images=len(trainer.train_loader.dataset),
                    optimizer=type(trainer.optimizer).__name__, lr=trainer.optimizer.param_groups[0].get("initial_lr"))

    def done(trainer):
        seen["last"] = str(trainer.last)

    if args["workers"]:
        model.add_callback("on_pretrain_routine_start", keep_workers)
    model.add_callback("on_train_start", note)
    model.add_callback("on_train_end", done)
    model.train(data=args["data"], imgsz=args["imgsz"], epochs=args["epochs"], batch=args["batch"],
                pretrained=False, amp=False, plots=False, val=False, device="cpu", workers=args["workers"],
                project=args["project"], name="train", exist_ok=True, seed=0)
    with open(args["out"], "w") as f:
        json.dump(seen, f)
elif args["mode"] == "predict":
    model = YOLO(args["weights"])
    parameters = sum(p.numel() for p in model.model.parameters())
    images = args["images"]
    outputs = []
    for start in range(0, len(images), 32):
        for result in model.predict(images[start:start + 32], imgsz=args["imgsz"], conf=args["conf"],
                                    max_det=args["max_det"], device="cpu", verbose=False, stream=True):
            boxes = result.boxes
            outputs.append({"path": result.path, "boxes": boxes.xyxy.tolist(), "scores": boxes.conf.tolist(),
                            "labels": boxes.cls.int().tolist()})
    with open(args["out"], "w") as f:
        json.dump({"parameters": parameters, "outputs": outputs, "names": model.names}, f)
'''
"""The peer's process: ``versions``, ``train`` or ``predict`` (arguments as one JSON), offline and guarded."""


def peer_env(threads: int, ultralytics_path: Path | None, config_dir: Path) -> dict[str, str]:
    python_path = [str(ultralytics_path)] if ultralytics_path else []
    python_path += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="",
                PYTHONPATH=os.pathsep.join(python_path), YOLO_OFFLINE="1", YOLO_AUTOINSTALL="0",
                YOLO_CONFIG_DIR=str(config_dir), YOLO_VERBOSE="1")


def bigbatch_env(threads: int) -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="",
                PYTHONPATH=str(CHECKOUT))


def peer_home(work: Path) -> Path:
    """The peer's settings folder (``YOLO_CONFIG_DIR``), with a local font standing in for ``Arial.ttf``."""
    import matplotlib

    home = work / "ultralytics-config"
    user_dir = home / "Ultralytics"  # its USER_CONFIG_DIR: YOLO_CONFIG_DIR/Ultralytics
    user_dir.mkdir(parents=True, exist_ok=True)
    font = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
    if font.is_file() and not (user_dir / "Arial.ttf").exists():
        shutil.copyfile(font, user_dir / "Arial.ttf")  # check_font("Arial.ttf") finds it and downloads nothing
    return home


def run_peer(mode: str, env: dict[str, str], log: Path, **args) -> subprocess.CompletedProcess:
    command = [sys.executable, "-c", PEER, json.dumps({"mode": mode, **args})]
    with log.open("w") as out:
        return subprocess.run(command, env=env, cwd=log.parent, stdout=out, stderr=subprocess.STDOUT)


# ----------------------------------------------------------------------------------------------- the data


def classes_of(annotations: dict) -> tuple[list[str], list[int]]:
    """(class names in label order, the category id of each label), by bigbatch's rule: all categories by id."""
    from bigbatch.data.formats.coco import class_mapping

    names, label_of = class_mapping({int(c["id"]): c["name"] for c in annotations["categories"]}, None)
    category_ids = sorted(label_of, key=label_of.get)
    return names, category_ids


def yolo_layout(shapes: Path, out: Path) -> Path:
    """The set at ``shapes`` in Ultralytics' layout at ``out``: the same JPEGs under ``images/{train,val}``, their
    boxes as ``class xc yc w h`` (normalised) lines in ``labels/{train,val}/*.txt``, and ``shapes.yaml``."""
    from bigbatch.data.formats.shapes import yolo_line

    names = None
    for split in ("train", "val"):
        annotations = json.loads((shapes / "annotations" / f"{split}.json").read_text())
        split_names, category_ids = classes_of(annotations)
        if names is not None and split_names != names:
            sys.exit(f"{shapes}: train.json and val.json name different classes")
        names, label_of = split_names, {cid: label for label, cid in enumerate(category_ids)}
        boxes: dict[int, list[str]] = {}
        for ann in annotations["annotations"]:
            if not ann.get("iscrowd"):
                boxes.setdefault(ann["image_id"], []).append(ann)
        (out / "images" / split).mkdir(parents=True)
        (out / "labels" / split).mkdir(parents=True)
        for image in annotations["images"]:
            source, target = shapes / split / image["file_name"], out / "images" / split / image["file_name"]
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
            lines = [yolo_line(label_of[a["category_id"]], a["bbox"], image["width"], image["height"]) + "\n"
                     for a in boxes.get(image["id"], [])]
            (out / "labels" / split / f"{Path(image['file_name']).stem}.txt").write_text("".join(lines))
    names_yaml = "".join(f"  {label}: {json.dumps(name)}\n" for label, name in enumerate(names))
    data = out / "shapes.yaml"
    data.write_text(f"path: {json.dumps(str(out))}\ntrain: images/train\nval: images/val\nnames:\n{names_yaml}")
    return data


# ----------------------------------------------------------------------------------------------- the two sides


def score(ground_truth: dict, detections: list[dict]) -> dict[str, float]:
    """COCO metrics of ``detections`` against the set's ``val.json``: bigbatch's evaluator, for both sides."""
    from bigbatch.tasks.coco_eval import evaluate_detections

    names, _ = classes_of(ground_truth)
    return evaluate_detections(ground_truth, detections, names)


def bigbatch_parameters(run: Path, classes: int) -> int:
    """The parameter count of the run's model, built (without memory) from its checkpoint's config."""
    import torch

    from bigbatch.config import validate_config
    from bigbatch.engine import checkpoint
    from bigbatch.engine.run_dir import last_checkpoint
    from bigbatch.models import build_model

    cfg = validate_config(checkpoint.load(last_checkpoint(run), checkpoint.EVAL_KEYS)["config"])
    with torch.device("meta"):
        model = build_model(cfg.model, classes, min_size=cfg.data.size, max_size=cfg.data.longest_side)
    return sum(p.numel() for p in model.parameters())


def run_bigbatch(args: argparse.Namespace, shapes: Path, ground_truth: dict, out: Path) -> dict:
    env = bigbatch_env(args.threads)
    sets = [f"data.path={shapes}", f"epochs={args.epochs}", f"data.size={args.imgsz}", f"batch={args.batch}",
            f"data.workers={args.workers}", f"eval.every={args.epochs} epochs", "seed=0"]
    run = out / "run"
    command = [sys.executable, "-m", "bigbatch", "train", args.recipe, "--out", str(run), "--set", *sets]
    seconds = timed(command, env, out, out / "train.log")
    detections_file = out / "detections.json"
    timed([sys.executable, "-m", "bigbatch", "eval", str(run), "--save-detections", str(detections_file)], env, out,
          out / "eval.log")
    metrics = score(ground_truth, json.loads(detections_file.read_text()))
    own = json.loads((run / "eval-last.json").read_text())  # bigbatch's eval: the same evaluator, its own ground truth
    if any(not math.isclose(own[key], metrics[key], abs_tol=1e-9) for key in ("mAP", "mAP50") if key in own):
        print(f"  note: bigbatch's own eval said mAP {own['mAP']:.4f}, mAP50 {own['mAP50']:.4f} (against val.json: "
              f"{metrics['mAP']:.4f}, {metrics['mAP50']:.4f})", flush=True)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    images = max(r["images"] for r in records if "images" in r and "epoch" in r)
    return {"seconds": seconds, "mAP": metrics["mAP"], "mAP50": metrics["mAP50"], "images": images,
            "parameters": bigbatch_parameters(run, len(ground_truth["categories"]))}


def run_ultralytics(args: argparse.Namespace, model: str, data: Path, env: dict[str, str], home: Path,
                    ground_truth: dict, out: Path) -> dict:
    from bigbatch.tasks.coco_eval import detections_to_coco

    for cache in (data.parent / "labels").glob("*.cache"):
        cache.unlink()  # each training reads the set afresh, as bigbatch's does
    network_log = out / "network.txt"
    common = {"home": str(home), "threads": args.threads, "network_log": str(network_log)}
    command = [sys.executable, "-c", PEER, json.dumps({
        "mode": "train", "model": model, "data": str(data), "imgsz": args.imgsz, "epochs": args.epochs,
        "batch": args.batch, "workers": args.workers, "project": str(out), "out": str(out / "train.json"), **common})]
    seconds = timed(command, env, out, out / "train.log")
    seen = json.loads((out / "train.json").read_text())
    val_dir = data.parent / "images" / "val"
    id_of = {str(val_dir / image["file_name"]): image["id"] for image in ground_truth["images"]}
    done = run_peer("predict", env, out / "predict.log", weights=seen["last"], images=sorted(id_of),
                    imgsz=args.imgsz, conf=CONF, max_det=MAX_DET, out=str(out / "predict.json"), **common)
    if done.returncode != 0:
        sys.exit(f"Ultralytics' predict failed (exit {done.returncode}); its output: {out / 'predict.log'}")
    predicted = json.loads((out / "predict.json").read_text())
    import torch

    names, category_ids = classes_of(ground_truth)
    if [predicted["names"][str(label)] for label in range(len(names))] != names:
        sys.exit(f"Ultralytics' model names its classes {predicted['names']}, not {names}")
    outputs = [{"boxes": torch.tensor(o["boxes"]).reshape(-1, 4), "scores": torch.tensor(o["scores"]),
                "labels": torch.tensor(o["labels"], dtype=torch.int64)} for o in predicted["outputs"]]
    detections = detections_to_coco([id_of[o["path"]] for o in predicted["outputs"]], outputs, category_ids)
    metrics = score(ground_truth, detections)
    attempts = network_log.read_text().splitlines() if network_log.exists() else []
    return {"seconds": seconds, "mAP": metrics["mAP"], "mAP50": metrics["mAP50"],
            "images": args.epochs * seen["train_images"], "parameters": predicted["parameters"], "seen": seen,
            "network": attempts}


# ----------------------------------------------------------------------------------------------- main


def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{model}, {os.cpu_count()} cores, {system}, Python {platform.python_version()}"


def load() -> str:
    """The 1, 5 and 15 minute load averages (the machine may be shared: they say how much)."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ultralytics-path", type=Path, default=None,
                        help="a folder holding the ultralytics package and its dependencies (pip install --target), "
                        "put first on the peer's PYTHONPATH; default: the interpreter's own packages")
    parser.add_argument("--recipe", default="yolov3-tiny-shapes", help="bigbatch's recipe (a detection recipe on "
                        "the shapes set: a built-in name or a YAML file)")
    parser.add_argument("--peer-model", nargs="+", default=[PEER_MODEL], metavar="MODEL",
                        help="Ultralytics' model(s), each trained from scratch as a side of its own: a model YAML "
                        "it ships (yolov3-tinyu.yaml, yolo11n.yaml, yolo26n.yaml, ...) or a file")
    parser.add_argument("--epochs", type=int, default=16)
    parser.add_argument("--imgsz", type=int, default=128, help="training and evaluation image size")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--images", type=int, default=2000, help="images of the generated set, train and val "
                        "together (20%% val); fewer for a smoke test")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers on both sides (0: Ultralytics' "
                        "own choice on the CPU)")
    parser.add_argument("--workdir", type=Path, default=None, help="a new or empty folder for the set, the runs and "
                        "the logs, kept afterwards (default: a temporary folder, removed)")
    args = parser.parse_args()
    if args.ultralytics_path is not None and not args.ultralytics_path.is_dir():
        parser.error(f"--ultralytics-path: {args.ultralytics_path} is not a folder")
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir: {args.workdir} is not empty")

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        home = peer_home(work)
        env = peer_env(args.threads, args.ultralytics_path and args.ultralytics_path.resolve(), home)
        done = run_peer("versions", env, work / "versions.log", home=str(home), threads=args.threads,
                        network_log=str(work / "network-versions.txt"))
        if done.returncode != 0:
            error = (work / "versions.log").read_text().strip().splitlines()
            print(f"skipped: ultralytics is not importable ({error[-1] if error else f'exit {done.returncode}'}); "
                  "give --ultralytics-path DIR (pip install --target DIR ultralytics ...) or install it beside "
                  "torch: it is the peer, and this script does not fetch it")
            return
        versions = json.loads((work / "versions.log").read_text().strip().splitlines()[-1])
        import faster_coco_eval
        import torch

        import bigbatch

        shapes = work / "shapes"
        timed([sys.executable, "-m", "bigbatch", "data", "shapes", "--out", str(shapes), "--images", str(args.images),
               "--seed", "0"], bigbatch_env(args.threads), work, work / "shapes.log")
        data = yolo_layout(shapes, work / "shapes-yolo")
        ground_truth = json.loads((shapes / "annotations" / "val.json").read_text())
        train_images = len(json.loads((shapes / "annotations" / "train.json").read_text())["images"])
        print(f"machine: {machine()}\nversions: torch {torch.__version__}, ultralytics {versions['ultralytics']} "
              f"(from {versions['from']}; its torch {versions['torch']}, opencv {versions['cv2']}), bigbatch "
              f"{bigbatch.__version__}, faster-coco-eval {faster_coco_eval.__version__}\n"
              f"work: shapes set of {args.images} images ({train_images} train, {len(ground_truth['images'])} val), "
              f"{args.imgsz} px, batch {args.batch}, {args.epochs} epochs, {args.threads} torch threads and "
              f"{args.workers} workers on both sides, {args.rounds} rounds; bigbatch {args.recipe} against "
              f"Ultralytics {', '.join(args.peer_model)}; all scored by faster-coco-eval on val.json\n"
              f"load average at the start: {load()}", flush=True)
        sides = {"bigbatch": lambda out: run_bigbatch(args, shapes, ground_truth, out)}
        peers = {f"ul {Path(model).stem}": model for model in args.peer_model}
        if len(peers) != len(args.peer_model):
            parser.error("--peer-model: two models of the same name")
        for name, model in peers.items():
            sides[name] = lambda out, model=model: run_ultralytics(args, model, data, env, home, ground_truth, out)
        order = list(peers) + ["bigbatch"]  # round 0: the peers first, as the benchmark always began
        width = max(map(len, sides))
        results: dict[str, list[dict]] = {name: [] for name in sides}
        for r in range(args.rounds):
            for name in (order if r % 2 == 0 else list(reversed(order))):
                out = work / f"{name.replace(' ', '-')}-r{r}"
                out.mkdir()
                before = load()
                result = sides[name](out)
                results[name].append(result)
                print(f"round {r} {name:{width}s}  {result['seconds']:8.1f} s  mAP {result['mAP']:.4f}  "
                      f"mAP50 {result['mAP50']:.4f}  {result['parameters']:,} parameters  "
                      f"{result['images']} training images seen; load average {before} before, {load()} after",
                      flush=True)
                if name in peers:
                    seen = result["seen"]
                    print(f"  {name} trained with {seen['threads']} torch threads, {seen['workers']} workers, "
                          f"batch {seen['batch']} x accumulate {seen['accumulate']} (nbs), {seen['optimizer']} "
                          f"lr {seen['lr']}; network attempts: {', '.join(result['network']) or 'none'}", flush=True)
        median = {name: {key: statistics.median(r[key] for r in rows) for key in ("seconds", "mAP", "mAP50",
                                                                                    "parameters")}
                  for name, rows in results.items()}
        width = max(width, len("bigbatch / ") + max(map(len, peers)))
        print(f"\n{'median':{width}s}  {'train s':>8s}  {'mAP':>7s}  {'mAP50':>7s}  {'parameters':>12s}")
        for name, values in median.items():
            print(f"{name:{width}s}  {values['seconds']:8.1f}  {values['mAP']:7.4f}  {values['mAP50']:7.4f}  "
                  f"{values['parameters']:12,.0f}")
        for peer in peers:
            ratio = {key: median["bigbatch"][key] / median[peer][key] if median[peer][key] else math.nan
                     for key in median["bigbatch"]}
            print(f"{'bigbatch / ' + peer:{width}s}  {ratio['seconds']:8.2f}  {ratio['mAP']:7.2f}  "
                  f"{ratio['mAP50']:7.2f}  {ratio['parameters']:12.2f}")
        for peer in peers:
            each = ", ".join(f"{b['seconds'] / u['seconds']:.2f}" for b, u in zip(results["bigbatch"], results[peer],
                                                                                  strict=True))
            print(f"training time bigbatch / {peer} per round: {each}")
        print(f"load average at the end: {load()}", flush=True)
        if args.workdir is not None:
            print(f"runs and logs kept in {work}")


if __name__ == "__main__":
    main()
