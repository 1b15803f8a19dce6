"""The fixed batch (``batch: 256``): every step the plan's batch, the LR of the schedule at that step."""

from __future__ import annotations

from bigbatch.engine.controllers.base import BatchController
from bigbatch.registry import BATCH_CONTROLLERS


class FixedBatch(BatchController):
    """The base class's behaviour, as it is: the batch of the plan, gain 1, the run's steps."""


BATCH_CONTROLLERS.register("fixed", FixedBatch, chooses=lambda cfg: True)
