"""CPU inference speed, side by side in one run: bigbatch's paths against AlexeyAB Darknet and Ultralytics.

    python benchmarks/inference.py [--darknet-root /tmp/dn-avx/AlexeyAB] [--mirror DIR] [--ultralytics-path DIR]
        [--rounds 3] [--threads 2] [--images 32] [--seconds 2] [--workdir DIR] [--no-resnet] [--no-profile]

Images per second at batch 1 and batch 32, ``--threads`` threads everywhere (``torch.set_num_threads``,
onnxruntime's ``intra_op_num_threads``, OpenVINO's ``INFERENCE_NUM_THREADS``, Darknet's and the peer's
``OMP_NUM_THREADS``), for:

- **yolov4-tiny at 416**: AlexeyAB's stock ``cfg/yolov4-tiny.cfg`` (read from the fetched snapshot ``--mirror``)
  with seeded weights made at run time by ``darknet_predict.make_weights`` (random layers, the heads shifted so that
  each sample image has 1 to 25 detections at 0.25: the weights ``benchmarks/darknet_predict.py`` checks bigbatch's
  boxes against Darknet's with), written as Darknet ``.weights``; images: Darknet's ``data/*.jpg`` converted to PNG
  by PIL (both sides decode the same pixels), cycled to ``--images``.

  * the network forward alone: bigbatch's ``load(cfg, weights=W).module.network`` in torch eager, channels-last
    (module and inputs), onnxruntime (``torch.onnx.export(..., dynamo=True)`` with a dynamic batch, opset 18) and
    OpenVINO (the same ONNX file, reshaped to each batch; fp32 with ``INFERENCE_PRECISION_HINT=f32``, and bf16 beside
    it where the CPU has AVX512_BF16); Darknet's from its own ``Predicted in X milli-seconds`` lines (its
    ``network_predict``, batch 1: ``detector test`` has no batch), the first image left out as a warm-up.
  * the whole ``predict`` path per image (decode, preprocess, forward, Darknet-style postprocess):
    ``bigbatch.load(cfg, weights=W).predict(paths, batch=B)``; ``bigbatch.load(FILE)`` of the files ``bigbatch
    export --format onnx|openvino --dynamic-batch`` writes (onnxruntime; OpenVINO at f32, bigbatch's own paths); beside
    them the same ``Predictor`` with its forward
    swapped for the onnxruntime or OpenVINO session (a benchmark-only swap, not a bigbatch feature: what a faster
    forward would give the whole path). Darknet: ``darknet detector test DATA CFG W -dont_show`` with the paths on
    stdin, one process over the ``--images`` images, wall time less that of the same command given no image (its
    start-up: reading the cfg and weights); the raw ``images / wall`` of the whole process is shown too. Darknet's
    loop also draws the boxes and writes ``predictions.jpg`` for every image (it has no switch to skip them).
  * where bigbatch's time goes: its predict per phase (decode, preprocess, forward, postprocess, in ms per image at
    batch 1, eager) and torch.profiler's top operators of the eager forward.

- **ResNet-50 at 224**: torchvision's ``resnet50(weights=None)`` (no download), the same forward paths.

Peers, taken at run time, never part of bigbatch:

- **Darknet**: ``--darknet-root/darknet``, built there first when absent from the snapshot ``--mirror`` (``git
  archive | tar -x``, then ``make -j2 GPU=0 CUDNN=0 OPENCV=0 OPENMP=1 AVX=1 LIBSO=1``); without either, skipped.
- **Ultralytics**: from ``--ultralytics-path DIR`` (``pip install --target DIR ultralytics --no-deps`` and its light
  dependencies, as ``benchmarks/against_ultralytics.py`` takes it) or the interpreter's packages; the newest nano
  detection model of the installed version (``yolo26n.yaml`` in 8.4: the highest-numbered family under its
  ``cfg/models``) built from YAML with random weights, in a subprocess of its own, offline (``YOLO_OFFLINE=1``, an
  audit hook refusing internet sockets); its forward (the fused model its predictor runs, on 416 x 416 inputs) at
  batch 1 and 32, and its ``predict(path, imgsz=416)`` per image (letterboxed to a multiple of 32 per side, so often
  smaller than 416 x 416). Not importable: skipped, with the reason.

Rounds alternate the order of the arms (reversed every other round); each measurement is timed for at least
``--seconds`` after a warm-up call, and the median over rounds is reported, with each arm's ratio to Darknet taken
per round (same mode: forward against Darknet's forward, predict against Darknet's whole path) and its median given.
The table is printed; the exit status is 0.
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
from collections.abc import Callable
from datetime import date
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(CHECKOUT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

MIRROR = Path("/work/.mirror/AlexeyAB+darknet/repo")
BUILD = ["make", "-j2", "GPU=0", "CUDNN=0", "OPENCV=0", "OPENMP=1", "AVX=1", "LIBSO=1"]
BATCHES = (1, 32)

PEER = r'''
import json, os, socket, sys, time

args = json.loads(sys.argv[1])


def refuse_network(event, details):
    """No DNS look-up and no internet socket from the peer."""
    if event.startswith("socket.gethost") or event == "socket.getaddrinfo" or (
            event in ("socket.connect", "socket.sendto") and details[0].family in (socket.AF_INET, socket.AF_INET6)):
        raise PermissionError(f"network refused by the benchmark: {event}")


sys.addaudithook(refuse_network)
import torch  # noqa: E402

torch.set_num_threads(args["threads"])
import ultralytics  # noqa: E402
from ultralytics.utils import SETTINGS, torch_utils  # noqa: E402

SETTINGS.update({key: False for key in ("sync", "clearml", "comet", "dvc", "mlflow", "raytune", "tensorboard",
                                        "wandb", "vscode_msg", "openvino_msg", "hub") if key in SETTINGS})
torch_utils.NUM_THREADS = args["threads"]
from ultralytics import YOLO  # noqa: E402

families = os.path.join(os.path.dirname(ultralytics.__file__), "cfg", "models")
newest = max((d for d in os.listdir(families) if d.isdigit()), key=int, default=None)
name = f"yolo{newest}n.yaml" if newest else "yolov8n.yaml"
if args["mode"] == "versions":
    print(json.dumps({"ultralytics": ultralytics.__version__, "model": name}))
    sys.exit(0)
model = YOLO(name)
images, size, seconds = args["images"], args["imgsz"], args["seconds"]
found = [len(r.boxes) for r in model.predict(images[:6], imgsz=size, device="cpu", verbose=False)]  # warm-up
torch.set_num_threads(args["threads"])
net = model.predictor.model.model  # the fused network its predict runs


def rate(call, batch):
    call()
    call()
    start, calls = time.perf_counter(), 0
    while calls < 2 or time.perf_counter() - start < seconds:
        call()
        calls += 1
    return batch * calls / (time.perf_counter() - start)


out = {"model": name, "threads": torch.get_num_threads(), "detections": found}
with torch.inference_mode():
    for batch in (1, 32):
        x = torch.rand(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
        out[f"forward {batch}"] = rate(lambda: net(x), batch)
start = time.perf_counter()
for path in images:
    model.predict(path, imgsz=size, device="cpu", verbose=False)
out["predict 1"] = len(images) / (time.perf_counter() - start)
print(json.dumps(out))
'''
"""The Ultralytics process: ``versions`` or a measurement (arguments as one JSON), offline."""


# ----------------------------------------------------------------------------------------------- set-up


def machine() -> dict[str, str]:
    """The CPU model, its core count and which of AVX2, AVX512F and AVX512_BF16 its flags list."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    listed = ", ".join(f"{flag.upper()} {'yes' if flag in flags else 'no'}" for flag in ("avx2", "avx512f",
                                                                                        "avx512_bf16", "amx_bf16"))
    return {"cpu": model, "nproc": str(os.cpu_count()), "flags": listed, "bf16": str("avx512_bf16" in flags),
            "system": f"{platform.system()} {platform.release()}, Python {platform.python_version()}"}


