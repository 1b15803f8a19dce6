"""A run resumed on another number of processes: the global batch kept, the micro-batch kept, ``subdivisions``
re-derived.

A torchrun job that loses or gains a node (``--nnodes MIN:MAX``) restarts every worker with the new world size, and
each runs the same command again, which resumes the run from its last checkpoint (``run_dir.holds_this_run``). The
command's ``subdivisions`` were written for the old world size. What must not change is what the training computes:

- the global batch ``B`` (the data order, the LR, the EMA and the BatchNorm corrections follow the global step, not
  the world size: ``data/pipeline/order.py``, layout-free), and
- the micro-batch ``m`` that the memory plan chose (``batch / (world * subdivisions)``, ``batching.py``): what fits
  on one device, and what a BatchNorm layer normalises over.

So on ``W`` processes the run takes ``subdivisions = B / (W * m)``. Where ``W * m`` does not divide ``B`` (or a later
batch the run may reach: a batch schedule's, a growing adaptive batch's), it takes the largest micro-batch ``m' < m``
that divides every per-process batch ``b / W``: less memory, never more. Where ``W`` does not divide every batch,
no micro-batch fits: the relaunch stops with one line naming the world sizes that work. An adaptive batch
(AdaScale) measures the gradient noise from 2 or more micro-batches per process, so there ``m' <= B / (2 W)``.

The checkpoint says where it was (``data.world`` and ``data.micro_batch``, written by ``engine/state.py``); one
written before those were kept is resumed with the command's subdivisions, as before.

Not every data order is layout-free: ``data.name: shards`` gives each process its own shards (``data/formats/
shards.py``), so its order is a function of the world size, and a resume on another would, in the epoch under way,
train some images twice and others never (8 shards of 100 images, 2 processes then 1 from the epoch's middle: 186
twice, 186 never). Such a resume is refused, in one line naming the checkpoint's world size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bigbatch.batching import reachable_batches
from bigbatch.config import RunConfig, validate_config
from bigbatch.errors import UserError

MOST_WORLD_SIZES_NAMED = 12
"""How many world sizes that work the refusal names (the smallest)."""

ORDER_BY_WORLD = ("shards",)
"""The ``data.name`` values whose training order depends on the world size (their data set brings its own order,
``data/pipeline/order.py``'s ``order_of``): a resume on another world size is refused."""


@dataclass(frozen=True)
class SavedLayout:
    """How the checkpoint's run cut its batch: ``world`` processes of ``micro_batch`` images each micro-batch; the
    batches an adaptive run grew to (``grown``)."""

    world: int
    micro_batch: int
    grown: tuple[int, ...] = ()


def saved_layout(data: Any) -> SavedLayout | None:
    """The layout a checkpoint's ``data`` part records, each number checked (a hostile file: bounded, positive
    integers); None where it records none (a checkpoint of an earlier version)."""
    if not isinstance(data, dict) or "world" not in data or "micro_batch" not in data:
        return None
    world, micro = data["world"], data["micro_batch"]
    changes = data.get("grown", [])  # [[step, batch], ...] (engine/progress.py; checked in full where resumed)
    grown = [c[1] if isinstance(c, (list, tuple)) and len(c) == 2 else c for c in changes[:64]] \
        if isinstance(changes, list) else []
    for key, value in [("world", world), ("micro_batch", micro), *(("grown", b) for b in grown)]:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value < 2**40:
            raise UserError(f"checkpoint: data.{key} is {str(value)[:40]!r}, not a positive whole number")
    return SavedLayout(world, micro, tuple(grown))


def relaunched_subdivisions(cfg: RunConfig, world: int, saved: SavedLayout) -> int:
    """``cfg``'s subdivisions on ``world`` processes for a run whose checkpoint was written as ``saved`` (see the
    module doc: the largest micro-batch at or below the saved one that cuts every batch the run may reach)."""
    batches = [batch for _, batch in reachable_batches(cfg)] + list(saved.grown)
    adaptive = cfg.adaptive is not None
    least_per_process = 2 if adaptive else 1  # AdaScale: 2 micro-batches per process or more
    if any(batch % world or batch // world < least_per_process for batch in batches):
        works = [w for w in _divisors(math.gcd(*batches)) if all(batch // w >= least_per_process for batch in batches)]
        named = ", ".join(map(str, works[:MOST_WORLD_SIZES_NAMED])) + (", ..." if len(works) > MOST_WORLD_SIZES_NAMED
                                                                        else "")
        raise UserError(f"batch: a batch of {cfg.batch} cannot be cut over {world} processes (the run was resumed on "
                        f"{world}, its checkpoint written on {saved.world}); world sizes that work: {named}")
    common = math.gcd(*(batch // world for batch in batches))  # every micro-batch must divide each of these
    most = min(saved.micro_batch, cfg.batch // (world * least_per_process))
    micro = max(d for d in _divisors(common) if d <= most)
    return cfg.batch // (world * micro)


def refuse_world_change(cfg: RunConfig, checkpoint_path: Path, saved_world: int, world: int) -> None:
    """Stop, in one line, a resume on ``world`` processes of a checkpoint written on ``saved_world`` where the data's
    order depends on the world size (:data:`ORDER_BY_WORLD`); nothing otherwise."""
    if cfg.data.name not in ORDER_BY_WORLD:
        return
    raise UserError(f"data.name: {cfg.data.name}: the checkpoint {checkpoint_path} was written on {saved_world} "
                    f"process{'es' if saved_world != 1 else ''} and this resume runs on {world}; each process reads "
                    f"its own shards, so on another number of processes the epoch under way would train some images "
                    f"twice and others never. Resume it on {saved_world} process{'es' if saved_world != 1 else ''} "
                    f"(torchrun's --nnodes x --nproc-per-node), or start a new run from its weights "
                    f"(--set model.weights={checkpoint_path})")


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` (``n`` >= 1), in ``sqrt(n)`` steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def relaunch(cfg: RunConfig, run_dir: Path, world: int) -> RunConfig:
    """``cfg`` with the subdivisions a resume of ``run_dir``'s last checkpoint takes on ``world`` processes: the
    checkpoint's micro-batch where the world size changed, or where ``subdivisions`` is ``auto`` (the micro-batch
    measured when the run started is kept, not measured again); ``cfg`` as it is otherwise. Said in one line."""
    from bigbatch.engine import checkpoint
    from bigbatch.floor import distributed, run_files

    last = run_files.last_checkpoint(run_dir)
    saved = saved_layout(checkpoint.read_part(last, "data"))
    if saved is not None and saved.world != world:
        refuse_world_change(cfg, last, saved.world, world)
    if saved is None or (saved.world == world and cfg.subdivisions != "auto"):
        return cfg
    subdivisions = relaunched_subdivisions(cfg, world, saved)
    micro = cfg.batch // (world * subdivisions)
    if distributed.rank_from_env() == 0:
        kept = "kept" if micro == saved.micro_batch else f"{saved.micro_batch} before: the largest that cuts the batch"
        print(f"resuming on {world} process{'es' if world != 1 else ''} (the checkpoint's run: {saved.world}): "
              f"subdivisions {subdivisions}, micro-batch {micro} ({kept})", flush=True)
    data = cfg.model_dump(mode="json")
    data["subdivisions"] = subdivisions
    return validate_config(data)
