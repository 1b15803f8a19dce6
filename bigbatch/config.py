"""The run configuration: typed, validated, loaded from YAML plus ``--set a.b=c`` overrides.

A config is a YAML file or the name of a built-in recipe (``bigbatch/configs/<name>.yaml``).
Every mistake (unknown key, wrong type, bad value) becomes one :class:`UserError` that names
the dotted key and says what is expected, before any work starts.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bigbatch.errors import UserError

RECIPES_DIR = Path(__file__).parent / "configs"


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, types are not coerced."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ModelConfig(Section):
    name: str = "small_cnn"
    """``small_cnn`` (the built-in demo CNN) or a torchvision classification model (``resnet18``, ...)."""
    norm: Literal["batch", "group", "none"] = "batch"
    """Normalisation layers of ``small_cnn``; torchvision models with a ``norm_layer`` argument take it too."""
    width: int = Field(32, gt=0)
    """Channels of the first ``small_cnn`` stage (doubled at each of the next two)."""

    @field_validator("name")
    @classmethod
    def _known_model(cls, name: str) -> str:
        from bigbatch.models import known_models

        known = known_models()
        if name not in known:
            shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
            raise ValueError(f"unknown model {name!r} (expected one of: {shown})")
        return name


class DataConfig(Section):
    name: Literal["digits"] = "digits"
    """The dataset. ``digits``: scikit-learn's 8x8 handwritten digits, upscaled to ``size`` px RGB."""
    size: int = Field(32, gt=0)
    """Side of the square training and evaluation images, in pixels."""
    workers: int = Field(0, ge=0)
    """DataLoader worker processes (0: load in the training process)."""


class OptimConfig(Section):
    name: Literal["sgd"] = "sgd"
    lr: float = Field(0.1, gt=0)
    """Learning rate for the global batch."""
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = False
    weight_decay: float = Field(0.0, ge=0)


class EvalConfig(Section):
    every: int = Field(50, gt=0)
    """Evaluate every this many optimizer steps, and always at the end."""
    batch: int = Field(256, gt=0)
    """Images per evaluation forward pass (any size: every validation image is seen once)."""
    metric: str = "top1"
    """Metric that selects ``best.pt``."""
    mode: Literal["max", "min"] = "max"


class CheckpointConfig(Section):
    every: int = Field(50, gt=0)
    """Write ``checkpoints/last.pt`` every this many optimizer steps, and always at the end."""


class LogConfig(Section):
    every: int = Field(10, gt=0)
    """Write a training record to ``metrics.jsonl`` every this many steps (and the first and last)."""
    tensorboard: bool = True


class RunConfig(Section):
    name: str = "run"
    """Recipe name; the default run directory is ``runs/<name>-<timestamp>``."""
    task: Literal["classification"] = "classification"
    batch: int = Field(gt=0)
    """Global images per optimizer step, across all devices (Darknet's ``batch``)."""
    subdivisions: int = Field(1, gt=0)
    """Micro-batches per device per optimizer step (Darknet's ``subdivisions``)."""
    steps: int | None = Field(None, gt=0)
    """Optimizer steps. Give either ``steps`` or ``epochs``."""
    epochs: float | None = Field(None, gt=0)
    """Passes over the training set, turned into steps = ceil(epochs * images / batch)."""
    seed: int = 0
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    optim: OptimConfig = OptimConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> RunConfig:
        if self.steps is None and self.epochs is None:
            raise ValueError("steps: missing; give steps (optimizer steps) or epochs")
        if self.steps is not None and self.epochs is not None:
            raise ValueError("steps: give either steps or epochs, not both")
        return self


# ----------------------------------------------------------------------------- loading


def builtin_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; syntax errors name the file and line."""
    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise UserError(f"config: cannot read {path}: {e.strerror}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise UserError(f"config: {where}: invalid YAML: {e.problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config: {path}: expected a mapping of keys at the top level")
    return data


def resolve_config_source(source: str) -> tuple[Path, str]:
    """A config argument is a YAML file or a built-in recipe name; returns (path, recipe name)."""
    path = Path(source)
    if path.is_file():
        return path, path.stem
    builtin = RECIPES_DIR / f"{source}.yaml"
    if builtin.is_file():
        return builtin, source
    raise UserError(
        f"config: {source!r} is neither a YAML file nor a built-in recipe "
        f"(built-in: {', '.join(builtin_recipes())})"
    )


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b=value`` -> (["a", "b"], value), the value read as YAML (``3``, ``0.1``, ``true``, ``[a, b]``)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise UserError(f"--set: expected KEY=VALUE with a dotted key, got {text!r}")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


# Keys of which only one may be given; setting one from the command line drops the other.
_EXCLUSIVE = {"steps": "epochs", "epochs": "steps"}


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for text in overrides:
        keys, value = parse_override(text)
        node = data
        for i, key in enumerate(keys[:-1]):
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise UserError(f"{'.'.join(keys[: i + 1])}: is a value, not a section; cannot set {'.'.join(keys)}")
            node = child
        node[keys[-1]] = value
        if len(keys) == 1 and keys[0] in _EXCLUSIVE:
            data.pop(_EXCLUSIVE[keys[0]], None)
    return data


def _describe(error: dict[str, Any], section: type[BaseModel] | None) -> str:
    loc = ".".join(str(p) for p in error["loc"])
    kind = error["type"]
    if kind == "extra_forbidden":
        expected = ", ".join(section.model_fields) if section is not None else "a known key"
        return f"{loc}: unknown key (expected one of: {expected})"
    if kind == "missing":
        return f"{loc}: missing (required)"
    message = error["msg"]
    if kind == "value_error":  # our own validators already say which key
        message = message.removeprefix("Value error, ")
        return message if ":" in message.split(" ")[0] else f"{loc}: {message}"
    message = message[0].lower() + message[1:]
    return f"{loc}: {message}, got {error['input']!r}"


def _section_of(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The config class that holds the parent of ``loc`` (for listing the keys it accepts)."""
    cls: type[BaseModel] = RunConfig
    for part in loc[:-1]:
        field = cls.model_fields.get(str(part))
        annotation = field.annotation if field is not None else None
        if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
            return None
        cls = annotation
    return cls


def validate_config(data: dict[str, Any]) -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        lines = [_describe(err, _section_of(err["loc"])) for err in e.errors()]
        raise UserError("; ".join(lines)) from None


def load_config(source: str, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load a YAML file or built-in recipe, apply ``--set`` overrides, validate."""
    path, recipe = resolve_config_source(source)
    data = read_yaml(path)
    data.setdefault("name", recipe)
    return validate_config(apply_overrides(data, list(overrides)))


def config_to_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