def find_darknet(root: Path, mirror: Path) -> Path | None:
    """``root/darknet``, built from ``mirror`` (AVX and OpenMP on) first when absent; None when neither is there."""
    from darknet_predict import find_darknet as found_or_built  # benchmarks/ is on sys.path

    return found_or_built(root, mirror, BUILD)


def from_mirror(mirror: Path, path: str, out: Path) -> Path:
    """The snapshot's ``path`` (at HEAD) written to ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(subprocess.run(["git", f"--git-dir={mirror}", "show", f"HEAD:{path}"], check=True,
                                   capture_output=True).stdout)
    return out


def sample_pngs(mirror: Path, work: Path) -> list[Path]:
    """Darknet's ``data/*.jpg`` from the snapshot, each converted to PNG by PIL."""
    from darknet_predict import to_png  # benchmarks/ is on sys.path

    listing = subprocess.run(["git", f"--git-dir={mirror}", "ls-tree", "--name-only", "HEAD", "data/"], check=True,
                             capture_output=True, text=True).stdout.split()
    jpegs = [from_mirror(mirror, name, work / "jpeg" / Path(name).name) for name in listing if name.endswith(".jpg")]
    return to_png(sorted(jpegs), work / "images")


def export_onnx(net: torch.nn.Module, example: torch.Tensor, out: Path) -> Path:
    """``net`` as ONNX (dynamo, opset 18), its batch dimension dynamic."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        torch.onnx.export(net, (example,), str(out), dynamo=True, dynamic_shapes=({0: torch.export.Dim("batch")},),
                          opset_version=18)
    return out


# ----------------------------------------------------------------------------------------------- the runtimes


class OrtForward:
    """An onnxruntime session on the CPU, ``threads`` intra-op threads: ``call(x)`` -> list of output tensors."""

    def __init__(self, path: Path, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.input = self.session.get_inputs()[0].name

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [torch.from_numpy(o) for o in self.session.run(None, {self.input: x.contiguous().numpy()})]


class OpenVinoForward:
    """The ONNX file compiled by OpenVINO for the CPU, one model per batch size (reshaped, static), at
    ``precision`` (``f32`` or ``bf16``), ``threads`` threads, one stream."""

    def __init__(self, path: Path, threads: int, precision: str) -> None:
        import openvino as ov

        self.core, self.path, self.compiled = ov.Core(), path, {}
        self.config = {"INFERENCE_NUM_THREADS": threads, "INFERENCE_PRECISION_HINT": precision,
                       "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1}

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        shape = tuple(x.shape)
        if shape not in self.compiled:
            model = self.core.read_model(str(self.path))
            model.reshape(list(shape))
            self.compiled[shape] = self.core.compile_model(model, "CPU", self.config)
        request = self.compiled[shape]
        return [torch.from_numpy(np.asarray(o)) for o in request(x.contiguous().numpy()).values()]


class SwappedDetector(torch.nn.Module):
    """A ``DarknetDetector`` stand-in whose ``network`` is another runtime's forward (a benchmark-only swap)."""

    def __init__(self, detector: torch.nn.Module, forward: Callable[[torch.Tensor], list[torch.Tensor]]) -> None:
        super().__init__()
        self.specs = detector.specs
        self.detections_per_image = detector.detections_per_image
        self.anchor = torch.nn.Parameter(torch.zeros(()), requires_grad=False)  # its device: the CPU
        self.network = forward


