"""How images reach the step: the data order, the loader and its shared-memory slabs, decoding and checking
images (JPEG regions), bad data reported, files opened within bounds, and ``bigbatch data bench``."""
