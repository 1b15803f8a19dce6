"""Hooks: what a run does around its steps, besides the step itself, as detectron2's ``HookBase``.

A hook overrides the moments it cares about; each gets the :class:`~bigbatch.engine.run.Run` (config, plan,
training state, events, ...):

    before_train                 once, before the first step (after a resume: the state is the checkpoint's)
    before_step                  before each optimizer step (``run.step``: its 0-based index)
    before_forward(index)        before each micro-batch's forward, each attempt (may raise out-of-memory)
    after_backward(index)        after each micro-batch's backward: ``.grad`` holds the gradient accumulated
                                 so far, still multiplied by the loss scale; for every micro-batch but the last
                                 it is this device's own (DDP all-reduces during the last backward only)
    after_step                   after each applied step (``run.progress.step``: steps done; ``run.result``); may
                                 return a dict of values for the step's training record (see below)
    after_eval(split, metrics)   after each evaluation
    after_train                  once at the end, also when the run stops with an error (for every hook whose
                                 ``before_train`` had finished); it may still put records
    write(record)                every record put in ``run.events`` (writers: ``metrics.jsonl``, TensorBoard, ...)
    close                        after every hook's ``after_train``: where a writer closes its files

A hook that learns from the training (a running average, a baseline) keeps what it learned across a resume:

    state_dict()                 what to keep, as plain containers, numbers and tensors (None, the default: nothing);
                                 read whenever a checkpoint is written, into its ``hooks`` under the hook's name
                                 (``last.pt`` in the ``checkpoint`` stage's ``after_step``: a hook that learns in
                                 its own ``after_step`` belongs to an earlier stage, as the built-in ones do)
    state_schema()               what the state holds, value by value (``state_schema.py``: each key's type and range);
                                 a checkpoint's state is checked on it before ``load_state_dict`` gets it
    load_state_dict(state)       a resumed run's hook, built fresh, gets its own state back, before ``before_train``

So a hook makes its fresh state when it is built, not in ``before_train``. A hook the checkpoint holds no state for
(an older checkpoint, or the hook was off then) starts fresh. A checkpoint may be hostile: every built-in hook with a
state declares its schema, and a value that does not fit (``first_eval: 'x'``, a NaN average, a key too many) is one
line naming the hook and the key, before any step (``checkpoint: hooks.memory_log.first_eval: expected ...``). The
checkpoint is the main process's: the state kept is that process's hook's. Readings of the process itself are not
kept (wall-clock and memory: the input pipeline's share, the phase table, the memory peaks): a resumed process
measures its own.

Each hook declares its stage (``stage``, one of :data:`STAGES`); at every moment the hooks run stage by stage, and
within a stage in the order :func:`build_hooks` gives (``BUILT_IN``, with the reasons where the order matters):

    prepare      sets the model up for the step (BatchNorm frozen during warmup)
    measure      reads the step: phase times, memory, noise scale, input pipeline, update sizes
    record       the training record (the step's scalars) and what a person sees of it
    evaluate     evaluation and ``best.pt``
    checkpoint   ``last.pt``: after evaluation, and after every hook that learns in ``after_step``
    guard        what may stop a step (fault injection, ``memory.limit``: ``before_forward``)
    write        writers (``metrics.jsonl``, TensorBoard)

The step's training record is what the ``measure`` and ``record`` hooks return from ``after_step``, merged in stage
order (the record hooks' keys first; on a clash the later stage wins). It is put once the ``record`` stage is done,
if a ``record`` hook returned values (the training log decides which steps are recorded: at other steps what was
measured is dropped). A hook of a later stage returning values is an error: the record is already out.

A hook registers a factory in ``bigbatch.registry.HOOKS``: ``factory(run) -> Hook | None`` (None: not wanted by
this config or on this process). Every run builds every registered hook; ``train(..., hooks=[...])`` adds hooks
of the caller's own, placed by their stage after the registered ones.

When the run stops with an error, a hook's own error in ``after_train`` or ``close`` is printed as a warning and
the run's error is the one raised. A hook must not keep ``run.model`` beyond the run (under torchrun it is the
DDP wrapper, which has to be freed before the process group goes).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bigbatch.batching import BatchPlan
from bigbatch.config import parse_length
from bigbatch.engine.events import Record
from bigbatch.errors import UserError
from bigbatch.largebatch.schedule import length_in_steps
from bigbatch.registry import HOOKS
from bigbatch.state_schema import Schema, StateError, check_state

if TYPE_CHECKING:
    from bigbatch.engine.run import Run

STAGES = ("prepare", "measure", "record", "evaluate", "checkpoint", "guard", "write")
"""Where a hook runs among the others (the module docstring says what each stage is for)."""

BUILT_IN = (
    "freeze_norm",     # prepare
    "freeze_layers",   # prepare: after freeze_norm, whose warmup freeze sets every BatchNorm layer
    "phase_timing",    # measure, first of all: it ends the step's clock before any other hook spends time
    "memory_log",      # measure, early: samples taken while the step is evaluated or saved carry this step
    "batch_control",   # measure: the batch controller's summary at the end (AdaScale's), before the noise scale's
    "noise_scale",     # measure
    "input_pipeline",  # measure
    "update_sizes",    # measure
    "training_log",    # record: the step's scalars, with what the measure hooks returned
    "console",         # record: the bar moves before an evaluation prints below it
    "evaluation",      # evaluate: before the checkpoint, so that best.pt is written before last.pt
    "checkpointing",   # checkpoint: after the hooks that learn in after_step, so that their state is this step's
    "faults",          # guard: before memory_limit, so that an injected out-of-memory comes first
    "memory_limit",    # guard
    "metrics_jsonl",   # write
    "tensorboard",     # write
)
"""The built-in hooks (registered by ``engine/hooks/``), in the order they run."""

MOMENTS = ("before_train", "before_step", "before_forward", "after_backward", "after_step", "after_eval",
           "after_train", "write", "close")


class Hook:
    stage: str = ""
    """Which of :data:`STAGES` the hook belongs to: every hook declares one."""

    def before_train(self, run: Run) -> None:
        pass

    def before_step(self, run: Run) -> None:
        pass

    def before_forward(self, run: Run, index: int) -> None:
        pass

    def after_backward(self, run: Run, index: int) -> None:
        pass

    def after_step(self, run: Run) -> dict[str, Any] | None:
        return None

    def after_eval(self, run: Run, split: str, metrics: dict[str, float]) -> None:
        pass

    def after_train(self, run: Run) -> None:
        pass

    def write(self, record: Record) -> None:
        pass

    def close(self, run: Run) -> None:
        pass

    def state_dict(self) -> dict[str, Any] | None:
        return None

    def state_schema(self) -> Schema | None:
        """The schema of :meth:`state_dict` (None, the default: not declared; the state is handed over unchecked)."""
        return None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Hooks:
    """The hooks of one run, called in order. Each moment calls only the hooks that override it, so a moment
    no hook uses (``before_forward`` in most runs) costs nothing."""

    def __init__(self, run: Run, hooks: list[Hook], names: list[str] | None = None) -> None:
        self.run, self.hooks = run, hooks
        self.names = names if names is not None else [type(h).__name__ for h in hooks]
        """Each hook's name (its ``HOOKS`` entry's): the key of its state in a checkpoint."""
        stages = [_stage_of(name, hook) for name, hook in zip(self.names, hooks, strict=True)]
        if stages != sorted(stages):
            raise ValueError("hooks must be given in the order of their stages (build_hooks orders them)")
        self._by_moment = {m: [getattr(h, m) for h in hooks if getattr(type(h), m) is not getattr(Hook, m)]
                           for m in MOMENTS}
        self._after_step_hooks = [h for h in hooks if type(h).after_step is not Hook.after_step]
        self._started: list[Hook] = []

    def uses(self, moment: str) -> bool:
        return bool(self._by_moment[moment])

    def after_step_before(self, hook: Hook) -> Hook | None:
        """The hook whose ``after_step`` runs just before ``hook``'s (None: none does, or ``hook`` has none)."""
        order = self._after_step_hooks
        at = next((i for i, h in enumerate(order) if h is hook), None)
        return order[at - 1] if at else None

    def _call(self, moment: str, *args: Any) -> None:
        for method in self._by_moment[moment]:
            method(self.run, *args)

    def before_train(self) -> None:
        """Each hook's ``before_train``, in order; a hook counts as started once its own has finished."""
        for hook in self.hooks:
            hook.before_train(self.run)
            self._started.append(hook)

    def before_step(self) -> None:
        self._call("before_step")

    def before_forward(self, index: int) -> None:
        self._call("before_forward", index)

    def after_backward(self, index: int) -> None:
        self._call("after_backward", index)

    def after_step(self) -> None:
        """Each hook's ``after_step``, in order; the training record is put once the ``record`` stage is done."""
        measured: dict[str, Any] = {}
        recorded: dict[str, Any] = {}
        last_recording = STAGES.index("record")
        put = False
        for hook, method in zip(self._after_step_hooks, self._by_moment["after_step"], strict=True):
            stage = STAGES.index(hook.stage)
            if stage > last_recording and not put:
                self._put_record(measured, recorded)
                put = True
            values = method(self.run)
            if not values:
                continue
            if put:
                raise RuntimeError(f"hook {type(hook).__name__} (stage {hook.stage}) returned values for the training "
                                   f"record after it was put; a hook that adds to the record is a measure or record "
                                   f"hook")
            (recorded if hook.stage == "record" else measured).update(values)
        if not put:
            self._put_record(measured, recorded)

    def _put_record(self, measured: dict[str, Any], recorded: dict[str, Any]) -> None:
        """The step's training record: the record hooks' values, then what the measure hooks returned."""
        if recorded:
            values = {**recorded, **{k: v for k, v in measured.items() if k not in recorded}}
            self.run.events.train(values, self.run.progress.total)  # an adaptive run's length is in base steps

    def after_eval(self, split: str, metrics: dict[str, float]) -> None:
        self._call("after_eval", split, metrics)

    def after_train(self, failing: bool = False) -> None:
        """``after_train`` then ``close`` of every started hook, even when one of them fails. The first such error
        is raised after all ran, unless the run is ``failing`` already: then it is printed as a warning, so that
        the run's own error is the one the user sees."""
        error: BaseException | None = None
        self.run.steps_over = True
        for moment in ("after_train", "close"):
            for hook in self._started:
                if getattr(type(hook), moment) is getattr(Hook, moment):
                    continue
                try:
                    getattr(hook, moment)(self.run)
                except Exception as e:  # noqa: BLE001 - raised or reported below, after the other hooks closed
                    if failing:
                        print(f"warning: {type(hook).__name__}.{moment} failed: {e}", file=sys.stderr, flush=True)
                    error = error or e
        if error is not None and not failing:
            raise error

    def write(self, record: Record) -> None:
        for method in self._by_moment["write"]:
            method(record)

    def state_dict(self) -> dict[str, Any]:
        """``{name: state}`` of every hook that has a state to keep: a checkpoint's ``hooks``."""
        states = {name: hook.state_dict() for name, hook in zip(self.names, self.hooks, strict=True)}
        return {name: state for name, state in states.items() if state is not None}

    def load_state_dict(self, states: dict[str, Any]) -> None:
        """Give each hook its own state from a checkpoint's ``hooks``, checked on the hook's schema first; a hook
        without one there starts fresh. A state that does not fit its hook is a ``UserError`` naming the hook and,
        where the hook declares its schema, the key."""
        for name, hook in zip(self.names, self.hooks, strict=True):
            if name not in states:
                continue
            state, schema = states[name], hook.state_schema()
            try:
                hook.load_state_dict(check_state(schema, state, f"hooks.{name}") if schema is not None else state)
            except StateError as e:
                raise UserError(f"checkpoint: {e}") from None
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise UserError(f"checkpoint: the saved state of hook {name!r} does not fit it "
                                f"({type(e).__name__}: {e})") from None


