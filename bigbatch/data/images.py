"""Image files checked before a run and decoded during it: the header read (size, format) without decoding, the
decode itself (torchvision), and a decoder's error as a short reason.

Loading reads only image headers (PIL); a corrupt body is found when the sample is decoded. In strict mode the
loaders decode every image up front instead (``inspect_image(path, decode=True)``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from PIL import Image
from torchvision.io import ImageReadMode, decode_image

DECODABLE = ("GIF", "JPEG", "PNG", "WEBP")  # the formats torchvision.io.decode_image reads (PIL's names)


def error_reason(error: Exception) -> str:
    """torchvision's message without its C++ source location (``decode_jpeg, /path/file.cpp:171, ...``)."""
    return re.sub(r"^\w+, \S+:\d+, ", "", str(error)).strip()


def decode_rgb(path: str) -> torch.Tensor:
    """The image decoded by torchvision (libjpeg-turbo for JPEG) as uint8 [3, H, W] RGB."""
    return decode_image(path, mode=ImageReadMode.RGB)


def inspect_image(path: str, decode: bool = False) -> tuple[tuple[int, int] | None, str | None]:
    """``((width, height), None)`` from the image header (PIL reads the header only), or ``(None, problem)``.

    With ``decode`` the whole image is also decoded as the dataset will decode it (strict mode).
    """
    if not os.path.isfile(path):
        return None, "image not found"
    try:
        with Image.open(path) as image:
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
