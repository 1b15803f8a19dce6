"""What a command checks before any work, and the boundary past which a run's batch is settled.

Every command that takes a CONFIG goes through :func:`load_checked`, so that a mistake is one ``error:`` line before
any data is read or any model built. A command that plans a run then crosses the boundary once,
:func:`resolve_batch`: ``subdivisions: auto`` is measured and chosen, and the batch layout is checked
(``batching.check_batch``, the only place). Past it the config holds a number of subdivisions: no code sees
``auto``, and the plan (``batching.make_plan``) is made from the checked layout.

Under torchrun the ranks cross it together (:func:`resolve_on_ranks`): one layout for all. Rank 0 alone measures
``subdivisions: auto``, against the smallest budget of any rank, and the others take its choice; then every rank
checks that all hold the same batch, world and subdivisions. Ranks that planned on their own could choose
differently (each measurement varies by about 10 %, and each rank's free memory is its own): a run whose ranks
accumulate different numbers of micro-batches issues different numbers of collectives (``norm.sync``: two per
BatchNorm layer and micro-batch), and hangs or sums mismatched tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from bigbatch.batching import BatchLayout
    from bigbatch.config import RunConfig
    from bigbatch.engine.planner import Plan


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
    if cfg.model.weights is not None and os.path.isdir(cfg.model.weights):  # a run: its checkpoint from inside it
        from pathlib import Path

        from bigbatch.engine.run_dir import run_checkpoint

        run_checkpoint(Path(cfg.model.weights), "model.weights")


def resolve_batch(cfg: RunConfig, world: int, join: bool = False) -> tuple[RunConfig, BatchLayout]:
    """The boundary: ``subdivisions: auto`` measured and chosen (printing the measurements), and the batch layout
    checked (``batching.batch_layout``), once. The plan is made from it once the training set is loaded
    (``batching.make_plan``: the set's true size, which only its load knows: COCO images without boxes and unreadable
    images are left out).

    Where this process is one of the ``world`` ranks of a run, the ranks settle it together
    (:func:`resolve_on_ranks`): where a process group of ``world`` processes is up (``train`` called under one), or
    with ``join`` (``bigbatch train`` under torchrun), which joins it first (``floor/distributed.setup``; training's
    own setup then finds it joined)."""
    from bigbatch.batching import batch_layout

    if world > 1 and (join or _in_group_of(world)):
        return resolve_on_ranks(cfg, world)
    cfg = resolve_auto(cfg, world)
    return cfg, batch_layout(cfg, world)


def _in_group_of(world: int) -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() == world


def resolve_on_ranks(cfg: RunConfig, world: int) -> tuple[RunConfig, BatchLayout]:
    """:func:`resolve_batch` on each of the ``world`` ranks of a run, which all call it: one layout for all.

    ``subdivisions: auto`` is planned by rank 0 alone, against the smallest budget of any rank, and taken by the
    others (``planner.resolve_auto_on_ranks``); rank 0 prints the measurements. Then every rank checks its layout
    (``batching.batch_layout``) and the ranks compare (batch, world, subdivisions) in one all-gather: a rank given
    another config or ``--set`` stops every rank with one line naming both layouts."""
    import torch.distributed as dist

    from bigbatch.batching import batch_layout
    from bigbatch.engine.planner import resolve_auto_on_ranks
    from bigbatch.errors import UserError
    from bigbatch.floor import distributed

    if not dist.is_initialized():
        distributed.setup()
    if dist.get_world_size() != world:
        raise RuntimeError(f"resolve_batch: a world of {world} in a process group of {dist.get_world_size()}")
    cfg, plan = resolve_auto_on_ranks(cfg, world)
    if plan is not None:
        _print_plan(cfg, plan, f"; planned on rank 0 for all {world} ranks, within the smallest budget of any")
    layout = batch_layout(cfg, world)
    held: list[tuple[int, int, int] | None] = [None] * world
    dist.all_gather_object(held, (layout.batch, layout.world, layout.subdivisions))
    if len(set(held)) > 1:
        other = next(r for r, h in enumerate(held) if h != held[0])
        raise UserError(f"batch: the ranks hold different layouts: rank 0 {_layout_text(held[0])}, rank {other} "
                        f"{_layout_text(held[other])}; every rank must run the same config and --set")
    return cfg, layout


def _layout_text(held: tuple[int, int, int] | None) -> str:
    assert held is not None
    batch, world, subdivisions = held
    return f"batch {batch} on {world} processes x subdivisions {subdivisions}"


def resolve_auto(cfg: RunConfig, world: int) -> RunConfig:
    """``subdivisions: auto``: measure and choose the subdivisions (printing the measurements); other configs as
    they are."""
    from bigbatch.engine.planner import resolve_auto_subdivisions

    cfg, plan = resolve_auto_subdivisions(cfg, world)
    if plan is not None:
        _print_plan(cfg, plan)
    return cfg


def _print_plan(cfg: RunConfig, plan: Plan, note: str = "") -> None:
    print(plan.table())
    print(f"subdivisions: auto -> {cfg.subdivisions} (micro-batch {plan.micro_batch}{note})", flush=True)