def bigbatch_export(cfg: Path, weights: Path, out: Path, fmt: str = "onnx") -> tuple[Path, str] | None:
    """``bigbatch export CFG --weights W --format FMT --out FILE --dynamic-batch`` (this checkout's), -> (the file,
    the command); None where this bigbatch's export has no ``--format`` or the command fails (said so)."""
    command = [sys.executable, "-m", "bigbatch", "export", str(cfg), "--weights", str(weights), "--format", fmt,
               "--out", str(out), "--dynamic-batch", "--check-images", str(cfg.parent / "images")]
    env = dict(os.environ, PYTHONPATH=str(CHECKOUT))
    helped = subprocess.run([sys.executable, "-m", "bigbatch", "export", "--help"], env=env, capture_output=True,
                            text=True)
    if "--format" not in helped.stdout:
        print("note: this bigbatch's export has no --format: the ONNX file comes from torch.onnx.export")
        return None
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        print(f"note: {' '.join(command)} failed (exit {done.returncode}: {(done.stderr or done.stdout)[-300:]}); "
              "the ONNX file comes from torch.onnx.export")
        return None
    return out, f"bigbatch export CFG --weights W --format {fmt} --out FILE --dynamic-batch"


def forward_paths(net: torch.nn.Module, onnx: Path, threads: int, bf16: bool
                  ) -> dict[str, Callable[[torch.Tensor], object]]:
    """The forward of each bigbatch path: name -> ``call(x)`` (inference mode for torch)."""
    import copy

    channels_last = copy.deepcopy(net).to(memory_format=torch.channels_last)

    def eager(x: torch.Tensor) -> object:
        with torch.inference_mode():
            return net(x)

    def last(x: torch.Tensor) -> object:
        with torch.inference_mode():
            return channels_last(x.contiguous(memory_format=torch.channels_last))

    paths: dict[str, Callable[[torch.Tensor], object]] = {"torch eager": eager, "torch channels-last": last,
                                                           "onnxruntime": OrtForward(onnx, threads)}
    try:
        import openvino  # noqa: F401
    except ImportError as error:
        print(f"OpenVINO skipped: {error}")
        return paths
    paths["openvino f32"] = OpenVinoForward(onnx, threads, "f32")
    if bf16:
        paths["openvino bf16"] = OpenVinoForward(onnx, threads, "bf16")
    return paths


