"""bigbatch's ``predict`` from a Darknet ``.cfg`` + ``.weights`` against AlexeyAB Darknet's ``darknet detector test``.

    python benchmarks/darknet_predict.py [--darknet-root /tmp/dn/AlexeyAB] [--bigbatch-side cli|inline]

Darknet is found at ``--darknet-root`` (its ``darknet`` executable), or built there, CPU only, from the fetched
snapshot ``--mirror`` (``git archive | tar -x``, then ``make -j2 GPU=0 CUDNN=0 OPENCV=0 OPENMP=0 LIBSO=1 AVX=0``);
without either the script prints one line and exits 0 (skipped). Nothing of Darknet enters the repository.

For each cfg (AlexeyAB's stock ``cfg/yolov4-tiny.cfg`` and ``cfg/yolov3-tiny.cfg``, 80 classes, and yolov4-tiny again
with ``[net] letter_box=1``), seeded ``.weights`` are made at run time (``make_weights``: random convolutions and
batch norms, each output channel of the convolution before each ``[yolo]`` standardised over the images (an affine
change of its weights and bias), then its objectness and class biases shifted until each
sample image has 1 to 25 detections at 0.25 (one shift serves all images, whose objectness levels differ), with no
score or NMS overlap within 1e-3 of its threshold and no two overlapping boxes of a class with scores within 1e-3, so
that float differences cannot flip a decision), written by bigbatch's ``write_weights``.

Decoding: each sample JPEG of Darknet's ``data/`` is converted to PNG by PIL first, and the SAME PNG is given to both
sides: Darknet built with OPENCV=0 decodes with stb_image and bigbatch with PIL, and two JPEG decoders may differ by
a few levels per pixel, while a PNG decodes to the same bytes in both; so the comparison starts from the same pixels.

Darknet runs ``darknet detector test DATA CFG WEIGHTS -dont_show -ext_output -thresh 0.25 -out result.json`` with
the PNG paths on stdin. bigbatch runs ``python -m bigbatch predict PNG... --from CFG --weights W --names coco.names
--out DIR --conf 0.25`` (``--bigbatch-side cli``, reading ``DIR/predictions.jsonl``), or in-process through
``bigbatch/darknet/test_image.py`` (``--bigbatch-side inline``). Each Darknet object (relative centre and size ->
original-pixel XYXY, clipped to the image) must match a bigbatch detection of the same class with every side within
1 px and the score within 1e-3, and the counts must be equal; the table shows the largest errors, and the exit status
is 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torchvision.ops import box_iou

from bigbatch.darknet.network import DarknetNetwork, load_network
from bigbatch.darknet.test_image import NMS_THRESH, cfg_letter_box, cfg_nms, detections, diou_matrix, preprocess
from bigbatch.darknet.weights import named_weight_tensors, read_weights, write_weights

CONF = 0.25
MOST = 25
"""Detections per image at most (one shift for all images: their objectness levels differ a lot)."""
MARGIN = 1e-3
"""No decision within this of a threshold; no two scores of a class within it."""
BOX_TOL, SCORE_TOL = 1.0, 1e-3
CFGS = {"yolov4-tiny": ("yolov4-tiny.cfg", False), "yolov3-tiny": ("yolov3-tiny.cfg", False),
        "yolov4-tiny letter_box=1": ("yolov4-tiny.cfg", True)}
BUILD = ["make", "-j2", "GPU=0", "CUDNN=0", "OPENCV=0", "OPENMP=0", "LIBSO=1", "AVX=0"]


def find_darknet(root: Path, mirror: Path, build: list[str] = BUILD) -> Path | None:
    """``root/darknet``, built from ``mirror`` with ``build`` first when absent; None when neither is there or the build
    fails (said)."""
    if (root / "darknet").is_file():
        return root / "darknet"
    if not mirror.is_dir():
        return None
    root.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", f"--git-dir={mirror}", "archive", "HEAD"], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(root)], stdin=archive.stdout, check=True)
    archive.wait()
    start = time.perf_counter()
    done = subprocess.run(build, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode != 0 or not (root / "darknet").is_file():
        print(f"Darknet's build failed in {root} ({' '.join(build)}, exit {done.returncode})")
        return None
    print(f"built Darknet in {root} in {time.perf_counter() - start:.0f} s ({' '.join(build)})")
    return root / "darknet"


def to_png(jpegs: list[Path], folder: Path) -> list[Path]:
    """Each JPEG decoded by PIL and saved as an RGB PNG in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    pngs = []
    for jpeg in jpegs:
        png = folder / f"{jpeg.stem}.png"
        Image.open(jpeg).convert("RGB").save(png)
        pngs.append(png)
    return pngs


def read_image(path: Path) -> torch.Tensor:
    """uint8 [3, H, W]."""
    return torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy()).permute(2, 0, 1)


