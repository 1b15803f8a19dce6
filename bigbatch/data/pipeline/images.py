"""Image files checked before a run and decoded during it: the header read (size, format and, where asked, the EXIF
orientation) without decoding, the decode itself (torchvision), and a decoder's error as a short reason.

Loading reads only image headers (PIL), of regular files opened without blocking (``files.open_regular``); a corrupt
body is found when the sample is decoded. In strict mode the loaders decode every image up front instead
(``inspect_image(path, decode=True)``).

EXIF orientation: a camera stores a photo's pixels as its sensor read them and says in the EXIF Orientation tag (274)
how they are to be shown; a phone photo held upright (Orientation 6) is stored 100 x 50 and shown 50 x 100. The decode
here gives the stored pixels; :func:`orient` turns them as shown (PIL's ``ImageOps.exif_transpose``), and
:func:`boxes_to_displayed` / :func:`boxes_to_stored` carry boxes between the two. Who reads the tag decides which
image a box describes: YOLO labels the image as shown (``darknet/yolo_data.py``), a COCO file the stored pixels.
"""

from __future__ import annotations

import io
import os
import re
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image

from bigbatch.data.pipeline import jpeg
from bigbatch.data.pipeline.files import open_regular, read_regular

T = TypeVar("T")
DECODABLE = ("GIF", "JPEG", "PNG", "WEBP")  # the formats torchvision.io.decode_image reads (PIL's names)
BY_PIL = ("BMP",)
"""Formats torchvision does not decode and PIL does, as Darknet (stb_image, OpenCV) and Ultralytics read them: a
Windows bitmap, decoded by PIL (its pixel count bounded by PIL's ``MAX_IMAGE_PIXELS``)."""
JPEG_KINDS = ("MPO",)
"""What PIL names a JPEG with more pictures after the first (a phone camera's Multi-Picture Object: a depth map, a
preview): a JPEG to every decoder, which reads its first picture, the photo."""
ORIENTATION_TAG = 0x0112  # EXIF's Orientation (274), values 1-8 (Exif 2.32, after TIFF 6.0)
TRANSPOSED = (5, 6, 7, 8)
"""The orientations shown with width and height swapped (Exif 2.32: the 0th row is the visual left or right side)."""
MIRRORED_X = (2, 3, 6, 7)
MIRRORED_Y = (3, 4, 7, 8)
"""After the transpose of :data:`TRANSPOSED`, the orientations whose shown image is the stored one flipped left to
right, and top to bottom: PIL's ``ImageOps.exif_transpose`` (2 FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM,
5 TRANSPOSE, 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90) written as a transpose and flips."""


def error_reason(error: Exception) -> str:
    """torchvision's message without its C++ source location (``decode_jpeg, /path/file.cpp:171, ...``), and PIL's
    without the in-memory file it read (``cannot identify image file <_io.BytesIO object at 0x...>``): the caller
    names the file."""
    reason = re.sub(r"^\w+, \S+:\d+, ", "", str(error))
    return re.sub(r"\s*<_io\.BytesIO object at 0x[0-9a-fA-F]+>", "", reason).strip()


def decode_bytes(data: bytearray) -> torch.Tensor:
    """An image file's bytes decoded as uint8 [3, H, W] RGB: a JPEG by the region decode over the whole image where
    it was built (``data/pipeline/jpeg.py``: torchvision's pixels bit for bit, and silent, where libjpeg's own warnings,
    such as "Corrupt JPEG data: premature end of data segment", would print on stderr above bigbatch's one line), else
    by torchvision. A file that does not decode is a ``RuntimeError`` with the reason."""
    try:
        size = jpeg.region_size(data)
        if size is not None:
            return jpeg.decode_region(data, 0, 0, *size).contiguous()
        if bytes(data[:2]) == b"BM":  # a bitmap (BY_PIL)
            return _decode_by_pil(data)
        return decode_image(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB)
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise RuntimeError(str(error)) from None


def _decode_by_pil(data: bytearray) -> torch.Tensor:
    """A format of :data:`BY_PIL` decoded by PIL as uint8 [3, H, W] RGB (``OSError``: not decodable)."""
    with Image.open(io.BytesIO(data)) as image:
        if image.format not in BY_PIL:
            raise ValueError(f"not a {' or '.join(BY_PIL)} file")
        pixels = np.asarray(image.convert("RGB"))
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()


def decode_shown(path: str) -> torch.Tensor:
    """The image file at ``path`` decoded as it is shown: its stored pixels (:func:`decode_bytes`) turned by its EXIF
    orientation (:func:`orient`), as an image to predict on is loaded by Ultralytics and by Darknet's OpenCV build
    (``cv::imread`` applies the orientation); boxes found on it are in the shown image's pixels. A file that cannot
    be read or decoded is a ``RuntimeError``."""
    try:
        data = read_regular(path)
    except OSError as error:
        raise RuntimeError(str(error)) from None
    try:
        with Image.open(io.BytesIO(data)) as image:  # the header and its EXIF block only
            orientation = exif_orientation(image)
    except (OSError, ValueError, Image.DecompressionBombError):
        orientation = 1  # the decode says what is wrong with it
    return orient(decode_bytes(data), orientation)


