"""A crop's region of a JPEG, decoded alone: the whole decode's pixels, in about two thirds of its time.

libjpeg-turbo can leave out the columns outside a region (``jpeg_crop_scanline``) and the inverse DCT and colour
conversion of the rows above and below it (``jpeg_skip_scanlines``), as TensorFlow's ``decode_and_crop_jpeg`` does.
``csrc/jpeg_region.c`` (the extension ``bigbatch.data._jpeg_region``, built against the system's libjpeg-turbo when
the package is installed) does this, keeping one column of context on each side of the crop for the chroma
upsampling: the pixels equal torchvision's ``decode_jpeg`` of the whole file, cropped, bit for bit
(``tests/data/test_jpeg_region.py``). So the exact path uses it as well as the fast one.

Where it does not apply, the image is decoded whole as before: the extension was not built (no C compiler or
``jpeglib.h`` where bigbatch was installed), the file is not a JPEG, or its layout is one the region decode does not
take (CMYK, YCCK, RGB-coded, chroma 4:4:0 or 4:1:1).
"""

from __future__ import annotations

import torch
from PIL import Image

try:
    from bigbatch.data import _jpeg_region
except ImportError:  # not built where the package was installed
    _jpeg_region = None

JPEG_START = b"\xff\xd8\xff"


def available() -> bool:
    """Whether the region decode was built."""
    return _jpeg_region is not None


def region_size(data: bytes | bytearray) -> tuple[int, int] | None:
    """``(height, width)`` of a JPEG whose crops :func:`decode_region` decodes; ``None`` for any other image (decode
    it whole). A JPEG whose header is unreadable raises ``ValueError`` with libjpeg's message; one of more pixels than
    PIL takes (``2 x Image.MAX_IMAGE_PIXELS``) ``Image.DecompressionBombError``, as opening it with PIL would."""
    if _jpeg_region is None or data[:3] != JPEG_START:
        return None
    height, width, region = _jpeg_region.header(data)
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and height * width > 2 * limit:
        raise Image.DecompressionBombError(f"Image size ({height * width} pixels) exceeds limit of {2 * limit} pixels, "
                                           "could be decompression bomb DOS attack.")
    return (height, width) if region else None


def decode_region(data: bytes | bytearray, top: int, left: int, height: int, width: int,
                  reduction: int = 1) -> torch.Tensor:
    """The uint8 ``(3, height, width)`` RGB pixels of the region at ``(top, left)`` of the image scaled by
    ``1 / reduction`` (1, 2, 4 or 8: libjpeg's DCT scaling; each side becomes ``ceil(side / reduction)``), a CHW
    view of HWC rows. ``ValueError`` for a corrupt or truncated file."""
    pixels = _jpeg_region.decode(data, top, left, height, width, reduction)
    return torch.frombuffer(pixels, dtype=torch.uint8).view(height, width, 3).permute(2, 0, 1)