def warm(paths: dict[str, Callable[[torch.Tensor], object]], inputs: dict[int, torch.Tensor]) -> None:
    """Each forward path called twice at each batch size: the first few forwards of a shape are much slower (oneDNN's
    and OpenVINO's primitives are made then), and a measurement's own warm-up call is one."""
    for call in paths.values():
        for x in inputs.values():
            call(x)
            call(x)


def rate(call: Callable[[], object], images: int, seconds: float, least: int = 2) -> float:
    """Images per second of ``call`` (``images`` a call), timed over at least ``seconds`` and ``least`` calls after
    one warm-up call."""
    call()
    start, calls = time.perf_counter(), 0
    while calls < least or time.perf_counter() - start < seconds:
        call()
        calls += 1
    return images * calls / (time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------- the peers


def darknet_round(darknet: Path, cfg: Path, weights: Path, images: list[Path], work: Path,
                  threads: int) -> dict[str, float]:
    """One ``detector test`` over ``images`` and one over none: forward images/s (``Predicted in``, the first left
    out), the whole path per image (wall less start-up) and the whole process (``images / wall``)."""
    data = work / "coco.data"
    if not data.exists():
        data.write_text(f"classes=80\nnames={darknet.parent / 'data' / 'coco.names'}\n")
        (work / "data").symlink_to(darknet.parent / "data")  # load_alphabet reads data/labels/ from the cwd
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    command = [str(darknet), "detector", "test", str(data), str(cfg), str(weights), "-dont_show"]
    walls, outputs = [], []
    for given in ("", "".join(f"{p}\n" for p in images)):
        start = time.perf_counter()
        done = subprocess.run(command, input=given, cwd=work, env=env, capture_output=True, text=True)
        walls.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"darknet exited {done.returncode}: {done.stderr[-500:]}")
        outputs.append(done.stdout)
    times = predicted_ms(outputs[1])
    if len(times) != len(images):
        raise RuntimeError(f"darknet printed {len(times)} 'Predicted in' lines for {len(images)} images")
    return {"forward 1": 1000 / statistics.mean(times[1:]), "predict 1": len(images) / (walls[1] - walls[0]),
            "process 1": len(images) / walls[1], "start-up s": walls[0],
            "detections": float(sum(1 for line in outputs[1].splitlines() if line.rstrip().endswith("%")))}


def predicted_ms(output: str) -> list[float]:
    """The milliseconds of each ``...: Predicted in X milli-seconds.`` line of Darknet's ``detector test``."""
    return [float(line.rsplit("Predicted in", 1)[1].split()[0]) for line in output.splitlines()
            if "Predicted in" in line]


def ultralytics_env(threads: int, path: Path | None, work: Path) -> dict[str, str]:
    from against_ultralytics import peer_env, peer_home

    return peer_env(threads, path, peer_home(work))