def build_hooks(run: Run, extra: Sequence[Hook] = ()) -> Hooks:
    """The run's hooks, in order: stage by stage (:data:`STAGES`); within a stage the built-in ones in the order of
    :data:`BUILT_IN`, then the other registered ones in registration order, then ``extra`` (the caller's own
    hooks) in the order given. A registered factory that returns None is not wanted by this run."""
    built: list[tuple[tuple[int, int, int], str, Hook]] = []
    for position, name in enumerate(HOOKS.names()):
        hook = HOOKS.get(name).obj(run)
        if hook is None:
            continue
        rank = BUILT_IN.index(name) if name in BUILT_IN else len(BUILT_IN) + position
        built.append(((_stage_of(name, hook), 0, rank), name, hook))
    for position, hook in enumerate(extra):
        name = getattr(hook, "name", type(hook).__name__)
        built.append(((_stage_of(name, hook), 1, position), name, hook))
    built.sort(key=lambda item: item[0])
    return Hooks(run, [hook for _, _, hook in built], [name for _, name, _ in built])


def _stage_of(name: str, hook: Hook) -> int:
    if hook.stage not in STAGES:
        raise ValueError(f"hook {name!r} declares stage {hook.stage!r}; a hook's stage is one of {', '.join(STAGES)}")
    return STAGES.index(hook.stage)


