"""The batch controllers (``base.py`` says what one is): fixed, scheduled (``schedule.batch``) and adaptive
(AdaScale), each registered in ``bigbatch.registry.BATCH_CONTROLLERS``."""

from bigbatch.engine.controllers import adaptive, fixed, scheduled  # noqa: F401 - each registers itself