def ultralytics_round(env: dict[str, str], images: list[Path], threads: int, seconds: float,
                      work: Path) -> dict[str, float]:
    """One Ultralytics process: its forward at batch 1 and 32 and its predict per image, images/s."""
    args = {"mode": "measure", "images": [str(p) for p in images], "imgsz": 416, "threads": threads,
            "seconds": seconds}
    done = subprocess.run([sys.executable, "-c", PEER, json.dumps(args)], env=env, cwd=work, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"Ultralytics exited {done.returncode}: {done.stderr[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------- bigbatch


def phases(predictor, images: list[Path], forward: Callable[[torch.Tensor], list[torch.Tensor]]
           ) -> dict[str, float]:
    """Milliseconds per image of each phase of bigbatch's predict at batch 1: decode, preprocess, forward,
    postprocess (``detections`` and the record), as ``DarknetTestDetection.run`` and ``Predictor.record`` do them."""
    from bigbatch.darknet.test_image import detections
    from bigbatch.data.pipeline.images import decode_rgb
    from bigbatch.inference.predictor import Item

    pipeline, settings, module = predictor.pipeline, predictor.settings, predictor.module
    spent = dict.fromkeys(("decode", "preprocess", "forward", "postprocess"), 0.0)
    with torch.inference_mode():
        for path in images:
            t0 = time.perf_counter()
            pixels = decode_rgb(str(path))
            t1 = time.perf_counter()
            x, geometry = pipeline.prepare(pixels)
            t2 = time.perf_counter()
            raw = forward(x[None])
            t3 = time.perf_counter()
            result = detections(raw, module.specs, [geometry], settings.conf, settings.iou, settings.max_det,
                                pipeline.nms_kind, pipeline.beta_nms)[0]
            predictor.record(Item(file=str(path)), geometry.image_size, result, settings)
            t4 = time.perf_counter()
            for key, (a, b) in zip(spent, ((t0, t1), (t1, t2), (t2, t3), (t3, t4)), strict=True):
                spent[key] += b - a
    return {key: 1000 * value / len(images) for key, value in spent.items()}


def profile_top(call: Callable[[], object], rows: int = 8) -> str:
    """torch.profiler's table of the operators taking most self CPU time over a few calls."""
    from torch.profiler import ProfilerActivity, profile

    call()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            call()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


# ----------------------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--darknet-root", type=Path, default=Path("/tmp/dn-avx/AlexeyAB"),
                        help="a Darknet checkout holding its built darknet (built there from --mirror when absent)")
    parser.add_argument("--mirror", type=Path, default=MIRROR, help="AlexeyAB Darknet's fetched snapshot (git dir)")
    parser.add_argument("--ultralytics-path", type=Path, default=None,
                        help="a folder holding the ultralytics package and its light dependencies (pip install "
                        "--target), first on the peer's PYTHONPATH; default: the interpreter's own packages")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--images", type=int, default=32, help="images of a whole-path measurement (Darknet's six "
                        "sample images cycled)")
    parser.add_argument("--seconds", type=float, default=2.0, help="each forward measurement runs at least this long")
    parser.add_argument("--workdir", type=Path, default=None, help="kept afterwards (default: a temporary folder)")
    parser.add_argument("--no-resnet", action="store_true", help="leave ResNet-50 out")
    parser.add_argument("--no-profile", action="store_true", help="leave torch.profiler's top operators out")
    args = parser.parse_args()
    if args.rounds < 1 or args.threads < 1 or args.images < 2:
        parser.error("--rounds and --threads must be at least 1, --images at least 2")
    if not args.mirror.is_dir():
        print(f"skipped: no Darknet snapshot at {args.mirror} (its cfg and sample images come from it)")
        return
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        run(args, work)
        if args.workdir is not None:
            print(f"files kept in {work}")


