"""What a command checks before any work: its config loaded, validated and checked against this machine.

Every command that takes a CONFIG goes through :func:`load_checked` (or :func:`load_resolved`, which also measures
``subdivisions: auto``), so that a mistake is one ``error:`` line before any data is read or any model built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bigbatch.config import RunConfig


def load_checked(source: str, overrides: list[str], reads_data: bool = True, needs_length: bool = True
                 ) -> RunConfig:
    """Load a config and check what can be checked without any work: its length (``steps`` or ``epochs``; not for
    ``show``, which prints a config without one), the batch layout (unless ``subdivisions`` is ``auto``), the memory
    the run needs at the least against this machine's, and, for a command that ``reads_data`` (not ``show``,
    ``schedule``, ``scale``: they plan without the data), that the data is named and there."""
    from bigbatch.batching import check_batch, require_length
    from bigbatch.config import load_config
    from bigbatch.engine import distributed
    from bigbatch.telemetry.capacity import check_capacity

    cfg = load_config(source, overrides)
    if needs_length:
        require_length(cfg)
    if reads_data:
        from bigbatch.tasks import check_data_given

        check_data_given(cfg)
    world = distributed.world_size_from_env()
    if cfg.subdivisions != "auto":
        check_batch(cfg, world)
    check_capacity(cfg, world)
    return cfg


def load_resolved(source: str, overrides: list[str], reads_data: bool = True, needs_length: bool = True
                  ) -> RunConfig:
    """Load a config and, for ``subdivisions: auto``, measure and choose the subdivisions."""
    return resolve_auto(load_checked(source, overrides, reads_data, needs_length))


def resolve_auto(cfg: RunConfig) -> RunConfig:
    """``subdivisions: auto``: measure and choose the subdivisions (printing the measurements)."""
    from bigbatch.engine import distributed
    from bigbatch.engine.planner import resolve_auto_subdivisions

    cfg, plan = resolve_auto_subdivisions(cfg, distributed.world_size_from_env())
    if plan is not None:
        print(plan.table())
        print(f"subdivisions: auto -> {cfg.subdivisions} (micro-batch {plan.micro_batch})")
    return cfg