@dataclass(frozen=True)
class EveryImages:
    """An interval of ``images`` images under a batch schedule: due after the step whose images reach or pass the
    next multiple of it."""

    images: float
    plan: BatchPlan

    def due(self, done: int, plan: BatchPlan | None = None) -> bool:
        """Due after ``done`` steps of ``plan`` (the run's plan now: an adaptive batch adds its changes as it grows;
        default: the plan it was made with)."""
        plan = plan or self.plan
        return done >= 1 and plan.images_before(done) // self.images > plan.images_before(done - 1) // self.images


def is_due(done: int, every: int | EveryImages, total: int, plan: BatchPlan | None = None) -> bool:
    """Whether something done every ``every`` steps (or images, counted in ``plan``, the run's plan now; and at the
    last step) is due after ``done`` steps."""
    if isinstance(every, EveryImages):
        return every.due(done, plan) or done == total
    return done % every == 0 or done == total


def every_steps(length: int | float | str, plan: BatchPlan, key: str = "a length") -> int | EveryImages:
    """An interval given in steps, epochs or images, as a whole number of steps (at least 1); under a batch
    schedule or a growing adaptive batch, an interval in epochs or images stays one of images (``EveryImages``)."""
    number, unit = parse_length(length)
    if (plan.phases or plan.grow_to is not None) and unit != "steps":
        return EveryImages(number * plan.images_per_epoch(key) if unit == "epochs" else number, plan)
    return max(1, round(length_in_steps(length, plan, key)))
