"""AlexeyAB Darknet's ``[yolo] resize``: the random zoom ``load_data_detection`` (src/data.c) adds to each side of an
image's jitter window, with or without mosaic, in C's float32 arithmetic and truncating int conversions. For a side
of ``ow`` pixels and ``resize`` r:

    min_rdw = (int)(ow * (1 - 1 / min(r, 1 / r)) / 2)    (<= 0: the window grows, a zoom out)
    max_rdw = (int)(ow * (1 - 1 / max(r, 1 / r)) / 2)    (>= 0: the window shrinks, a zoom in; 0 when r < 1)
    pleft = (int)(pleft + rand_precalc_random(min_rdw, max_rdw, resize_r1)),  ptop likewise (min_rdh, max_rdh)
    pright, pbot likewise with resize_r2

so that 1.5 zooms each image by up to 1.5 in or out, below 1 only out.
"""

from __future__ import annotations

import numpy as np


def precalc(low: np.float32, high: np.float32, part: np.float32) -> np.float32:
    """AlexeyAB's ``rand_precalc_random`` (src/utils.c): ``part * (max - min) + min`` in float32, the bounds
    swapped when ``max < min``."""
    if high < low:
        low, high = high, low
    return part * (high - low) + low


def zoomed_sides(height: int, width: int, resize: float, sides: tuple[int, int, int, int], resize_r1: float,
                 resize_r2: float) -> tuple[int, int, int, int]:
    """The jitter window's side offsets ``(pleft, pright, ptop, pbot)`` moved further by AlexeyAB's ``[yolo] resize``
    zoom (the module's formulas), the left and top sides by the draw ``resize_r1``, the right and bottom by
    ``resize_r2``, in C's float32 and truncating int conversions.
    ``resize`` 1: the sides as they are."""
    if resize == 1.0:
        return sides
    f32, ow, oh = np.float32, np.float32(width), np.float32(height)
    resize_down = resize_up = f32(resize)
    if resize_down > 1.0:
        resize_down = f32(1) / resize_down
    min_rdw, min_rdh = (int(side * (f32(1) - f32(1) / resize_down) / f32(2)) for side in (ow, oh))
    if resize_up < 1.0:
        resize_up = f32(1) / resize_up
    max_rdw, max_rdh = (int(side * (f32(1) - f32(1) / resize_up) / f32(2)) for side in (ow, oh))
    high_w, high_h = (f32(0), f32(0)) if resize < 1 else (f32(max_rdw), f32(max_rdh))  # "downsize only"
    pleft, pright, ptop, pbot = sides
    r1, r2 = f32(resize_r1), f32(resize_r2)
    return (int(f32(pleft) + precalc(f32(min_rdw), high_w, r1)),  # int += float: the sum, truncated
            int(f32(pright) + precalc(f32(min_rdw), high_w, r2)),
            int(f32(ptop) + precalc(f32(min_rdh), high_h, r1)),
            int(f32(pbot) + precalc(f32(min_rdh), high_h, r2)))
