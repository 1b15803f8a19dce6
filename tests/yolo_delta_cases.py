"""The cases on which bigbatch's Darknet-dialect YOLO loss is compared with Darknet's own ``l.delta``: shared by
``benchmarks/darknet_oracle/yolo_deltas.py`` (which runs Darknet on them and writes
``tests/data/darknet/yolo_delta/<case>.npz``) and ``tests/test_yolo_dialects.py`` (which reads those files).

A case is a stock cfg of one fork, at an input size and batch, with ``[yolo]`` keys optionally overridden (to reach
keys no small stock cfg combines), the truths of each image, and the inputs of each ``[yolo]`` layer by the INPUT
RULE below.

INPUT RULE: value ``k`` (0-based over the layer's ``(N, A, 5 + C, H, W)`` input, C order) of the ``[yolo]`` layer
at index ``i`` is ``u(k + 7919 i + salt)`` mapped per channel: box x, y, w, h and objectness ``6u - 3``; classes
``6u - 3`` in cells whose ``cell_low`` bit is 0, else ``1.5u - 3`` (every class probability under 0.25: AlexeyAB's
``compare_yolo_class`` fails there). With ``new_coords`` (the inputs are already logistic outputs) ``u`` and
``0.2u`` instead. ``u(k) = (hash32(k) >> 8) / 2**24`` with the oracle's hash32 (benchmarks/darknet_oracle/README.md).
Then the PLANTED predictions of :func:`_plant` replace the box inputs of a few slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bigbatch.darknet.cfg import Yolo

STOCK = "tests/data/darknet/stock"

# truths per image: (x, y, w, h, class), fractions of the input, in the order Darknet sees them
TRUTHS = (
    (  # two truths on one cell and (nearly) one shape: the same anchor twice; one more of another class
        (0.30, 0.30, 0.20, 0.25, 3), (0.32, 0.31, 0.21, 0.24, 7), (0.70, 0.62, 0.45, 0.30, 3),
        (0.12, 0.85, 0.06, 0.08, 0),
    ),
    (  # small and large, near the borders
        (0.97, 0.04, 0.05, 0.07, 79), (0.50, 0.50, 0.90, 0.85, 12), (0.05, 0.55, 0.10, 0.40, 1),
        (0.60, 0.20, 0.15, 0.15, 12), (0.61, 0.21, 0.15, 0.16, 12),
    ),
    (  # one truth only, one image with none
        (0.44, 0.66, 0.33, 0.22, 5),
    ),
    (),
)


@dataclass(frozen=True)
class Case:
    name: str
    fork: str  # alexeyab | pjreddie
    cfg: str  # under STOCK/<fork>/
    size: int
    keys: dict[str, str] = field(default_factory=dict)  # [yolo] keys set in every [yolo] section
    salt: int = 0

    @property
    def images(self) -> int:
        return len(TRUTHS)


COUNTERS = ", ".join(str(100 + 37 * c % 900) for c in range(80))
CASES = (
    Case("alexeyab-yolov3-tiny", "alexeyab", "yolov3-tiny.cfg", 128),
    Case("alexeyab-yolov4-tiny", "alexeyab", "yolov4-tiny.cfg", 128, salt=11),
    Case("alexeyab-yolov4-csp", "alexeyab", "yolov4-csp.cfg", 128, salt=23),
    Case("alexeyab-yolov4-csp-mse", "alexeyab", "yolov4-csp.cfg", 128, {"iou_loss": "mse"}, salt=29),
    Case("alexeyab-yolov3-tiny-giou-keys", "alexeyab", "yolov3-tiny.cfg", 128, {
        "iou_loss": "giou", "iou_normalizer": "0.5", "iou_thresh": "0.3", "iou_thresh_kind": "giou",
        "label_smooth_eps": "0.1", "counters_per_class": COUNTERS, "max_delta": "3", "truth_thresh": "0.6",
        "obj_normalizer": "0.7", "scale_x_y": "1.1"}, salt=31),
    Case("alexeyab-yolov3-tiny-focal-diou", "alexeyab", "yolov3-tiny.cfg", 128, {
        "iou_loss": "diou", "iou_normalizer": "0.25", "focal_loss": "1", "objectness_smooth": "1",
        "iou_thresh": "0.25", "ignore_thresh": "0.4"}, salt=37),
    Case("alexeyab-yolov3-tiny-iou", "alexeyab", "yolov3-tiny.cfg", 128, {"iou_loss": "iou", "truth_thresh": "0.5"},
         salt=41),
    Case("pjreddie-yolov3-tiny", "pjreddie", "yolov3-tiny.cfg", 128, salt=43),
    Case("pjreddie-yolov3-tiny-truth-thresh", "pjreddie", "yolov3-tiny.cfg", 128, {"truth_thresh": "0.6"}, salt=47),
)


def hash32(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def uniform(k: np.ndarray) -> np.ndarray:
    return (hash32(k) >> np.uint32(8)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def layer_input(case: Case, index: int, spec: Yolo, height: int, width: int) -> np.ndarray:
    """The INPUT RULE: the ``(N, A * (5 + C), H, W)`` float32 input of the ``[yolo]`` layer ``spec`` at ``index``."""
    shape = (case.images, len(spec.mask), 5 + spec.classes, height, width)
    k = np.arange(int(np.prod(shape)), dtype=np.uint64) + np.uint64(7919 * index + case.salt)
    u = uniform((k % np.uint64(2**32)).astype(np.uint32)).reshape(shape)
    cell = np.arange(shape[0] * shape[1] * height * width, dtype=np.uint32).reshape(shape[0], shape[1], 1, height,
                                                                                     width)
    low = (hash32(cell + np.uint32(case.salt)) & np.uint32(1)).astype(bool)
    if spec.new_coords:
        x = u.copy()
        x[:, :, 5:] = np.where(low, np.float32(0.2) * u[:, :, 5:], u[:, :, 5:])
    else:
        x = np.float32(6) * u - np.float32(3)
        x[:, :, 5:] = np.where(low, np.float32(1.5) * u[:, :, 5:] - np.float32(3), x[:, :, 5:])
    _plant(x, case, spec, height, width)
    return x.astype(np.float32).reshape(shape[0], -1, height, width)


def _plant(x: np.ndarray, case: Case, spec: Yolo, height: int, width: int) -> None:
    """PLANTED predictions: for every other truth (the 1st, 3rd, ...) of an image, the anchor slot ``t % A`` of the
    truth's cell predicts the truth's box, moved by 3 % of its size and 10 % larger (IoU about 0.8: above
    ``ignore_thresh``, and above ``truth_thresh`` where a case sets it under 0.8)."""
    s = spec.scale_x_y
    for b, truths in enumerate(TRUTHS):
        for t, (bx, by, bw, bh, _) in enumerate(truths):
            if t % 2:
                continue
            a = t % len(spec.mask)
            i, j = min(int(bx * width), width - 1), min(int(by * height), height - 1)
            aw, ah = spec.anchors[spec.mask[a]]
            fx = min(max(bx * width - i + 0.03 * bw * width, 0.02), 0.98)
            fy = min(max(by * height - j + 0.03 * bh * height, 0.02), 0.98)
            w, h = 1.1 * bw * case.size / aw, 1.1 * bh * case.size / ah
            if spec.new_coords:
                values = [(fx + (s - 1) / 2) / s, (fy + (s - 1) / 2) / s, np.sqrt(w / 4), np.sqrt(h / 4)]
            else:
                values = [np.log(v / (1 - v)) for v in ((fx + (s - 1) / 2) / s, (fy + (s - 1) / 2) / s)]
                values += [np.log(w), np.log(h)]
            x[b, a, :4, j, i] = np.float32(values)


def cfg_text(text: str, size: int, keys: dict[str, str], batch: int = 1) -> str:
    """``text`` with the ``[net]`` width/height set to ``size``, its batch to ``batch`` (subdivisions 1: Darknet
    allocates its layers for batch / subdivisions images) and ``keys`` set in every ``[yolo]`` section (replacing
    a key given there, else added at the section's end)."""
    out: list[str] = []
    section = ""
    pending: dict[str, str] = {}

    def close() -> None:
        if section == "yolo":
            out.extend(f"{k}={v}" for k, v in pending.items())

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            close()
            section = stripped.strip("[]").strip().lower()
            pending = dict(keys)
            out.append(line)
            continue
        key = stripped.split("=", 1)[0].strip() if "=" in stripped and not stripped.startswith("#") else ""
        if section == "net" and key in ("width", "height", "batch", "subdivisions"):
            out.append(f"{key}={ {'batch': batch, 'subdivisions': 1}.get(key, size)}")
        elif section == "yolo" and key in pending:
            out.append(f"{key}={pending.pop(key)}")
        else:
            out.append(line)
    close()
    return "\n".join(out) + "\n"
