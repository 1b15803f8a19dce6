"""bigbatch: train vision models with very large effective batches on the hardware you have."""

__version__ = "0.1.0"