def decode_rgb(path: str) -> torch.Tensor:
    """The image file at ``path`` (a regular file of at most 1 GiB: ``files.read_regular``) decoded as uint8
    [3, H, W] RGB (:func:`decode_bytes`); a file that cannot be read or decoded is a ``RuntimeError``."""
    try:
        data = read_regular(path)
    except OSError as error:
        raise RuntimeError(str(error)) from None
    return decode_bytes(data)


def exif_orientation(image: Image.Image) -> int:
    """The EXIF Orientation (1-8) of an opened image, from the EXIF block PIL read with its header (``info["exif"]``:
    JPEG's APP1 segment, at most 64 KiB; PNG's ``eXIf`` chunk before the pixels; WebP's ``EXIF`` chunk), never
    decoding the pixels (PNG's ``getexif`` would). No block, a broken one, or a value outside 1-8: 1, the stored
    pixels as shown (OpenCV's ``ApplyExifOrientation`` also leaves other values alone)."""
    block = image.info.get("exif")
    return orientation_of_block(block) if isinstance(block, bytes) else 1


def orientation_of_block(block: bytes) -> int:
    """The Orientation tag of an EXIF block, read as Exif 2.32 lays it out (TIFF 6.0's structure): an optional
    ``Exif\\0\\0`` (JPEG's APP1 prefix), the TIFF header (byte order ``II`` or ``MM``, 42, the offset of the first
    IFD), then that IFD: a 2-byte entry count and 12-byte entries (tag, type, count, value), the Orientation a SHORT
    (type 3) of count 1 held in the value's first two bytes. Only that IFD's entries are read, each within the block;
    anything else, or a broken block, is 1. (PIL's ``Image.Exif`` would read every tag, and PNG's ``getexif`` decode
    the pixels first; one tag is all this needs.)"""
    if block.startswith(b"Exif\x00\x00"):
        block = block[6:]
    if len(block) < 8 or block[:2] not in (b"II", b"MM"):
        return 1
    order = "<" if block[:2] == b"II" else ">"
    magic, first = struct.unpack_from(order + "HI", block, 2)
    if magic != 42 or first + 2 > len(block):
        return 1
    (count,) = struct.unpack_from(order + "H", block, first)
    for entry in range(first + 2, min(first + 2 + 12 * count, len(block) - 11), 12):
        tag, kind, values = struct.unpack_from(order + "HHI", block, entry)
        if tag == ORIENTATION_TAG:
            (value,) = struct.unpack_from(order + "H", block, entry + 8)
            return value if kind == 3 and values == 1 and 1 <= value <= 8 else 1
    return 1


def oriented_size(size: tuple[int, int], orientation: int) -> tuple[int, int]:
    """``(width, height)`` of an image turned by ``orientation``: swapped for 5-8 (:data:`TRANSPOSED`). Its own
    inverse: the stored size of a shown one too."""
    return (size[1], size[0]) if orientation in TRANSPOSED else (size[0], size[1])


def orient(pixels: torch.Tensor, orientation: int) -> torch.Tensor:
    """Stored pixels ``[..., H, W]`` as the EXIF ``orientation`` shows them, as PIL's ``ImageOps.exif_transpose``
    turns them: transposed for 5-8, then flipped left to right for 2, 3, 6, 7 and top to bottom for 3, 4, 7, 8
    (6: rotated 90 degrees clockwise). 1 (or any other value): ``pixels`` themselves."""
    if orientation in TRANSPOSED:
        pixels = pixels.transpose(-1, -2)
    dims = [d for d, flipped in ((-1, orientation in MIRRORED_X), (-2, orientation in MIRRORED_Y)) if flipped]
    if dims:
        pixels = pixels.flip(dims)
    return pixels.contiguous() if orientation in TRANSPOSED else pixels


Boxes = TypeVar("Boxes", np.ndarray, torch.Tensor)


def _stacked(like: Boxes, columns: list) -> Boxes:
    return torch.stack(columns, -1) if isinstance(like, torch.Tensor) else np.stack(columns, -1)


