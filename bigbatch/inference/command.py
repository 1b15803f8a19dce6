"""``bigbatch predict SOURCE... --from MODEL``: the command, from its checks to its last line.

1. Every output is checked (``inference/outputs.py``) and every source listed (``inference/sources.py``) before the
   model is loaded; a mistake is one ``UserError``.
2. The model is loaded (``inference/loading.py``) and its predictions made in batches (``inference/predictor.py``):
   images in the order listed, a video's frames in its place. An image or video that cannot be read is reported
   once, named, and skipped; the rest go on.
3. A progress bar on a terminal; then one line: the images, the images per second, and the files written.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bigbatch.inference.predictor import Item, Unreadable
from bigbatch.inference.sources import SourceFile


@dataclass
class PredictArgs:
    """The command line of ``bigbatch predict`` (``cli.py`` parses it)."""

    sources: list[str]
    model: str
    out: Path
    weights: str | None = None
    weights_from: str | None = None
    names: str | None = None
    coco: Path | None = None
    annotations: Path | None = None
    txt: bool = False
    save_images: bool = False
    conf: float | None = None
    iou: float | None = None
    max_det: int | None = None
    top_k: int | None = None
    size: int | None = None
    batch: int | None = None
    device: str | None = None
    vid_stride: int = 1
    darknet_dialect: str | None = None
    overrides: list[str] | None = None


def warn(line: str) -> None:
    print(f"warning: {line}", file=sys.stderr, flush=True)


def predict(args: PredictArgs) -> list[str]:
    """Run the command (see the module docstring); -> the lines to print at the end."""
    from bigbatch.errors import UserError, named_as
    from bigbatch.inference.loading import load
    from bigbatch.inference.outputs import Outputs
    from bigbatch.inference.sources import expand_sources

    for key, value, low in (("--conf", args.conf, 0.0), ("--iou", args.iou, 0.0)):
        if value is not None and not low <= value <= 1:
            raise UserError(f"{key}: expected a number in [0, 1], got {value}")
    for key, value in (("--max-det", args.max_det), ("--top-k", args.top_k), ("--batch", args.batch),
                       ("--size", args.size), ("--vid-stride", args.vid_stride)):
        if value is not None and not 1 <= value <= 1 << 20:
            raise UserError(f"{key}: expected a whole number from 1 to {1 << 20}, got {value}")
    from bigbatch.floor.outputs import check_output_file
    from bigbatch.inference.outputs import check_out_dir

    check_out_dir(args.out)
    if args.coco is not None:
        check_output_file(args.coco, "--coco")
    sources = expand_sources(args.sources, warn)
    if any(source.video for source in sources):
        from bigbatch.inference.video import require_video

        require_video()
    with named_as("--from", instead_of="checkpoint"):  # the checkpoint is the one --from names
        model = load(args.model, weights=args.weights, weights_from=args.weights_from, names=args.names,
                     device=args.device, size=args.size, overrides=args.overrides, dialect=args.darknet_dialect)
    if args.iou is not None and getattr(model.module, "fixed_thresholds", False):
        raise UserError(f"--iou: {args.model}'s NMS threshold was fixed when it was exported "
                        f"({model.settings.iou}); export again from the run to change it")
    outputs = Outputs(args.out, model.classes, model.task, txt=args.txt, save_images=args.save_images,
                      coco=args.coco, annotations=args.annotations)
    settings = model.settings_with(conf=args.conf, iou=args.iou, max_det=args.max_det, top_k=args.top_k,
                                   batch=args.batch)
    files = f"{len(sources)} file{'' if len(sources) == 1 else 's'}"
    print(f"predicting with the {model.task} model: {model.source}; {files}", flush=True)
    outputs.open()
    started, unreadable = time.perf_counter(), 0
    try:
        with _progress(sources) as bar:
            for item, record in model.records(_items(sources, args.vid_stride), settings):
                if isinstance(record, Unreadable):
                    unreadable += 1
                    warn(f"{item.file}: {record.reason}: skipped")
                    continue
                outputs.add(record, _pixels(item) if args.save_images else None)
                bar.update(1)
    except KeyboardInterrupt:  # Ctrl-C: the files written so far listed as predict's, for the next predict
        outputs.close(complete=False)
        raise
    elapsed = max(time.perf_counter() - started, 1e-9)
    written = outputs.close()
    count = outputs.count
    skipped = f"; {unreadable} unreadable, skipped" if unreadable else ""
    images = f"{count} image{'' if count == 1 else 's'}"
    return [f"{images} in {elapsed:.1f} s ({count / elapsed:.1f} images/s){skipped}; written: "
            f"{', '.join(str(path) for path in written)}"]


def _items(sources: list[SourceFile], vid_stride: int) -> Iterator[Item]:
    """The images, and each video's frames, in order; a video that cannot be read is reported and skipped."""
    for source in sources:
        if not source.video:
            yield Item(file=source.path)
            continue
        from bigbatch.inference.video import video_frames

        try:
            for frame, pixels in video_frames(source.path, vid_stride):
                yield Item(file=source.path, frame=frame, pixels=pixels.contiguous())
        except RuntimeError as error:  # it names the file, and the frame where decoding stopped
            warn(f"{error}; skipped")


def _pixels(item: Item):
    """The image to draw on: the frame's pixels, or the file decoded again."""
    from bigbatch.data.pipeline.images import decode_shown

    return item.pixels if item.pixels is not None else decode_shown(item.file)


def _progress(sources: list[SourceFile]):
    """A progress bar over the images (a video's frames count as they come) on a terminal, else nothing shown."""
    from tqdm import tqdm

    images = sum(not source.video for source in sources)
    return tqdm(total=images if images == len(sources) else None, unit="img", disable=not sys.stderr.isatty(),
                leave=False)
