"""The run configuration: typed, validated, loaded from YAML plus ``--set a.b=c`` overrides.

A config is a YAML file, a file another tool writes whose reader registered its suffix
(``registry.CONFIG_FORMATS``: Darknet's ``.cfg``) or the name of a built-in recipe
(``bigbatch/configs/<name>.yaml``). Every mistake (unknown key, wrong type, bad value) becomes one
:class:`UserError` that names the dotted key and says what is expected, before any work starts.

The package is a leaf: it imports nothing from bigbatch but ``errors`` and ``registry``. The names a config
may give (``optim.name``, ``schedule.preset``, ``schedule.decay.kind``, ``data.name``, ``model.name``, ``task``)
are those registered there, and what it checks across sections (task, data and model agree; the smallest input;
the metric) reads what the parts registered about themselves. A part may add keys to its section
(:class:`PartSection`); the built-in parts' keys are declared here, with their sections, so that a config's keys are
known before any part (or torch) is imported.

Its modules, each one idea:

- ``values``: the value types and their parsers (:data:`Length`, :data:`Interval`, :data:`Size`,
  :func:`parse_length`, :func:`parse_size`) and the markers ``bigbatch scale`` reads (:class:`InImages`,
  :class:`Steps`, :class:`PerStep`, :class:`UsedWhen`);
- ``section``: the bases :class:`Section` and :class:`PartSection`;
- the schema, by section: ``model``, ``data``, ``optim`` (and ``clip``), ``schedule``, ``training`` (``ema``,
  ``norm``, ``precision``, ``loss``), ``monitoring`` (``eval``, ``checkpoint``, ``log``, ``memory``, ``debug``),
  and ``run`` (:class:`RunConfig`, the checks across sections);
- ``data_keys``: the keys the built-in dataset formats add to ``data`` (:data:`DATASET_KEYS`; the built-in
  optimizers' and model families' are in ``optim`` and ``model``: :data:`OPTIMIZER_KEYS`, :data:`MODEL_KEYS`);
- ``adaptive``: ``batch: {mode: adaptive, ...}`` (AdaScale's base and largest batch);
- ``loading``: the source, the bounded YAML reader, ``--set`` overrides, validation, :func:`config_to_yaml`,
  :func:`check_keys` (what validation says first of the keys, said before any part loads);
- ``unknown_keys``: a config's unknown keys, said as validation says them, without the parts;
- ``messages``: a pydantic error as one line naming the dotted key.

Every public name is importable from ``bigbatch.config`` itself.
"""

from bigbatch.config.adaptive import AdaptiveBatch
from bigbatch.config.data import DataConfig, MultiScaleConfig, SizeList
from bigbatch.config.data_keys import DATASET_KEYS, DarknetAugment, SplitPaths, StandardAugment
from bigbatch.config.loading import (
    INT64_LIMIT,
    MAX_YAML_NODES,
    RECIPES_DIR,
    YAMLTooLarge,
    apply_overrides,
    builtin_recipes,
    check_keys,
    config_to_yaml,
    flatten,
    load_config,
    load_yaml,
    parse_override,
    read_config,
    read_yaml,
    resolve_config_source,
    validate_config,
)
from bigbatch.config.model import MODEL_KEYS, ModelConfig
from bigbatch.config.monitoring import CheckpointConfig, DebugConfig, EvalConfig, LogConfig, MemoryConfig
from bigbatch.config.optim import OPTIMIZER_KEYS, ClipConfig, OptimConfig
from bigbatch.config.run import RunConfig
from bigbatch.config.schedule import (
    DarknetScheduleConfig,
    DecayConfig,
    InceptionTPUConfig,
    ScheduleConfig,
    WarmupPhase,
)
from bigbatch.config.section import PartSection, Section
from bigbatch.config.training import EMAConfig, LossConfig, NormConfig, PrecisionConfig
from bigbatch.config.values import (
    COMPLEMENT,
    POWER,
    SLOPE,
    InImages,
    Interval,
    Length,
    PerStep,
    Size,
    StepCount,
    Steps,
    UsedWhen,
    parse_length,
    parse_size,
)

__all__ = [
    "AdaptiveBatch",
    "COMPLEMENT", "DATASET_KEYS", "INT64_LIMIT", "MAX_YAML_NODES", "MODEL_KEYS", "OPTIMIZER_KEYS", "POWER",
    "RECIPES_DIR", "SLOPE",
    "CheckpointConfig", "ClipConfig", "DarknetAugment", "DarknetScheduleConfig", "DataConfig", "DebugConfig",
    "DecayConfig",
    "EMAConfig", "EvalConfig", "InImages", "InceptionTPUConfig", "Interval", "Length", "LogConfig", "LossConfig",
    "MemoryConfig", "ModelConfig", "MultiScaleConfig", "NormConfig", "OptimConfig", "PartSection", "PerStep",
    "PrecisionConfig", "RunConfig", "ScheduleConfig", "Section", "Size", "SizeList", "SplitPaths", "StandardAugment",
    "StepCount", "Steps", "UsedWhen", "WarmupPhase", "YAMLTooLarge",
    "apply_overrides", "builtin_recipes", "check_keys", "config_to_yaml", "flatten", "load_config", "load_yaml",
    "parse_length", "parse_override", "parse_size", "read_config", "read_yaml", "resolve_config_source",
    "validate_config",
]
