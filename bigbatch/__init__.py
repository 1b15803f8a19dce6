"""bigbatch: train vision models with very large effective batches on the hardware you have.

``bigbatch.load(RUN | CHECKPOINT | NET.cfg, weights=...)`` gives a trained model ready to predict
(``inference/loading.py``); it is imported on first use, so ``import bigbatch`` loads no torch.
"""

from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "load":
        from bigbatch.inference.loading import load

        return load
    raise AttributeError(f"module 'bigbatch' has no attribute {name!r}")
