"""Image files checked before a run and decoded during it: the header read (size, format) without decoding, the
decode itself (torchvision), and a decoder's error as a short reason.

Loading reads only image headers (PIL), of regular files opened without blocking (``files.open_regular``); a corrupt
body is found when the sample is decoded. In strict mode the loaders decode every image up front instead
(``inspect_image(path, decode=True)``).
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image

from bigbatch.data.pipeline import jpeg
from bigbatch.data.pipeline.files import open_regular, read_regular

DECODABLE = ("GIF", "JPEG", "PNG", "WEBP")  # the formats torchvision.io.decode_image reads (PIL's names)


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
        return decode_image(torch.frombuffer(data, dtype=torch.uint8), mode=ImageReadMode.RGB)
    except (ValueError, Image.DecompressionBombError) as error:
        raise RuntimeError(str(error)) from None


def decode_rgb(path: str) -> torch.Tensor:
    """The image file at ``path`` (a regular file of at most 1 GiB: ``files.read_regular``) decoded as uint8
    [3, H, W] RGB (:func:`decode_bytes`); a file that cannot be read or decoded is a ``RuntimeError``."""
    try:
        data = read_regular(path)
    except OSError as error:
        raise RuntimeError(str(error)) from None
    return decode_bytes(data)


def inspect_image(path: str, decode: bool = False) -> tuple[tuple[int, int] | None, str | None]:
    """``((width, height), None)`` from the image header (PIL reads the header only), or ``(None, problem)``.

    With ``decode`` the whole image is also decoded as the dataset will decode it (strict mode).
    """
    if not os.path.isfile(path):
        return None, "image not found"
    try:
        with open_regular(path) as raw, Image.open(io.BufferedReader(raw)) as image:  # a FIFO: refused, not waited on
            size, fmt = image.size, image.format
    except (OSError, ValueError, Image.DecompressionBombError) as error:  # UnidentifiedImageError is an OSError
        return None, f"unreadable image: {error}"
    if fmt not in DECODABLE:
        return None, f"unsupported image format {fmt} (torchvision decodes {', '.join(DECODABLE)})"
    if decode:
        try:
            pixels = decode_rgb(path)
        except RuntimeError as error:
            return None, f"corrupt image: {error_reason(error)}"
        if (pixels.shape[2], pixels.shape[1]) != size:
            return None, f"decodes to {pixels.shape[2]}x{pixels.shape[1]}, its header says {size[0]}x{size[1]}"
    return size, None


def inspect_images(paths: Sequence[str], decode: bool = False) -> list[tuple[tuple[int, int] | None, str | None]]:
    """``inspect_image`` of each path, in order; threads overlap the file reads (and decoding releases the GIL)."""
    if len(paths) < 64:
        return [inspect_image(p, decode) for p in paths]
    with ThreadPoolExecutor(max_workers=min(16, 2 * (os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda p: inspect_image(p, decode), paths, chunksize=64))
