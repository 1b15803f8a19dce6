"""AlexeyAB Darknet's mosaic (``data.mosaic``, ``data.mosaic_bound``; ``data/transforms/mosaic.py``): boxes follow their
pixels under every cut, shift and flip, read back from painted images; the draws come from the sample's seed; ``mosaic:
0`` leaves every sample as it was; a ``.cfg``'s ``mosaic=1`` is ``data.mosaic: 0.5``; bad values name the key.

The oracle is the image itself: each source box is a solid rectangle of its own colour (one channel 255, the others
0, 80 or 160) on black, three pixels at least from any other box. A pixel of a box's colour can only come from that
box, so after the mosaic each kept box must hold its colour inside (away from the resampled edges), and its colour
must appear nowhere outside the kept boxes of its label: a box cut to less than a pixel, and so dropped, leaves no
pixel of its own colour."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors

from bigbatch.config import load_config
from bigbatch.darknet.cfg import ignored_keys, read_darknet_cfg
from bigbatch.data.formats.detection import DetectionDataset, DetectionRecord
from bigbatch.data.pipeline.order import sample_rng
from bigbatch.data.transforms.det_transforms import clamp_and_sanitize, train_transform
from bigbatch.data.transforms.mosaic import Mosaic, compose, draw_cut, draw_plan
from bigbatch.errors import UserError
from tests.helpers import net_header

pytestmark = pytest.mark.fast

PALETTE = torch.tensor([c for c in itertools.product((0, 80, 160, 255), repeat=3) if 255 in c and c.count(255) == 1],
                       dtype=torch.int16)
"""27 colours, each with exactly one channel at 255: a blend with black or with another box (through a black gap)
never reaches 255, so it never passes for a box colour."""
SIZE = 64
GAP = 3


def painted_set(count: int = 7, seed: int = 0) -> list[tuple[tv_tensors.Image, dict]]:
    """``count`` images of 36..100 px a side, black, each with 1-4 solid boxes (some on the image's edge), box ``i``
    of the whole set with label ``i`` and colour ``PALETTE[i]``."""
    rng = np.random.default_rng(seed)
    samples, label = [], 0
    for _ in range(count):
        h, w = (int(v) for v in rng.integers(36, 101, 2))
        pixels = torch.zeros(3, h, w, dtype=torch.uint8)
        boxes: list[list[int]] = []
        for _ in range(int(rng.integers(1, 5))):
            for _ in range(50):  # a free place, GAP pixels from the others
                bw, bh = int(rng.integers(6, w // 2)), int(rng.integers(6, h // 2))
                x, y = int(rng.integers(0, w - bw + 1)), int(rng.integers(0, h - bh + 1))
                if all(x + bw + GAP <= b[0] or b[2] + GAP <= x or y + bh + GAP <= b[1] or b[3] + GAP <= y
                       for b in boxes):
                    boxes.append([x, y, x + bw, y + bh])
                    pixels[:, y:y + bh, x:x + bw] = PALETTE[label].view(3, 1, 1).to(torch.uint8)
                    label += 1
                    break
        first = label - len(boxes)
        target = {"boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32), format="XYXY",
                                                    canvas_size=(h, w)),
                  "labels": torch.arange(first, label), "image_id": len(samples)}
        samples.append((tv_tensors.Image(pixels), target))
    assert label <= len(PALETTE)
    return samples


def to_uint8(image: torch.Tensor) -> torch.Tensor:
    return (image * 255).round().to(torch.int16)


def colour_map(pixels: torch.Tensor) -> torch.Tensor:
    """Each pixel's label where it has a box colour (every channel within 1), else -1."""
    close = ((pixels.unsqueeze(0) - PALETTE.view(-1, 3, 1, 1)).abs() <= 1).all(dim=1)  # [colours, H, W]
    return torch.where(close.any(dim=0), close.int().argmax(dim=0), torch.tensor(-1))


def centres_within(box: torch.Tensor, inset: tuple[float, float]) -> tuple[slice, slice]:
    """The rows and columns whose pixel centres lie ``inset`` (x, y) inside ``box`` (a negative inset: outside)."""
    x1, y1, x2, y2 = box.tolist()
    cols = [i for i in range(SIZE) if x1 + inset[0] <= i + 0.5 <= x2 - inset[0]]
    rows = [i for i in range(SIZE) if y1 + inset[1] <= i + 0.5 <= y2 - inset[1]]
    return (slice(rows[0], rows[-1] + 1) if rows else slice(0, 0)), (slice(cols[0], cols[-1] + 1) if cols
                                                                      else slice(0, 0))


def quadrant_of(plan, box: torch.Tensor) -> int:
    cx, cy = float(box[0] + box[2]) / 2, float(box[1] + box[3]) / 2
    for k in range(4):
        top, left, h, w = plan.quadrant(k)
        if left <= cx <= left + w and top <= cy <= top + h:
            return k
    raise AssertionError(f"box {box.tolist()} lies in no quadrant")


@pytest.mark.parametrize("resize", [1.0, 1.5])
def test_boxes_follow_their_pixels_under_every_cut_shift_and_flip(resize):
    """Over 150 mosaics of 4 images drawn from the painted set (jitter 0.3: windows in and out of the image, flips,
    moves to the corner; with AlexeyAB's ``resize`` 1.5 a zoom of each window too, some of them left empty and so
    whole), with ``mosaic_bound``: every kept box lies in one quadrant and holds only its colour away from its
    resampled edges, its colour appears nowhere else, and the boxes dropped are those cut under a pixel."""
    samples = painted_set()
    seen = {"flipped": 0, "padded": 0, "dropped": 0, "cut": 0, "kept": 0}
    for seed in range(150):
        torch.manual_seed(seed)
        chosen = [samples[int(i)] for i in torch.randint(len(samples), (4,))]
        plan = draw_plan([s[0].shape[-2:] for s in chosen], (SIZE, SIZE), jitter=0.3, flip=0.5, resize=resize)
        image, raw = compose(chosen, plan, bound=True)
        image, target = clamp_and_sanitize()(image, raw)
        assert image.shape == (3, SIZE, SIZE) and image.dtype == torch.float32
        pixels, boxes, labels = to_uint8(image), target["boxes"], target["labels"]
        sides = raw["boxes"][:, 2:] - raw["boxes"][:, :2]
        wide_enough = (sides >= 1).all(dim=1)
        assert torch.equal(raw["boxes"][wide_enough], boxes) and torch.equal(raw["labels"][wide_enough], labels)
        labelled = colour_map(pixels)
        allowed = torch.zeros(len(PALETTE), SIZE, SIZE, dtype=torch.bool)
        for box, label in zip(boxes, labels.tolist(), strict=True):
            piece = plan.pieces[quadrant_of(plan, box)]
            top, left, h, w = plan.quadrant(quadrant_of(plan, box))
            assert left <= box[0] and box[2] <= left + w and top <= box[1] and box[3] <= top + h  # mosaic_bound
            # a resampled edge blends over half a source pixel (upsampling) or one output pixel (antialiased)
            inset = tuple(max(SIZE / side / 2, 1.0) + 0.01 for side in (piece.window[3], piece.window[2]))
            rows, cols = centres_within(box, inset)
            assert (labelled[rows, cols] == label).all(), f"seed {seed}: box {box.tolist()} holds other pixels"
            rows, cols = centres_within(box, (-0.01, -0.01))
            allowed[label, rows, cols] = True
            seen["cut"] += bool(((box[[0, 2]] - plan.cut[1]).abs() < 1e-4).any()
                                or ((box[[1, 3]] - plan.cut[0]).abs() < 1e-4).any())
        for label in labelled.unique().tolist():
            if label >= 0:
                stray = (labelled == label) & ~allowed[label]
                assert not stray.any(), f"seed {seed}: colour of label {label} outside its kept boxes"
        seen["flipped"] += sum(p.flip for p in plan.pieces)
        seen["padded"] += sum(top < 0 or left < 0 or top + h > s[0].shape[-2] or left + w > s[0].shape[-1]
                              for (top, left, h, w), s in zip((p.window for p in plan.pieces), chosen, strict=True))
        seen["dropped"] += int((~wide_enough & (sides > 0).all(dim=1)).sum())  # cut, not gone
        seen["kept"] += len(boxes)
        seen["beyond the jitter"] = seen.get("beyond the jitter", 0) + sum(  # the zoom's windows only
            not 0.4 * s[0].shape[-1] - 1 <= p.window[3] <= 1.6 * s[0].shape[-1] + 1
            for p, s in zip(plan.pieces, chosen, strict=True))
    zoomed = seen.pop("beyond the jitter")
    assert min(seen.values()) > 10, seen  # every case happened, many times
    assert (zoomed > 10) if resize != 1.0 else zoomed == 0


def test_without_mosaic_bound_boxes_reach_over_their_quadrant_only_as_darknet_lets_them():
    """``mosaic_bound`` off (Darknet's default): the same pixels, each box clipped to the image instead of its
    quadrant; clipped to its quadrant it is the ``mosaic_bound`` box."""
    samples = painted_set()
    counts = [len(t["labels"]) for _, t in samples]
    over = 0
    for seed in range(60):
        torch.manual_seed(seed)
        picks = [int(i) for i in torch.randint(len(samples), (4,))]
        chosen = [samples[i] for i in picks]
        plan = draw_plan([s[0].shape[-2:] for s in chosen], (SIZE, SIZE), jitter=0.3, flip=0.5)
        bound_image, bound = compose(chosen, plan, bound=True)
        free_image, free = compose(chosen, plan, bound=False)
        assert torch.equal(bound_image, free_image) and torch.equal(bound["labels"], free["labels"])
        quadrant = torch.repeat_interleave(torch.arange(4), torch.tensor([counts[i] for i in picks]))
        for k, box_b, box_f in zip(quadrant.tolist(), bound["boxes"], free["boxes"], strict=True):
            top, left, h, w = plan.quadrant(k)
            clipped = torch.stack([box_f[0].clamp(left, left + w), box_f[1].clamp(top, top + h),
                                   box_f[2].clamp(left, left + w), box_f[3].clamp(top, top + h)])
            assert torch.allclose(clipped, box_b, atol=1e-4)
            assert (box_f >= 0).all() and (box_f <= SIZE).all()
            sides = box_b[2:] - box_b[:2]
            over += bool((sides >= 1).all() and not torch.allclose(box_f, box_b, atol=1e-4))
    assert over > 0  # some boxes do reach over a neighbour's pixels


def test_the_cut_point_is_darknets():
    """``cut_x = rand_int(w * 0.2, w * 0.8)``, both ends included: 416 takes 83..332."""
    torch.manual_seed(0)
    cuts = {draw_cut(416, 100) for _ in range(4000)}
    ys, xs = {c[0] for c in cuts}, {c[1] for c in cuts}
    assert min(ys) == 83 and max(ys) == 332 and min(xs) == 20 and max(xs) == 80 and len(xs) == 61


# --------------------------------------------------------------------------- the dataset: seeds, workers, resume


def write_records(root, samples) -> list[DetectionRecord]:
    """The painted images as PNG files (lossless) and their records."""
    records = []
    for i, (image, target) in enumerate(samples):
        path = root / f"{i}.png"
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(path)
        records.append(DetectionRecord(path=str(path), width=image.shape[-1], height=image.shape[-2],
                                       boxes=target["boxes"].numpy(), labels=target["labels"].numpy(), image_id=i))
    return records


DARKNET_AUGMENT = {"jitter": 0.3, "hue": 0.1, "saturation": 1.5, "exposure": 1.5, "flip": 0.5}


def test_a_mosaic_depends_on_the_sample_seed_alone(tmp_path):
    """The same key gives the same sample from two datasets (two workers), in any order; about ``p`` of the samples
    are mosaics (their boxes come from several images); another seed gives another sample."""
    records = write_records(tmp_path, painted_set())
    first = DetectionDataset(records, train_transform("letterbox", SIZE, mosaic=0.5, **DARKNET_AUGMENT))
    second = DetectionDataset(records, train_transform("letterbox", SIZE, mosaic=0.5, **DARKNET_AUGMENT))
    keys = [(i % len(records), SIZE, 1000 + i) for i in range(40)]
    outputs = {key: first[key] for key in keys}
    mosaics = 0
    for key in reversed(keys):
        image, target = second[key]
        expected_image, expected_target = outputs[key]
        assert torch.equal(image, expected_image) and torch.equal(target["boxes"], expected_target["boxes"])
        assert torch.equal(target["labels"], expected_target["labels"]) and target["image_id"] == key[0]
        own = set(records[key[0]].labels.tolist())
        mosaics += not set(target["labels"].tolist()) <= own
    assert 10 <= mosaics <= 30
    other = first[(0, SIZE, 1)]
    assert not torch.equal(other[0], first[(0, SIZE, 2)][0])
    assert first[(0, 32, 1)][0].shape == (3, 32, 32)  # the step's multi-scale size


def test_mosaic_zero_changes_nothing_bit_for_bit(tmp_path):
    """``mosaic: 0`` (the default) draws nothing: each sample is the transform's output under its seed, exactly as
    before mosaic existed; the draw for ``p`` in (0, 1) is one number, none at 0 or 1."""
    records = write_records(tmp_path, painted_set())
    plain = train_transform("letterbox", SIZE, **DARKNET_AUGMENT)
    off = DetectionDataset(records, train_transform("letterbox", SIZE, mosaic=0.0, **DARKNET_AUGMENT))
    assert off.transform.mosaic is None
    for index, seed in [(0, 5), (3, 6), (6, 7)]:
        image, target = DetectionDataset(records)[index]
        with sample_rng(seed):
            expected_image, expected_target = plain(image, target, SIZE)
        out_image, out_target = off[(index, SIZE, seed)]
        assert torch.equal(out_image, expected_image) and torch.equal(out_target["boxes"], expected_target["boxes"])
    for p, draws in [(0.0, 0), (1.0, 0), (0.3, 1)]:
        torch.manual_seed(0)
        Mosaic(p, SIZE).chosen()
        after = torch.rand(())
        torch.manual_seed(0)
        torch.rand(draws)
        assert torch.equal(after, torch.rand(()))
    torch.manual_seed(0)
    assert 0.25 < sum(Mosaic(0.3, SIZE).chosen() for _ in range(2000)) / 2000 < 0.35
    assert load_config("shapes-detect").data.mosaic == 0.0 and not load_config("shapes-detect").data.mosaic_bound


def test_training_uses_mosaic_and_evaluation_never(tmp_path):
    """A ``yolo`` set on disk with ``data.mosaic: 1``: every training sample is a mosaic of ``size x size``;
    validation samples are the plain evaluation resize."""
    from bigbatch.tasks.detection import DetectionTask

    samples = painted_set()
    for split in ("train", "val"):
        (tmp_path / split / "images").mkdir(parents=True)
        (tmp_path / split / "labels").mkdir()
        for record in write_records(tmp_path / split / "images", samples):
            h, w = record.height, record.width
            lines = [f"0 {(b[0] + b[2]) / 2 / w} {(b[1] + b[3]) / 2 / h} {(b[2] - b[0]) / w} {(b[3] - b[1]) / h}"
                     for b in record.boxes.tolist()]
            name = record.path.rsplit("/", 1)[1].replace(".png", ".txt")
            (tmp_path / split / "labels" / name).write_text("\n".join(lines) + "\n")
    (tmp_path / "classes.txt").write_text("box\n")
    cfg = load_config("shapes-detect", [f"data.path={tmp_path}", "data.name=yolo", f"data.size={SIZE}",
                                        "data.resize=shorter_side", "data.mosaic=1", "data.mosaic_bound=true"])
    task = DetectionTask.from_config(cfg)
    assert task.train_set.transform.mosaic.p == 1.0 and task.train_set.transform.mosaic.bound
    assert getattr(task.val_set.transform, "mosaic", None) is None
    for key in task.sample_keys(3, [0, 1, 2]):
        image, target = task.train_set[key]
        assert image.shape == (3, SIZE, SIZE)  # a mosaic is square, whatever data.resize
        assert torch.equal(image, task.train_set[key][0])
    image, target = task.val_set[0]
    assert min(image.shape[-2:]) == SIZE and "image_region" in target


# --------------------------------------------------------------------------- configs and .cfg files

YOLO_NET = ("\n[convolutional]\nfilters=4\nsize=3\npad=1\nactivation=leaky\n"
            "\n[convolutional]\nfilters=14\nsize=1\nactivation=linear\n"
            "\n[yolo]\nmask=0,1\nanchors=1,2, 3,4\nclasses=2\nnum=2\n")


def write_cfg(tmp_path, net_keys: str, body: str = YOLO_NET):
    path = tmp_path / "net.cfg"
    path.write_text(net_header(64, 64, 3) + "max_batches=10\n" + net_keys + body)
    return path


def test_a_cfg_with_mosaic_maps_to_data_mosaic(tmp_path):
    """``mosaic=1`` is AlexeyAB's half of the samples (``data.mosaic: 0.5``), ``mosaic_bound=1`` is
    ``data.mosaic_bound``; a detector uses both (``show`` no longer lists them), a classifier does not."""
    cfg = load_config(str(write_cfg(tmp_path, "mosaic=1\nmosaic_bound=1\nangle=0\n")))
    assert cfg.data.mosaic == 0.5 and cfg.data.mosaic_bound is True
    assert ignored_keys(read_darknet_cfg(tmp_path / "net.cfg")) == ["net:angle"]
    cfg = load_config(str(write_cfg(tmp_path, "mosaic=0\n")))
    assert cfg.data.mosaic == 0.0 and cfg.data.mosaic_bound is False
    classifier = "\n[convolutional]\nfilters=4\nsize=1\nactivation=linear\n\n[avgpool]\n\n[softmax]\n"
    assert ignored_keys(read_darknet_cfg(write_cfg(tmp_path, "mosaic=1\n", classifier))) == ["net:mosaic"]


@pytest.mark.parametrize(("setting", "message"), [
    ("data.mosaic=1.5", r"^data\.mosaic: input should be less than or equal to 1, got 1\.5$"),
    ("data.mosaic=-0.5", r"^data\.mosaic: input should be greater than or equal to 0, got -0\.5$"),
    ("data.mosaic_bound=sometimes", r"^data\.mosaic_bound: input should be a valid boolean, got 'sometimes'$"),
])
def test_a_bad_value_names_the_key(setting, message):
    with pytest.raises(UserError, match=message):
        load_config("shapes-detect", [setting])


def test_a_bad_cfg_value_names_the_line(tmp_path):
    with pytest.raises(UserError, match=r"net\.cfg:7: \[net\] mosaic: expected an integer between 0 and 1, not .2.$"):
        load_config(str(write_cfg(tmp_path, "mosaic=2\n")))