def boxes_to_displayed(boxes: Boxes, orientation: int, size: tuple[int, int]) -> Boxes:
    """XYXY boxes ``[..., 4]`` on the stored pixels of an image of stored ``size`` ``(width, height)``, on the image
    as :func:`orient` shows it: a point ``(x, y)`` becomes ``(y, x)`` for 5-8, then ``x -> W' - x`` and ``y -> H' - y``
    for the flips, ``W' x H'`` the shown size (corners re-ordered). Orientation 1: ``boxes`` themselves."""
    if orientation not in range(2, 9):
        return boxes
    x1, y1, x2, y2 = (boxes[..., i] for i in range(4))
    width, height = size
    if orientation in TRANSPOSED:
        x1, y1, x2, y2, width, height = y1, x1, y2, x2, height, width
    if orientation in MIRRORED_X:
        x1, x2 = width - x2, width - x1
    if orientation in MIRRORED_Y:
        y1, y2 = height - y2, height - y1
    return _stacked(boxes, [x1, y1, x2, y2])


def boxes_to_stored(boxes: Boxes, orientation: int, size: tuple[int, int]) -> Boxes:
    """The inverse of :func:`boxes_to_displayed`: XYXY boxes on the image as shown, of shown ``size`` ``(width,
    height)``, on its stored pixels (the flips undone in the shown image, then the transpose)."""
    if orientation not in range(2, 9):
        return boxes
    x1, y1, x2, y2 = (boxes[..., i] for i in range(4))
    width, height = size
    if orientation in MIRRORED_X:
        x1, x2 = width - x2, width - x1
    if orientation in MIRRORED_Y:
        y1, y2 = height - y2, height - y1
    if orientation in TRANSPOSED:
        x1, y1, x2, y2 = y1, x1, y2, x2
    return _stacked(boxes, [x1, y1, x2, y2])


def _inspect(path: str, decode: bool, oriented: bool) -> tuple[tuple[int, int] | None, int, str | None]:
    """``(size, orientation, problem)``: the size as shown (the EXIF orientation read when ``oriented``, else 1)."""
    if not os.path.isfile(path):
        return None, 1, "image not found"
    try:
        with open_regular(path) as raw, Image.open(io.BufferedReader(raw)) as image:  # a FIFO: refused, not waited on
            size, fmt = image.size, image.format
            orientation = exif_orientation(image) if oriented else 1
    except (OSError, ValueError, Image.DecompressionBombError) as error:  # UnidentifiedImageError is an OSError
        return None, 1, f"unreadable image: {error}"
    if fmt not in DECODABLE and fmt not in JPEG_KINDS and fmt not in BY_PIL:
        return None, 1, f"unsupported image format {fmt} (bigbatch decodes {', '.join(DECODABLE + BY_PIL)})"
    shown = oriented_size(size, orientation)
    if decode:
        try:
            pixels = orient(decode_rgb(path), orientation)
        except RuntimeError as error:
            return None, 1, f"corrupt image: {error_reason(error)}"
        if (pixels.shape[2], pixels.shape[1]) != shown:
            turned = "" if orientation == 1 else f" as shown (EXIF orientation {orientation})"
            return None, 1, (f"decodes to {pixels.shape[2]}x{pixels.shape[1]}{turned}, its header says "
                             f"{shown[0]}x{shown[1]}{turned}")
    return shown, orientation, None


def inspect_image(path: str, decode: bool = False) -> tuple[tuple[int, int] | None, str | None]:
    """``((width, height), None)`` from the image header (PIL reads the header only), or ``(None, problem)``: the
    stored size, the EXIF orientation not read.

    With ``decode`` the whole image is also decoded as the dataset will decode it (strict mode).
    """
    size, _, problem = _inspect(path, decode, oriented=False)
    return size, problem


def inspect_oriented(path: str, decode: bool = False) -> tuple[tuple[int, int] | None, int, str | None]:
    """``((width, height), orientation, None)``: the size as shown, the header's EXIF orientation
    (:func:`exif_orientation`) read with it; or ``(None, 1, problem)``. With ``decode``, the decoded pixels turned
    by the orientation (:func:`orient`) must have that size (strict mode)."""
    return _inspect(path, decode, oriented=True)


def _each(inspect: Callable[[str, bool], T], paths: Sequence[str], decode: bool) -> list[T]:
    """``inspect`` of each path, in order; threads overlap the file reads (and decoding releases the GIL)."""
    if len(paths) < 64:
        return [inspect(p, decode) for p in paths]
    with ThreadPoolExecutor(max_workers=min(16, 2 * (os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda p: inspect(p, decode), paths, chunksize=64))


def inspect_images(paths: Sequence[str], decode: bool = False) -> list[tuple[tuple[int, int] | None, str | None]]:
    """:func:`inspect_image` of each path, in order."""
    return _each(inspect_image, paths, decode)


def inspect_oriented_images(paths: Sequence[str], decode: bool = False
                            ) -> list[tuple[tuple[int, int] | None, int, str | None]]:
    """:func:`inspect_oriented` of each path, in order."""
    return _each(inspect_oriented, paths, decode)
