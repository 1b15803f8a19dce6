"""What a command checks before any work, and the boundary past which a run's batch is settled.

Every command that takes a CONFIG goes through :func:`load_checked`, so that a mistake is one ``error:`` line before
any data is read or any model built. A command that plans a run then crosses the boundary once,
:func:`resolve_batch`: ``subdivisions: auto`` is measured and chosen, and the batch layout is checked
(``batching.check_batch``, the only place). Past it the config holds a number of subdivisions: no code sees
``auto``, and the plan (``batching.make_plan``) is made from the checked layout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from bigbatch.batching import BatchLayout
    from bigbatch.config import RunConfig


def load_checked(source: str, overrides: list[str], reads_data: bool = True, needs_length: bool = True,
                 run_dir: Path | None = None) -> RunConfig:
    """Load a config and check what can be checked without any work: its length (``steps`` or ``epochs``; not for
    ``show``, which prints a config without one), the memory the run needs at the least against this machine's, and,
    for a command that ``reads_data`` (not ``show``, ``schedule``, ``scale``: they plan without the data), that the
    data is named and there. The batch layout is checked at the boundary (:func:`resolve_batch`). ``run_dir``: where
    ``batch.max: advisor`` looks after the config's folder (``config/adaptive.py``)."""
    from bigbatch.batching import require_length
    from bigbatch.config import load_config
    from bigbatch.floor import distributed
    from bigbatch.telemetry.capacity import check_capacity, check_memory_limit

    cfg = load_config(source, overrides, run_dir)
    if needs_length:
        require_length(cfg)
    if reads_data:
        from bigbatch.tasks import check_data_given

        check_data_given(cfg)
        _weights_given(cfg)
        check_memory_limit(cfg)  # a command that runs the model (show, schedule and scale plan only)
    check_capacity(cfg, distributed.world_size_from_env())
    _host_all_reduce_switch(cfg)
    return cfg


def _host_all_reduce_switch(cfg: RunConfig) -> None:
    """``BIGBATCH_HOST_ALL_REDUCE`` (``floor/host_all_reduce.py``), where cross-device BatchNorm reads it: a value it
    does not know is said before any work, not at the first training forward."""
    if cfg.norm.sync != "bigbatch":
        return
    from bigbatch.errors import UserError
    from bigbatch.floor.host_all_reduce import check_switch

    try:
        check_switch()
    except ValueError as e:
        raise UserError(str(e)) from None


def _weights_given(cfg: RunConfig) -> None:
    """``model.weights`` (and ``model.weights_cfg``) name something on disk, said before any data is read; what the
    file holds is read when the model is built (``engine/start_weights.py``)."""
    import os

    from bigbatch.errors import UserError

    for key in ("weights", "weights_cfg"):
        path = getattr(cfg.model, key, None)
        if path is not None and not os.path.exists(path):
            raise UserError(f"model.{key}: {path} does not exist")


def resolve_batch(cfg: RunConfig, world: int) -> tuple[RunConfig, BatchLayout]:
    """The boundary: ``subdivisions: auto`` measured and chosen (printing the measurements), and the batch layout
    checked (``batching.batch_layout``), once. The plan is made from it once the training set is loaded
    (``batching.make_plan``: the set's true size, which only its load knows: COCO images without boxes and unreadable
    images are left out)."""
    from bigbatch.batching import batch_layout

    cfg = resolve_auto(cfg, world)
    return cfg, batch_layout(cfg, world)


def resolve_auto(cfg: RunConfig, world: int) -> RunConfig:
    """``subdivisions: auto``: measure and choose the subdivisions (printing the measurements); other configs as
    they are."""
    from bigbatch.engine.planner import resolve_auto_subdivisions

    cfg, plan = resolve_auto_subdivisions(cfg, world)
    if plan is not None:
        print(plan.table())
        print(f"subdivisions: auto -> {cfg.subdivisions} (micro-batch {plan.micro_batch})")
    return cfg
