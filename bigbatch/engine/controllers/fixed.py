"""The fixed batch (``batch: 256``): every step the plan's batch, the LR of the schedule at that step."""

from __future__ import annotations

from bigbatch.engine.controllers.base import BatchController
from bigbatch.registry import BATCH_CONTROLLERS


class FixedBatch(BatchController):
    """The base class's behaviour, as it is: the batch of the plan, gain 1, the run's steps."""

    def __init__(self, cfg, plan, proc) -> None:  # noqa: ANN001 - the factory's signature (registry.py)
        super().__init__(plan, proc)


BATCH_CONTROLLERS.register("fixed", FixedBatch, chooses=lambda cfg: True)
