"""The package's C extensions, which pyproject.toml (everything else) cannot declare outside setuptools' experimental
``ext-modules`` table: the region-of-interest JPEG decode (``csrc/jpeg_region.c``) over the system's libjpeg-turbo, and
Darknet's HSV distortion in one pass (``csrc/hsv.c``). Both are optional: where one cannot be built (no C compiler, no
``jpeglib.h``) setuptools warns and goes on, and bigbatch decodes whole images with torchvision
(``bigbatch/data/pipeline/jpeg.py``) and distorts colours with torch operations (``det_transforms.distort_hsv``)."""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("bigbatch.data._jpeg_region", ["csrc/jpeg_region.c"], libraries=["jpeg"], optional=True),
    # the same float32 operations as the torch code it replaces: no fused multiply-add; -fno-trapping-math lets the
    # loop vectorize (its selects), and changes no value
    Extension("bigbatch.data._hsv", ["csrc/hsv.c"], extra_compile_args=["-O3", "-ffp-contract=off", "-fno-trapping-math"], optional=True),
])
