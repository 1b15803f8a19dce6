"""The package's one C extension, which pyproject.toml (everything else) cannot declare outside setuptools'
experimental ``ext-modules`` table: the region-of-interest JPEG decode (``csrc/jpeg_region.c``) over the system's
libjpeg-turbo. It is optional: where it cannot be built (no C compiler, no ``jpeglib.h``) setuptools warns and goes
on, and bigbatch decodes whole images with torchvision (``bigbatch/data/pipeline/jpeg.py``)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("bigbatch.data._jpeg_region", ["csrc/jpeg_region.c"], libraries=["jpeg"],
                             optional=True)])