def run(args: argparse.Namespace, work: Path) -> None:
    import onnxruntime
    import torchvision
    from darknet_predict import make_weights

    import bigbatch

    cpu = machine()
    bf16 = cpu["bf16"] == "True"
    pngs = sample_pngs(args.mirror, work)
    images = [pngs[i % len(pngs)] for i in range(args.images)]
    cfg = from_mirror(args.mirror, "cfg/yolov4-tiny.cfg", work / "yolov4-tiny.cfg")
    weights, seed, obj, cls = make_weights(cfg, pngs, work / "yolov4-tiny.weights", 0)
    darknet = find_darknet(args.darknet_root, args.mirror)
    try:
        import openvino

        openvino_version = openvino.__version__ if hasattr(openvino, "__version__") else openvino.get_version()
    except ImportError:
        openvino_version = "not installed"
    ul_env = ultralytics_env(args.threads, args.ultralytics_path and args.ultralytics_path.resolve(), work)
    probe = subprocess.run([sys.executable, "-c", PEER, json.dumps({"mode": "versions", "threads": args.threads})],
                           env=ul_env, cwd=work, capture_output=True, text=True)
    ultralytics = json.loads(probe.stdout.strip().splitlines()[-1]) if probe.returncode == 0 else None
    print(f"date: {date.today()}\nmachine: {cpu['cpu']}, nproc {cpu['nproc']}, {cpu['flags']}; {cpu['system']}\n"
          f"versions: bigbatch {bigbatch.__version__}, torch {torch.__version__}, torchvision "
          f"{torchvision.__version__}, onnxruntime {onnxruntime.__version__}, openvino {openvino_version}, "
          f"ultralytics {ultralytics['ultralytics'] + ' (' + ultralytics['model'] + ')' if ultralytics else 'no'}\n"
          f"Darknet: {darknet or 'skipped (no build and no snapshot)'}\n"
          f"threads {args.threads}, rounds {args.rounds}, whole path over {args.images} images, weights: "
          f"darknet_predict.make_weights seed {seed} (objectness shift {obj}, class shift {cls})", flush=True)
    if ultralytics is None:
        lines = (probe.stderr or probe.stdout).strip().splitlines()
        print(f"Ultralytics skipped: not importable ({lines[-1] if lines else f'exit {probe.returncode}'}); give "
              "--ultralytics-path DIR (pip install --target DIR ultralytics --no-deps and its light dependencies)")

    predictor = bigbatch.load(cfg, weights=weights, device="cpu")
    detector = predictor.module
    net = detector.network.eval()
    shape = net.input_shape
    prepared = torch.stack([predictor.pipeline.prepare_file(str(p))[0] for p in pngs])
    inputs = {b: prepared[torch.arange(b) % len(pngs)].contiguous() for b in BATCHES}
    exported = bigbatch_export(cfg, weights, work / "yolov4-tiny.onnx")
    if exported is not None:
        yolo_onnx, how = exported
    else:
        yolo_onnx = export_onnx(net, inputs[1], work / "yolov4-tiny-torch.onnx")
        how = "torch.onnx.export(dynamo=True, dynamic batch, opset 18)"
    yolo_paths = forward_paths(net, yolo_onnx, args.threads, bf16)
    warm(yolo_paths, inputs)
    print(f"yolov4-tiny's ONNX file: {how}; network input {shape.height}x{shape.width}; ResNet-50's: "
          "torch.onnx.export(dynamo=True, dynamic batch, opset 18)", flush=True)

    from bigbatch.inference.predictor import Predictor

    def swapped(forward: Callable) -> Predictor:
        return Predictor(SwappedDetector(detector, forward), predictor.classes, predictor.pipeline,
                         predictor.settings, predictor.source)

    whole = {"torch eager": predictor}
    if exported is not None:  # bigbatch's own: load(FILE) runs the exported graph in onnxruntime
        whole["onnxruntime, bigbatch.load(FILE)"] = bigbatch.load(yolo_onnx, device="cpu")
    else:
        whole["onnxruntime (swap)"] = swapped(yolo_paths["onnxruntime"])
    if "openvino f32" in yolo_paths and (xml := bigbatch_export(cfg, weights, work / "yolov4-tiny.xml", "openvino")):
        whole["OpenVINO f32, bigbatch.load(FILE.xml)"] = bigbatch.load(xml[0], device="cpu")
    best_openvino = next((k for k in ("openvino bf16", "openvino f32") if k in yolo_paths), None)
    if best_openvino:
        whole[f"{best_openvino} (swap)"] = swapped(yolo_paths[best_openvino])
    counts = [len(r["detections"]) for r in predictor.predict([str(p) for p in pngs])]
    print(f"bigbatch's detections on the {len(pngs)} sample images at 0.25: {counts}", flush=True)

    paths = [str(p) for p in images]
    arms: dict[str, Callable[[], dict[str, float]]] = {}
    for name, call in yolo_paths.items():
        for b in BATCHES:
            arms[f"yolov4-tiny|forward|{b}|bigbatch {name}"] = (
                lambda call=call, b=b: {"": rate(lambda: call(inputs[b]), b, args.seconds)})
    for name, chosen in whole.items():
        for b in BATCHES:
            arms[f"yolov4-tiny|predict|{b}|bigbatch {name}"] = (
                lambda chosen=chosen, b=b: {"": rate(lambda: chosen.predict(paths, batch=b), len(paths), 0,
                                                     least=1)})
    if darknet is not None:
        dn_work = work / "darknet"
        dn_work.mkdir(exist_ok=True)
        arms["darknet"] = lambda: darknet_round(darknet, cfg, weights, images, dn_work, args.threads)
    if ultralytics is not None:
        arms["ultralytics"] = lambda: ultralytics_round(ul_env, images, args.threads, args.seconds, work)
    if not args.no_resnet:
        resnet = torchvision.models.resnet50(weights=None).eval()
        r_inputs = {b: torch.rand(b, 3, 224, 224, generator=torch.Generator().manual_seed(b)) for b in BATCHES}
        r_paths = forward_paths(resnet, export_onnx(resnet, r_inputs[1], work / "resnet50.onnx"), args.threads, bf16)
        warm(r_paths, r_inputs)
        for name, call in r_paths.items():
            for b in BATCHES:
                arms[f"resnet50|forward|{b}|bigbatch {name}"] = (
                    lambda call=call, b=b: {"": rate(lambda: call(r_inputs[b]), b, args.seconds)})

    results: dict[str, list[float]] = {}
    extra: dict[str, list[float]] = {}
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        start = time.perf_counter()
        for arm in order:
            try:
                measured = arms[arm]()
            except RuntimeError as error:
                print(f"round {r}: {arm} failed: {error}", flush=True)
                continue
            if arm == "darknet":
                for key, row in (("forward 1", "forward|1|darknet"), ("predict 1", "predict|1|darknet"),
                                 ("process 1", "predict|1|darknet, the whole process (start-up included)")):
                    results.setdefault(f"yolov4-tiny|{row}", []).append(measured[key])
                for key in ("start-up s", "detections"):
                    extra.setdefault(f"darknet {key}", []).append(measured[key])
            elif arm == "ultralytics":
                for key in ("forward 1", "forward 32", "predict 1"):
                    mode, b = key.split()
                    results.setdefault(f"yolov4-tiny|{mode}|{b}|ultralytics {measured['model']} (not yolov4-tiny)",
                                       []).append(measured[key])
                extra.setdefault("ultralytics threads", []).append(measured["threads"])
                extra.setdefault("ultralytics detections", []).append(sum(measured["detections"]))
            else:
                results.setdefault(arm, []).append(measured[""])
        print(f"round {r} done in {time.perf_counter() - start:.0f} s", flush=True)

    report(results, extra, args.rounds)
    print(f"\nbigbatch's predict per phase (ms per image over the {len(pngs)} sample images, batch 1, median of "
          f"{args.rounds}):")
    for name, forward in (("torch eager", net), *((k, v) for k, v in yolo_paths.items() if k != "torch eager")):
        per = [phases(predictor, pngs, (lambda x, f=forward: f(x))) for _ in range(args.rounds)]
        med = {key: statistics.median(p[key] for p in per) for key in per[0]}
        print(f"  forward by {name:21s} " + "  ".join(f"{k} {v:6.1f}" for k, v in med.items())
              + f"  total {sum(med.values()):6.1f}")
    if not args.no_profile:
        print("\ntorch.profiler, yolov4-tiny eager forward, batch 1, 3 calls:")
        print(profile_top(lambda: yolo_paths["torch eager"](inputs[1])))