def letterboxed_cfg(cfg: Path, out: Path) -> Path:
    """A copy of ``cfg`` with ``letter_box=1`` added to its ``[net]``."""
    lines = cfg.read_text().splitlines()
    net = next(i for i, line in enumerate(lines) if line.strip() == "[net]")
    out.write_text("\n".join(lines[:net + 1] + ["letter_box=1"] + lines[net + 1:]) + "\n")
    return out


def fill_seeded(network: DarknetNetwork, seed: int) -> None:
    """Every tensor of the ``.weights`` file drawn from a seeded generator, by Darknet's role: biases and BN means in
    +-0.1, BN scales in [0.8, 1.2], variances in [0.5, 1.5], weights uniform with variance 2 / fan_in."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, name, tensor in named_weight_tensors(network):
            u = torch.rand(tensor.shape, generator=g)
            if name == "weights":
                fan_in = tensor[0].numel()
                tensor.copy_((2 * u - 1) * (6 / fan_in) ** 0.5)
            elif name == "scales":
                tensor.copy_(0.8 + 0.4 * u)
            elif name == "rolling_variance":
                tensor.copy_(0.5 + u)
            else:
                tensor.copy_(0.2 * (u - 0.5))


def head_convs(network: DarknetNetwork) -> list[torch.nn.Conv2d]:
    """The convolution before each ``[yolo]`` (its input is that convolution's output)."""
    return [network.layers[head.index - 1].conv for head in network.yolo_heads]


def shifted(outputs: list[torch.Tensor], network: DarknetNetwork, obj: float, cls: float) -> list[torch.Tensor]:
    """The raw ``[yolo]`` inputs with ``obj`` added to every objectness channel and ``cls`` to every class channel
    (what shifting those biases of the head convolutions does)."""
    result = []
    for raw, head in zip(outputs, network.yolo_heads, strict=True):
        raw = raw.clone().unflatten(1, (len(head.mask), 5 + head.classes))
        raw[:, :, 4] += obj
        raw[:, :, 5:] += cls
        result.append(raw.flatten(1, 2))
    return result


def margins_ok(outputs: list[torch.Tensor], network: DarknetNetwork, geometries, kind: str, beta: float) -> bool:
    """No score ``objectness * p`` within MARGIN of CONF (a score is at most its objectness, so no objectness
    decision can flip either), no two overlapping candidates of a class with scores within MARGIN (their NMS order),
    no NMS overlap of two candidates of
    a class within MARGIN of the NMS threshold."""
    from bigbatch.darknet.detector import decode_yolo_output
    from bigbatch.darknet.test_image import correct_boxes

    net_size = geometries[0].net_size
    decoded = [decode_yolo_output(raw, head.spec, net_size) for raw, head in
               zip(outputs, network.yolo_heads, strict=True)]
    boxes, obj, cls = (torch.cat([d[i] for d in decoded], dim=1) for i in range(3))
    exponent = {"greedynms": 0.6, "diounms": beta}.get(kind)
    for n, placed in enumerate(geometries):
        cells = obj[n] > CONF - MARGIN
        scores = obj[n, cells, None] * cls[n, cells]
        if ((scores - CONF).abs() < MARGIN).any():
            return False
        h, w = placed.image_size
        corrected = correct_boxes(boxes[n, cells], placed.image_size, net_size, placed.letter)
        relative = corrected / corrected.new_tensor([w, h, w, h])
        for c in (scores > CONF).any(0).nonzero().flatten():
            kept = scores[:, c] > CONF
            s = scores[kept, c]
            iou = box_iou(relative[kept], relative[kept])
            close = ((s[:, None] - s[None]).abs() < MARGIN) & (iou > 0) & ~torch.eye(len(s), dtype=torch.bool)
            overlap = diou_matrix(relative[kept], exponent) if exponent else iou
            if close.any() or ((overlap - NMS_THRESH).abs() < MARGIN).any():
                return False
    return True


def candidate_counts(outputs: list[torch.Tensor], network: DarknetNetwork, net_size: tuple[int, int]) -> list[int]:
    """Per image, the (cell, class) pairs scoring above CONF, before NMS."""
    from bigbatch.darknet.detector import decode_yolo_output

    counts = 0
    for raw, head in zip(outputs, network.yolo_heads, strict=True):
        _, obj, cls = decode_yolo_output(raw, head.spec, net_size)
        counts = counts + ((obj[:, :, None] > CONF) & (obj[:, :, None] * cls > CONF)).sum((1, 2))
    return counts.tolist()


def make_weights(cfg: Path, pngs: list[Path], out: Path, seed: int) -> tuple[Path, int, float, float]:
    """Seeded ``.weights`` for ``cfg`` giving 1-MOST detections per image with the margins of :func:`margins_ok`;
    -> (path, seed used, objectness shift, class shift)."""
    network = load_network(cfg).eval()
    letter = cfg_letter_box(network.cfg)
    kind, beta = cfg_nms([head.spec for head in network.yolo_heads])
    net_size = (network.input_shape.height, network.input_shape.width)
    inputs, geometries = zip(*(preprocess(read_image(p), net_size, letter) for p in pngs), strict=True)
    for attempt in range(seed, seed + 20):
        fill_seeded(network, attempt)
        with torch.no_grad():
            outputs = network(torch.stack(inputs))
            # each channel of each head standardised over the images: mean 0, standard deviation 1 (x, y), 0.5 (w, h:
            # boxes near their anchors), 4 (objectness), 3 (classes: far from the thresholds); an affine change
            for conv, raw, head in zip(head_convs(network), outputs, network.yolo_heads, strict=True):
                target = torch.tensor([1.0, 1.0, 0.5, 0.5, 4.0] + [3.0] * head.classes).repeat(len(head.mask))
                mean, std = raw.mean((0, 2, 3)), raw.std((0, 2, 3))
                factor = target / std
                conv.weight.mul_(factor[:, None, None, None])
                conv.bias.copy_((conv.bias - mean) * factor)
            outputs = network(torch.stack(inputs))
        for cls in (-10.0, -12.0, -8.0):
            for obj in np.arange(-20.0, 0.01, 0.5):
                moved = shifted(outputs, network, float(obj), cls)
                before_nms = candidate_counts(moved, network, net_size)
                if max(before_nms) > 60:  # higher shifts only give more
                    break
                if min(before_nms) < 1:
                    continue
                found = detections(moved, [h.spec for h in network.yolo_heads], geometries, CONF, NMS_THRESH, 100,
                                   kind, beta)
                counts = [len(d["scores"]) for d in found]
                if all(1 <= c <= MOST for c in counts) and margins_ok(moved, network, geometries, kind, beta):
                    with torch.no_grad():
                        for conv, head in zip(head_convs(network), network.yolo_heads, strict=True):
                            bias = conv.bias.unflatten(0, (len(head.mask), 5 + head.classes))
                            bias[:, 4] += float(obj)
                            bias[:, 5:] += cls
                    write_weights(network, out, overwrite=True)
                    return out, attempt, float(obj), cls
    raise SystemExit(f"{cfg}: no seeded weights with 1-{MOST} detections per image and clear margins")


def darknet_side(darknet: Path, cfg: Path, weights: Path, pngs: list[Path], names: Path, work: Path
                 ) -> tuple[dict[str, list], float]:
    """-> ({png path: [(class, [x1, y1, x2, y2], confidence)]}, seconds) from ``darknet detector test``."""
    data = work / "coco.data"
    data.write_text(f"classes=80\nnames={names}\n")
    if not (work / "data").exists():
        (work / "data").symlink_to(darknet.parent / "data")  # load_alphabet reads data/labels/ from the cwd
    result = work / "result.json"
    start = time.perf_counter()
    subprocess.run([str(darknet), "detector", "test", str(data), str(cfg), str(weights), "-dont_show", "-ext_output",
                    "-thresh", str(CONF), "-out", str(result)], input="".join(f"{p}\n" for p in pngs), text=True,
                   cwd=work, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    found = {}
    for frame in json.loads(result.read_text()):
        w, h = Image.open(frame["filename"]).size
        objects = []
        for o in frame["objects"]:
            r = o["relative_coordinates"]
            box = [(r["center_x"] - r["width"] / 2) * w, (r["center_y"] - r["height"] / 2) * h,
                   (r["center_x"] + r["width"] / 2) * w, (r["center_y"] + r["height"] / 2) * h]
            box = [min(max(v, 0.0), size) for v, size in zip(box, (w, h, w, h), strict=True)]
            objects.append((o["class_id"], box, o["confidence"]))
        found[frame["filename"]] = objects
    return found, seconds


def bigbatch_inline(cfg: Path, weights: Path, pngs: list[Path]) -> tuple[dict[str, list], float]:
    """bigbatch's side in-process, through ``test_image.py``."""
    from bigbatch.darknet.detector import DarknetDetector
    from bigbatch.darknet.test_image import DarknetTest

    start = time.perf_counter()
    network = load_network(cfg)
    read_weights(network, weights)
    tester = DarknetTest(DarknetDetector(network), conf=CONF)
    found = {}
    for png in pngs:
        d = tester(read_image(png))
        found[str(png)] = [(int(c), b, float(s))
                           for c, b, s in zip(d["labels"], d["boxes"].tolist(), d["scores"], strict=True)]
    return found, time.perf_counter() - start


def bigbatch_cli(cfg: Path, weights: Path, pngs: list[Path], names: Path, work: Path, python: str,
                 pythonpath: str | None) -> tuple[dict[str, list], float]:
    """bigbatch's side through ``python -m bigbatch predict`` (run from ``work``, outside any repository)."""
    out = work / "bigbatch"
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    start = time.perf_counter()
    subprocess.run([python, "-m", "bigbatch", "predict", *map(str, pngs), "--from", str(cfg), "--weights",
                    str(weights), "--names", str(names), "--out", str(out), "--conf", str(CONF)], cwd=work, env=env,
                   check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - start
    found = {}
    for line in (out / "predictions.jsonl").read_text().splitlines():
        record = json.loads(line)
        found[str(Path(record["file"]).resolve())] = [(d["class_id"], d["box"], d["score"])
                                                      for d in record["detections"]]
    return found, seconds


def compare(darknet: dict[str, list], bigbatch: dict[str, list]) -> tuple[int, int, float, float, list[str]]:
    """-> (Darknet's detections, bigbatch's, max box error px, max score error, problems)."""
    problems, box_error, score_error = [], 0.0, 0.0
    for png, objects in darknet.items():
        theirs = list(bigbatch.get(png, []))
        if png not in bigbatch:
            problems.append(f"{png}: no bigbatch result")
        if len(theirs) != len(objects):
            problems.append(f"{png}: Darknet {len(objects)} detections, bigbatch {len(theirs)}")
        for cls, box, conf in objects:
            candidates = [(max(abs(a - b) for a, b in zip(box, t[1], strict=True)), abs(conf - t[2]), i)
                          for i, t in enumerate(theirs) if t[0] == cls]
            good = [c for c in candidates if c[0] <= BOX_TOL and c[1] <= SCORE_TOL]
            if not good:
                problems.append(f"{png}: Darknet's class {cls} {[round(v, 2) for v in box]} {conf:.6f} unmatched "
                                f"(nearest: {min(candidates, default=None)})")
                continue
            b, s, i = min(good)
            box_error, score_error = max(box_error, b), max(score_error, s)
            theirs.pop(i)
    extra = set(bigbatch) - set(darknet)
    problems += [f"{png}: only in bigbatch's results" for png in sorted(extra)]
    return (sum(map(len, darknet.values())), sum(map(len, bigbatch.values())), box_error, score_error, problems)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--darknet-root", type=Path, default=Path("/tmp/dn/AlexeyAB"))
    parser.add_argument("--mirror", type=Path, default=Path("/work/.mirror/AlexeyAB+darknet/repo"))
    parser.add_argument("--bigbatch-side", choices=("cli", "inline"), default="cli")
    parser.add_argument("--python", default=sys.executable, help="the Python that runs `-m bigbatch predict`")
    parser.add_argument("--pythonpath", help="PYTHONPATH for the bigbatch command (default: inherited)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", choices=sorted(CFGS), help="these cfgs only")
    args = parser.parse_args()
    darknet = find_darknet(args.darknet_root, args.mirror)
    if darknet is None:
        print(f"skipped: no Darknet at {args.darknet_root} and no snapshot at {args.mirror} to build it from")
        return 0
    root = darknet.parent
    names = root / "data" / "coco.names"
    work = Path(tempfile.mkdtemp(prefix="darknet_predict_"))
    pngs = to_png(sorted((root / "data").glob("*.jpg")), work / "images")
    rows, failed = [], False
    for label, (cfg_name, letter) in CFGS.items():
        if args.only and label not in args.only:
            continue
        folder = work / label.replace(" ", "_").replace("=", "")
        folder.mkdir()
        cfg = root / "cfg" / cfg_name
        if letter:
            cfg = letterboxed_cfg(cfg, folder / cfg_name)
        weights, seed, obj, cls = make_weights(cfg, pngs, folder / "seeded.weights", args.seed)
        theirs, darknet_s = darknet_side(darknet, cfg, weights, pngs, names, folder)
        if args.bigbatch_side == "inline":
            ours, ours_s = bigbatch_inline(cfg, weights, pngs)
        else:
            ours, ours_s = bigbatch_cli(cfg, weights, pngs, names, folder, args.python, args.pythonpath)
        n_theirs, n_ours, box_error, score_error, problems = compare(theirs, ours)
        failed |= bool(problems)
        for problem in problems:
            print(f"{label}: {problem}")
        rows.append((label, len(pngs), f"{n_theirs}/{n_ours}", f"{box_error:.4f}", f"{score_error:.2e}",
                     f"{darknet_s:.1f}", f"{ours_s:.1f}", f"seed {seed}, obj {obj:+.2f}, cls {cls:+.1f}",
                     "FAIL" if problems else "ok"))
    header = ("cfg", "images", "detections (Darknet/bigbatch)", "max box error px", "max score error",
              "Darknet s", "bigbatch s", "weights", "")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"bigbatch side: {args.bigbatch_side}; work folder {work}")
    for r in [header, *rows]:
        print("  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
