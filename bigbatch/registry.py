"""Registries: where each kind of part is found by the name a config gives it.

A part (an optimizer, a schedule kind, a dataset format, a model family, a task, a hook) registers itself
next to its own code, once::

    from bigbatch.registry import OPTIMIZERS

    @OPTIMIZERS.register("sgd")
    def build_sgd(groups, lr, cfg): ...

The config reads a registry to check a name (``optim.name: sgd``) and to list the allowed ones in its
error message; the engine reads it to build the part. This module is a leaf: it imports nothing from
bigbatch. The built-in parts live in the modules named as a registry's ``locations``, imported (by name,
as MMEngine's registries do) the first time a registry is read, so that the config never imports the
parts and no import cycle exists.

A part may add fields of its own to the config section its registry fills (``data.*`` for a dataset
format, ``model.*`` for a model family, ``optim.*``, ``schedule.*``, ``schedule.decay.*``):
``register(name, obj, fields={"root": (str, "data/toy")})`` makes ``data.root`` a typed, checked key with that
default: the part's own key, which another chosen part accepts at its default only (see ``config.PartSection``;
every config keeps every key). The type may be any pydantic type, e.g.
``config.Length`` (which ``bigbatch scale`` then rescales, as every length). A built-in part's fields are declared
with its config section (``PartSection.builtin_keys``), so that the config knows them before the part's module (and
torch) is imported; it registers with them.

What each registry's ``obj`` is, and the ``info`` it reads, is written below each registry; the facts a part may
register are its registry's ``Info`` type (``TaskInfo``, ``DatasetInfo``, ...), so a misspelled one is an error.
Every registry with a config section also reads ``info.check``, optional: ``check(section)`` raises
``ValueError("key: what is wrong")`` when the chosen part lacks something in its section (a decay kind's period, a
dataset's paths); it runs while the config is validated, before any work.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


class Info:
    """The facts a part registers about itself, typed per registry (as timm's ``OptimInfo``): a misspelled key in
    a registration is a ``TypeError`` naming it. Read as attributes, or as a mapping (``info.get("check")``)."""

    def get(self, key: str, default: Any = None) -> Any:
        value = getattr(self, key, None) if key in self.__dataclass_fields__ else None  # type: ignore[attr-defined]
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:
        if key not in self.__dataclass_fields__:  # type: ignore[attr-defined]
            raise KeyError(key)
        return getattr(self, key)


@dataclass(frozen=True)
class TaskInfo(Info):
    metrics: tuple[str, ...]
    """The names ``eval.metric`` may take, the default first."""
    model_kind: str
    """What a model of the task is called in an error message (``classifier``, ``detector``)."""
    metric_prefixes: tuple[str, ...] = ()
    """Per-class metrics: ``("AP/",)`` admits ``AP/<class>``."""
    check: Callable[[Any], None] | None = None
    metric_text: Callable[[str, float], str] | None = None
    """metric_text(name, value) -> the value as the task's report prints it (``"1.00 %"`` for an mAP of 0.01)."""


@dataclass(frozen=True)
class OptimInfo(Info):
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class ScheduleInfo(Info):
    burn_in: Callable[[Any], int] | None = None
    """burn_in(schedule_cfg) -> steps: the schedule's burn-in, which the ``update_ratio`` loss scaler follows."""
    warmup_steps: Callable[[Any, Any], float] | None = None
    """warmup_steps(cfg, plan) -> steps: where its warmup ends (``norm.freeze_during_warmup``)."""
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class DecayInfo(Info):
    rates: dict[str, str] = field(default_factory=dict)
    """``{field: rule}`` for a field of the section that is a per-step rate, which ``bigbatch scale`` adapts."""
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class DatasetInfo(Info):
    task: str
    count: Callable[[Any], int]
    """count(cfg) -> the training set's size, found without loading it; ``data.formats.DataNotAtHand`` when the data
    is not at hand and ``data.train_images`` is not set (``show`` and friends then plan without it)."""
    held_in_memory: Callable[[Any], Any] | None = None
    """held_in_memory(cfg) -> (bytes, what): the memory the loaded set holds, checked before any work."""
    check: Callable[[Any], None] | None = None
    given: Callable[[Any], None] | None = None
    """given(data section) raises a ``UserError`` naming the key when the data a run reads is not named or not
    there (train, eval, plan; ``show`` and friends do not call it)."""
    image_input: Callable[[Any], Any] | None = None
    """image_input(cfg) -> what turns one image into the model's input as the format's evaluation does
    (``from_pixels(uint8 CHW)``, optionally ``from_file(path)``): ``bigbatch predict`` on a classifier's run. A
    detection format needs none (the task's evaluation transform is the same for every format)."""


@dataclass(frozen=True)
class ModelInfo(Info):
    task: str
    min_input_size: int | None = None
    keeps: dict[str, Callable[[Any], str]] | None = None
    """{config key: fn(model) -> text}: files of the model's own that the config names by path (a Darknet
    ``model.cfg``), kept in the run directory under the key's name as the run built them (``engine/run_dir.py``), so
    that the run evaluates, resumes and exports without the file named."""
    """The smallest square input in pixels."""
    frozen_groups: Callable[[Any, Any, Any], list[Any]] | None = None
    """frozen_groups(model, cfg, plan) -> ``largebatch.freeze.FrozenGroup`` of the family's own freezing keys (a
    Darknet cfg's ``stopbackward``, ``train_only_bn``, ``dont_update``, ``burnin_update``), beside ``model.freeze``."""
    start_weights: Callable[[Any, Any], Any] | None = None
    """start_weights(model, model_cfg) -> ``engine.start_weights.Started``, or None to leave ``model.weights`` to the
    loader every family shares (by tensor name): a family's own weights files (Darknet's ``.weights``)."""
    size_key: str = "model.name"
    """The key that sets its size, named when it is too large."""
    describe: Callable[[Any], str] | None = None
    """describe(cfg) -> the text ``bigbatch show`` prints after the plan (a network's layer table)."""
    channels_last: bool = False
    """``model.memory_format: auto`` lays its tensors out channels-last (torchvision's and timm's classifiers,
    whose convolutions run faster so: docs/benchmarks.md)."""
    check: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class ControllerInfo(Info):
    chooses: Callable[[Any], bool]
    """chooses(cfg) -> whether this controller decides the batch of a run of ``cfg`` (a controller of the caller's
    own is asked before the built-in ones: ``engine/controllers/base.py``, ``build_controller``)."""


@dataclass(frozen=True)
class ModelFileInfo(Info):
    rebuild: Callable[[dict, Any, list], Any] | None = None
    """rebuild(origin, network, classes) -> the ``Predictor`` an exported file stands for (``bigbatch export``):
    ``origin`` is what the predictor's ``origin`` held when it was exported, ``network`` the file's runtime in place
    of the part exported."""


@dataclass(frozen=True)
class NoInfo(Info):
    """A registry whose parts register no facts (hooks declare their stage on the class)."""


@dataclass(frozen=True)
class Entry:
    """One registered part: its name, what builds it, and facts that others read about it."""

    name: str
    obj: Any
    info: Info
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    """Config fields of the part's own, in its registry's section: ``{field: (type, default)}``."""


@dataclass
class _Family:
    """Many names built the same way, listed by a function (e.g. torchvision's classification models)."""

    names: Callable[[], Iterable[str]]
    obj: Any
    info: Info
    fields: dict[str, tuple[Any, Any]]


class Registry:
    """Names of one kind of part (``kind``), the config key that chooses one (``key``), and the modules that
    register the built-in ones (``locations``)."""

    def __init__(self, kind: str, key: str, locations: tuple[str, ...] = (), info: type[Info] = NoInfo) -> None:
        self.kind, self.key, self.locations, self.info_type = kind, key, locations, info
        self._entries: dict[str, Entry] = {}
        self._parts: list[Entry | _Family] = []  # in registration order
        self._loaded = False

    def register(self, name: str, obj: Any = None, *, fields: dict[str, tuple[Any, Any]] | None = None,
                 **info: Any) -> Any:
        """Register ``obj`` under ``name``; without ``obj``, a decorator that registers what it decorates.

        A name a family already lists may be registered on its own, to give it other ``info`` (a model with a
        smallest input size); it keeps its place in the family's listing."""
        if obj is None:
            return lambda decorated: self.register(name, decorated, fields=fields, **info)
        if name in self._entries and self._entries[name].obj is not obj:
            raise ValueError(f"{self.kind} {name!r} is registered twice")
        self._check_fields(fields or {})
        entry = Entry(name, obj, self._info(name, info), dict(fields or {}))
        if name in self._entries:
            self._parts.remove(self._entries[name])
        self._entries[name] = entry
        self._parts.append(entry)
        return obj

    def register_family(self, names: Callable[[], Iterable[str]], obj: Any, *,
                        fields: dict[str, tuple[Any, Any]] | None = None, **info: Any) -> None:
        """Register every name ``names()`` lists (read when first needed), all built by ``obj``."""
        self._check_fields(fields or {})
        facts = self._info(getattr(obj, "__name__", "family"), info)
        self._parts.append(_Family(names, obj, facts, dict(fields or {})))

    def _info(self, name: str, info: dict[str, Any]) -> Info:
        """The registration's facts as this registry's ``Info`` type: an unknown or missing key is a TypeError."""
        try:
            return self.info_type(**info)
        except TypeError as e:
            known = ", ".join(self.info_type.__dataclass_fields__) or "none"  # type: ignore[attr-defined]
            raise TypeError(f"{self.kind} {name!r}: {e} (the facts a {self.kind} registers: {known})") from None

    def unregister(self, name: str) -> None:
        """Remove a part registered under ``name`` (tests that register a toy one clean up with this)."""
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._parts.remove(entry)

    def unregister_family(self, obj: Any) -> None:
        """Remove the families built by ``obj``."""
        self._parts = [p for p in self._parts if not (isinstance(p, _Family) and p.obj is obj)]

    def _check_fields(self, fields: dict[str, tuple[Any, Any]]) -> None:
        """A field two parts both add must be the same field (type and default) in both."""
        for name, spec in fields.items():
            other = next((p.fields[name] for p in self._parts if name in p.fields), spec)
            if other != spec:
                raise ValueError(f"{self.kind} field {name!r} is registered twice, as {other} and as {spec}")

    def _load(self) -> None:
        if not self._loaded:
            self._loaded = True
            for module in self.locations:
                importlib.import_module(module)

    def _place(self, part: Entry | _Family) -> int:
        """Where a part is listed: built-in parts in the order of ``locations`` (whatever imported them first),
        then the others."""
        module = getattr(part.obj, "__module__", None)
        return self.locations.index(module) if module in self.locations else len(self.locations)

    def names(self, **where: Any) -> list[str]:
        """Every registered name: the built-in ones in the order of ``locations``, each module's in registration
        order (a family's names where the family was registered), then the others in registration order; or only
        those whose ``info`` holds the given values (``DATASETS.names(task="detection")``)."""
        self._load()
        names: dict[str, None] = {}
        for part in sorted(self._parts, key=self._place):
            for name in [part.name] if isinstance(part, Entry) else part.names():
                names.setdefault(name)
        if where:
            return [n for n in names if all(self.get(n).info.get(k) == v for k, v in where.items())]
        return list(names)

    def __contains__(self, name: str) -> bool:
        return self.find(name) is not None

    def find(self, name: str) -> Entry | None:
        """The entry of ``name``, or None."""
        self._load()
        if name in self._entries:
            return self._entries[name]
        for part in self._parts:
            if isinstance(part, _Family) and name in part.names():
                return Entry(name, part.obj, part.info, part.fields)
        return None

    def get(self, name: str) -> Entry:
        """The entry of ``name``; an unknown name is a ``ValueError`` listing the known ones."""
        entry = self.find(name)
        if entry is None:
            known = self.names()
            shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
            raise ValueError(f"unknown {self.kind} {name!r}{did_you_mean(name, known)} (expected one of: {shown})")
        return entry

    def all_fields(self, load: bool = True) -> dict[str, tuple[Any, Any]]:
        """The config fields every registered part adds to the section (for checking keys before building); without
        ``load``, those of the parts registered so far, the built-in ones not imported."""
        if load:
            self._load()
        added: dict[str, tuple[Any, Any]] = {}
        for part in self._parts:
            added.update(part.fields)
        return added


TASKS = Registry("task", "task", ("bigbatch.tasks.classification", "bigbatch.tasks.detection"), TaskInfo)
"""``task``: obj = the task class (``tasks/base.py``'s ``Task``), built by ``obj.from_config(cfg, rank)``.
info: ``metrics`` (the names ``eval.metric`` may take, the default first), ``metric_prefixes`` (optional: per-class
metrics, ``("AP/",)`` admits ``AP/<class>``), ``model_kind`` (what a model of the task is called in an error
message: ``classifier``, ``detector``)."""
OPTIMIZERS = Registry("optimizer", "optim.name", ("bigbatch.largebatch.optim",), OptimInfo)
"""``optim.name``: obj(param_groups, lr, optim_cfg) -> torch.optim.Optimizer (``lr``: for the global batch)."""
SCHEDULES = Registry("schedule", "schedule.preset", ("bigbatch.largebatch.schedule",), ScheduleInfo)
"""``schedule.preset``: obj(cfg, plan) -> lr(step), the LR of each 0-based optimizer step for the batch plan;
``none`` composes ``schedule.warmup`` and ``schedule.decay``. Optional info ``burn_in(schedule_cfg) -> steps``: the
schedule's burn-in, which the ``update_ratio`` loss scaler follows by default; ``warmup_steps(cfg, plan) -> steps``:
where its warmup ends (``norm.freeze_during_warmup``)."""
DECAYS = Registry("decay", "schedule.decay.kind", ("bigbatch.largebatch.schedule",), DecayInfo)
"""``schedule.decay.kind``: obj(decay_cfg, plan, start, floor) -> factor(step), the factor on the scaled LR at
absolute step ``step`` (``start``: the step where the warmup ends; ``floor``: the factor's lower bound, applied by
the caller too). info: ``rates`` (optional): ``{field: rule}`` for a field of the section that is a per-step rate
(``config.SLOPE``, ``config.POWER``, ``config.COMPLEMENT``), which ``bigbatch scale`` adapts to the new batch."""
DATASETS = Registry("dataset", "data.name", ("bigbatch.data.formats.digits", "bigbatch.data.formats.folder",
                                             "bigbatch.data.formats.shards", "bigbatch.data.formats.shapes",
                                             "bigbatch.data.formats.coco", "bigbatch.darknet.yolo_data"), DatasetInfo)
"""``data.name``: info ``task`` names the task whose data it is; ``count(cfg) -> int`` is the training set's size
found without loading it (``show``, ``schedule``, ``scale``, the batch plan); ``held_in_memory(cfg) -> (bytes,
what)`` (optional) is the memory the loaded set holds whatever the layout, checked against the machine's before
any work. obj loads it, by task:

- ``classification``: obj(cfg) -> (train_set, val_set, num_classes); each set a ``torch.utils.data.Dataset`` of
  (image ``[C, H, W]`` float tensor, label int) read by index;
- ``detection``: obj(cfg, issues, rank) -> (train_records, val_records, class_names), lists of
  ``data.detection.DetectionRecord`` (labels ``0..C-1`` in ``class_names``' order, the same classes in both
  splits); ``issues`` (``data.problems.DataIssues``) collects the data problems; ``rank`` 0 alone prepares shared
  files (the other ranks wait at a barrier)."""
MODELS = Registry("model", "model.name",
                  ("bigbatch.models", "bigbatch.models.timm_models", "bigbatch.models.detectors",
                   "bigbatch.darknet.models"), ModelInfo)
"""``model.name``: info ``task``; ``min_input_size`` (optional: the smallest square input in pixels);
``start_weights`` (optional: the family's own weights files, ``engine/start_weights.py``); ``size_key`` (optional:
the key that sets its size, named when it is too large; default ``model.name``); ``describe`` (optional:
describe(cfg) -> the text ``bigbatch show`` prints after the plan, such as a network's layer table; it is called,
and may raise a ``UserError``, before anything is printed). obj builds the model with random weights
(``model.weights`` is loaded after it, by ``engine/start_weights.py``), nothing downloaded, by task:

- ``classification``: obj(model_cfg, num_classes, in_channels) -> nn.Module, images -> logits;
- ``detection``: obj(model_cfg, num_classes, *, min_size, max_size) -> nn.Module with ``models/detectors.py``'s
  contract (labels ``0..C-1``; a dict of losses in train mode, detections in eval mode)."""
HOOKS = Registry("hook", "", ("bigbatch.engine.hooks",))
"""Hooks every run builds: obj(run) -> a ``Hook`` or None (not wanted by this config); each hook declares its stage
(``engine/hooks/base.py``), so a hook registers no facts."""
BATCH_CONTROLLERS = Registry("batch controller", "", ("bigbatch.engine.controllers.adaptive",
                                                      "bigbatch.engine.controllers.scheduled",
                                                      "bigbatch.engine.controllers.fixed"), ControllerInfo)
"""What decides each step's batch and LR gain (``engine/controllers/``): obj(cfg, plan, proc) -> a
``BatchController``; the first whose ``chooses(cfg)`` holds drives the run."""
CONFIG_FORMATS = Registry("config format", "", ("bigbatch.darknet.recipe",))
"""Config files other than YAML, by suffix (``.cfg``): obj(path) -> the config as a dict, as YAML would give it;
a mistake in the file is a ``UserError`` naming it."""
MODEL_FILES = Registry("model file", "--from", ("bigbatch.darknet.predict",), ModelFileInfo)
"""Models ``bigbatch predict`` and ``bigbatch.load`` take besides runs and checkpoints, by suffix (``.cfg``):
obj(path, weights, names, device, size, letterbox, dialect) -> an ``inference.predictor.Predictor``."""


def did_you_mean(word: object, choices: list[str]) -> str:
    """``", did you mean 'steps'?"`` for the choice nearest ``word`` (difflib's ratio, at least 0.6), else ``""``:
    a misspelt key, name or recipe gets its likely meaning in the one error line."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f", did you mean {close[0]!r}?" if close else ""