def report(results: dict[str, list[float]], extra: dict[str, list[float]], rounds: int) -> None:
    """The table: median images/s, each round's, and the median per-round ratio to Darknet in the same mode."""
    darknet = {mode: results.get(f"yolov4-tiny|{mode}|1|darknet", []) for mode in ("forward", "predict")}
    print(f"\n{'model':12s} {'mode':8s} {'batch':>5s}  {'path':52s} {'img/s':>7s}  {'x Darknet':>9s}  per round")
    for key in sorted(results, key=lambda k: (k.split("|")[0] != "yolov4-tiny", k.split("|")[0],
                                              k.split("|")[1], int(k.split("|")[2]), -statistics.median(results[k]))):
        model, mode, batch, path = key.split("|")
        values = results[key]
        base = darknet.get(mode, []) if model == "yolov4-tiny" else []
        ratio = (f"{statistics.median(v / d for v, d in zip(values, base, strict=False)):9.2f}"
                 if base and len(base) == len(values) else f"{'':9s}")
        print(f"{model:12s} {mode:8s} {batch:>5s}  {path:52s} {statistics.median(values):7.1f}  {ratio}  "
              + " ".join(f"{v:.1f}" for v in values))
    for key, values in extra.items():
        print(f"{key}: {', '.join(f'{v:g}' for v in values)}")
    print(f"(rounds: {rounds}; x Darknet: median over rounds of this path / Darknet's batch-1 rate in the same round, "
          "forward against its 'Predicted in', predict against its whole path less start-up)")


if __name__ == "__main__":
    main()
