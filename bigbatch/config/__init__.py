"""The run configuration: typed, validated, loaded from YAML plus ``--set a.b=c`` overrides.

A config is a YAML file, a file another tool writes whose reader registered its suffix
(``registry.CONFIG_FORMATS``: Darknet's ``.cfg``) or the name of a built-in recipe
(``bigbatch/configs/<name>.yaml``). Every mistake (unknown key, wrong type, bad value) becomes one
:class:`UserError` that names the dotted key and says what is expected, before any work starts.

This module is a leaf: it imports nothing from bigbatch but ``errors`` and ``registry``. The names a config
may give (``optim.name``, ``schedule.preset``, ``schedule.decay.kind``, ``data.name``, ``model.name``, ``task``)
are those registered there, and what it checks across sections (task, data and model agree; the smallest input;
the metric) reads what the parts registered about themselves. A part may add keys to its section
(:class:`PartSection`).

Fields are typed by what they mean where ``bigbatch scale`` must know it (``recipe/rescale.py``): a
:data:`Length` or :data:`Interval` (steps, epochs or images), a :data:`StepCount` (whole optimizer steps), a
per-step rate (:class:`PerStep`), a sub-section used only for one choice (:class:`UsedWhen`).
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails

from bigbatch.errors import UserError
from bigbatch.registry import CONFIG_FORMATS, DATASETS, DECAYS, MODELS, OPTIMIZERS, SCHEDULES, TASKS, Registry

RECIPES_DIR = Path(__file__).parent.parent / "configs"


# ----------------------------------------------------------------------------- sections and parts


def _annotation(field: Any) -> Any:
    """A pydantic field's annotation with the ``Annotated`` metadata pydantic keeps apart (markers, constraints)."""
    return Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, types are not coerced, numbers are finite
    (``.inf``, ``.nan`` and YAML floats too large for a double, such as ``1.0e+400``, are refused)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @classmethod
    def keys(cls) -> dict[str, Any]:
        """Every key the section takes -> its annotation (``Annotated`` markers included)."""
        return {name: _annotation(field) for name, field in cls.model_fields.items()}


def _registered(registry: Registry) -> AfterValidator:
    """A check that a name is registered in ``registry`` ("unknown optimizer 'x' (expected one of: ...)")."""

    def check(name: str) -> str:
        registry.get(name)
        return name

    return AfterValidator(check)


class PartSection(Section):
    """A section that chooses a part from a registry (``parts``; its ``key`` names the choosing field) and takes
    the fields the registered parts add (``register(..., fields={"root": (str, "x")})``: the key ``root``, typed
    and defaulted as given, whatever part is chosen). A key neither declared nor registered is an error, as in
    any section. Once the section is valid, the chosen part's ``info["check"](section)`` runs, if it has one."""

    model_config = ConfigDict(extra="allow")  # the parts' fields; any other key is refused below
    parts: ClassVar[Registry]

    @classmethod
    def added_fields(cls) -> dict[str, tuple[Any, Any]]:
        """The fields the registered parts add: ``{key: (type, default)}``."""
        added = cls.parts.all_fields()
        taken = sorted(added.keys() & cls.model_fields.keys())
        if taken:
            raise TypeError(f"{cls.parts.kind} fields {taken} are keys of {cls.__name__} already")
        return added

    @classmethod
    def keys(cls) -> dict[str, Any]:
        return {**super().keys(), **{key: annotation for key, (annotation, _) in cls.added_fields().items()}}

    def part(self) -> Any:
        """The registry entry of the chosen part."""
        return self.parts.get(getattr(self, self.parts.key.rpartition(".")[2]))

    @model_validator(mode="wrap")
    @classmethod
    def _with_added_fields(cls, data: Any, handler: Any) -> Any:
        if not isinstance(data, dict):
            return handler(data)
        added = cls.added_fields()
        errors: list[dict[str, Any]] = []
        section = None
        try:
            section = handler({k: v for k, v in data.items() if k in cls.model_fields})
        except ValidationError as e:
            errors += e.errors()
        values = {}
        for key, (annotation, default) in added.items():
            if key not in data:
                values[key] = copy.deepcopy(default)
                continue
            try:
                values[key] = _adapter(annotation).validate_python(data[key])
            except ValidationError as e:
                errors += [{**error, "loc": (key, *error["loc"])} for error in e.errors()]
        errors += [{"type": "extra_forbidden", "loc": (key,), "input": value} for key, value in data.items()
                   if key not in cls.model_fields and key not in added]
        if errors:
            details = [InitErrorDetails(type=e["type"], loc=e["loc"], input=e["input"], ctx=e.get("ctx", {}))
                       for e in errors]
            raise ValidationError.from_exception_data(cls.__name__, details)
        section.__pydantic_extra__.update(values)
        check = section.part().info.get("check")
        if check is not None:
            check(section)
        return section


def _adapter(annotation: Any) -> TypeAdapter:
    """A validator of one added field, as strict as a section's own fields."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return TypeAdapter(annotation)  # a section brings its own config
    return TypeAdapter(annotation, config=ConfigDict(strict=True, allow_inf_nan=False))


@dataclass(frozen=True)
class InImages:
    """Marks a length (:data:`Length`, :data:`Interval`) for ``bigbatch scale``: kept constant in images."""


@dataclass(frozen=True)
class Steps:
    """Marks a whole number of optimizer steps (a count or a step index, :data:`StepCount`) for ``bigbatch scale``:
    kept constant in images, n' = n * B / B', rounded to the nearest step (``up``: rounded up, so that no image of
    the old run is lost), at least ``minimum``."""

    minimum: int = 0
    up: bool = False


POWER = "power"
"""A factor applied once per step (an EMA decay, Darknet's ``exp`` gamma): x' = x ** (B' / B)."""
COMPLEMENT = "complement"
"""The weight of each step's new value (a BatchNorm momentum): (1 - x') = (1 - x) ** (B' / B)."""
SLOPE = "slope"
"""A rate per step inside an exponent (a sigmoid's gamma): x' = x * B' / B."""


@dataclass(frozen=True)
class PerStep:
    """Marks a per-step rate for ``bigbatch scale``, which keeps its effect per image by ``rule`` (:data:`POWER`,
    :data:`COMPLEMENT`, :data:`SLOPE`); with ``on``, the rule depends on the value of the section's field ``on``
    (``rules``: (value, rule) pairs; for another value the field is no rate)."""

    rule: str | None = None
    on: str | None = None
    rules: tuple[tuple[str, str], ...] = ()

    def rule_in(self, section: BaseModel) -> str | None:
        return self.rule if self.on is None else dict(self.rules).get(getattr(section, self.on))


@dataclass(frozen=True)
class UsedWhen:
    """Marks a sub-section that matters only when the section's field ``field`` is ``value`` (a preset's own
    settings); ``bigbatch scale`` leaves it alone otherwise."""

    field: str
    value: str


StepCount = Annotated[int, Steps()]
"""A whole number of optimizer steps (constraints at the field: ``Field(0, ge=0)``)."""


class ModelConfig(PartSection):
    parts = MODELS

    name: Annotated[str, _registered(MODELS)] = "small_cnn"
    """Classification: ``small_cnn`` (the built-in demo CNN) or a torchvision classification model (``resnet18``,
    ...). Detection: ``small_detector`` or a torchvision detector (``fasterrcnn_resnet50_fpn``, ...)."""
    weights: str | None = None
    """Detection: start from this local weights file (a state dict or a bigbatch checkpoint); unset: from scratch.
    Nothing is ever downloaded."""
    norm: Literal["batch", "group", "none"] = "batch"
    """Normalisation layers of ``small_cnn``; torchvision models with a ``norm_layer`` argument take it too."""
    width: int = Field(32, gt=0)
    """Channels of the first ``small_cnn`` stage (doubled at each of the next two)."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout before the classifier (``small_cnn``; torchvision models that take a ``dropout`` argument)."""


class SplitPaths(Section):
    """Where one split (train or val) of a COCO dataset is. Relative paths are taken from the current directory."""

    images: str
    """The folder of the split's images."""
    annotations: str
    """The split's COCO JSON annotation file."""


SizeList = Annotated[list[Annotated[int, Field(gt=0, multiple_of=32)]], Field(min_length=1)]
"""One or more input sizes, multiples of 32."""


class MultiScaleConfig(Section):
    """Multi-scale training (Darknet's ``random=1``): a new input size every ``every`` steps, the same on every
    rank and after a resume (drawn from the seed and the step); the first steps run at the largest size."""

    sizes: SizeList | Literal["auto"] | None = None
    """Training sizes (``data.size`` for each step): a list, drawn uniformly; ``auto``: Darknet's rule around
    ``data.size`` with ``range`` (``round(r * size / 32 + 1) * 32``, r in [1/range, range]: 416 takes 320..608;
    ``data/multiscale.py``); unset: multi-scale training is off."""
    every: int = Field(10, gt=0)
    """Steps between two size changes."""
    range: float = Field(1.4, ge=1, le=10)
    """``auto``: the range of the drawn scale (Darknet's ``random`` in the last ``[yolo]`` layer: 1 means 1.4)."""
    final: int = Field(100, ge=0)
    """The last steps of the run at the largest size, as Darknet's last 100 (BatchNorm statistics settle at it)."""


class DataConfig(PartSection):
    parts = DATASETS

    name: Annotated[str, _registered(DATASETS)] = "digits"
    """The dataset. Classification: ``digits`` (scikit-learn's 8x8 handwritten digits, upscaled to ``size`` px RGB),
    ``folder`` (image files in ``path``/train/CLASS/ and ``path``/val/CLASS/, ImageNet's layout) or ``shards``
    (the same packed by ``bigbatch pack``: tar shards and an index in ``path``). Detection:
    ``shapes`` (bigbatch's generated set, written to ``path`` when absent), ``coco`` (COCO JSON, ``train`` and
    ``val``) or ``yolo`` (Darknet/YOLO text labels: a ``.data`` file or a folder, ``path``)."""
    size: int = Field(32, gt=0)
    """Classification: side of the square input images. Detection: the shorter side after resizing
    (``shorter_side``) or the square side (``letterbox``), for evaluation and, without multi-scale, for training."""
    max_size: int | None = Field(None, gt=0)
    """Detection, ``shorter_side``: the longer side's cap (detectron's 1333 for 800); unset: size x 1333 / 800."""
    resize: Literal["shorter_side", "letterbox"] = "shorter_side"
    """Detection: scale the shorter side to ``size`` (longer side at most ``max_size``; Faster R-CNN, RetinaNet,
    FCOS), or letterbox into a ``size`` x ``size`` square (square-input detectors: SSD, YOLO)."""
    path: str | None = None
    """``folder``: the folder holding ``train/`` and ``val/``; ``shapes``: the folder of the generated set (default
    ``data/shapes``); ``yolo``: the ``.data`` file or the dataset folder."""
    train: SplitPaths | None = None
    """``coco``: the training split."""
    val: SplitPaths | None = None
    """``coco``: the validation split."""
    classes: list[str] | None = None
    """Detection: train and evaluate on these classes only, by name, in this order (e.g. ``[cat, dog]``)."""
    strict: bool = False
    """Image files (``folder``, detection): stop before training (exit code 2) at the first bad image, box or label
    line, naming the file (every image is decoded once first); by default each is reported once and skipped (an
    unreadable image is replaced by the next readable one), and a summary printed."""
    train_images: int | None = Field(None, gt=0)
    """The training set's size (``folder``, detection), used by ``show``, ``schedule`` and ``scale`` only when the
    data is not at hand (e.g. ``118287`` for COCO train2017); training always counts the images it loads."""
    shapes_images: int = Field(2000, gt=0)
    """``shapes``: images to generate (train and val together) when ``path`` holds no set yet."""
    flip: float = Field(0.5, ge=0, le=1)
    """Detection: probability of a horizontal flip."""
    crop: bool = False
    """Detection: a random crop (boxes leaving it dropped, the rest clipped) before resizing."""
    jitter: float = Field(0.0, ge=0, lt=0.5)
    """Detection: Darknet's jitter crop: each side moved in or out by up to ``jitter`` x the side (outside: black),
    the window then stretched to size x size (Darknet's ``letter_box=0``) in place of ``resize``; 0: off."""
    hue: float = Field(0.0, ge=0, le=0.5)
    """Detection: Darknet's hue shift, U(-hue, hue) turns of the colour circle."""
    saturation: float = Field(1.0, ge=1)
    """Detection: Darknet's saturation scale, u or 1/u with u ~ U[1, saturation]."""
    exposure: float = Field(1.0, ge=1)
    """Detection: Darknet's exposure (HSV value) scale, u or 1/u with u ~ U[1, exposure]."""
    crop_size: int | None = Field(None, gt=0)
    """Detection: after the resize, a random ``crop_size`` x ``crop_size`` window of the training image (a shorter
    side is kept whole) that keeps at least one box: MegDet's 800 x 800 after the shorter side is resized to 800."""
    color_jitter: float = Field(0.0, ge=0, le=1)
    """Detection: brightness, contrast and saturation jitter of +-this (MegDet: 0.4)."""
    multiscale: MultiScaleConfig = MultiScaleConfig()
    workers: int = Field(0, ge=0)
    """DataLoader worker processes (0: load in the training process)."""

    @property
    def is_detection(self) -> bool:
        return self.part().info["task"] == "detection"

    @property
    def longest_side(self) -> int:
        """Detection: the longer side's cap at ``size`` (shorter-side resizing)."""
        return self.max_size if self.max_size is not None else round(self.size * 1333 / 800)

    @model_validator(mode="after")
    def _sizes_agree(self) -> DataConfig:
        if self.max_size is not None and self.max_size < self.size:
            raise ValueError(f"data.max_size: {self.max_size} is below data.size {self.size}")
        return self


class OptimConfig(PartSection):
    """The optimizer. ``lr`` is stated for ``ref_batch`` images per step and scaled to the global batch."""

    parts = OPTIMIZERS

    name: Annotated[str, _registered(OPTIMIZERS)] = "sgd"
    """``sgd``: torch.optim.SGD (LR outside the momentum buffer); ``momentum``: Caffe2's momentum SGD, Goyal et al.
    eq. 10 (v = m v + lr g; w -= v: LR inside the buffer); ``rmsprop_tf``: TF RMSProp; ``adamw``; ``lars``;
    ``lamb`` (as timm's: it also clips the global gradient norm at 1.0, and like ``lars`` applies its trust ratio
    only to parameters with weight decay)."""
    lr: float = Field(0.1, gt=0)
    """Learning rate for ``ref_batch`` images per step (for the global batch itself when ``ref_batch`` is unset)."""
    ref_batch: int | None = Field(None, gt=0)
    """The batch ``lr`` is stated for; unset: ``lr`` is used as it is, whatever the batch."""
    scaling: Literal["linear", "sqrt", "none"] = "linear"
    """How ``lr`` follows the batch: lr * (batch / ref_batch) (Goyal et al. 2017), its square root, or not at all."""
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = False
    weight_decay: float = Field(0.0, ge=0)
    no_decay_norm_bias: bool = False
    """No weight decay on normalisation layers' parameters and on biases (1-d parameters)."""
    eps: float | None = Field(None, gt=0)
    """Epsilon; unset: the optimizer's default (rmsprop_tf 1.0 as in the Inception seed, adamw and lars 1e-8,
    lamb 1e-6 as timm)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam-style moment decays (adamw, lamb)."""
    rmsprop_decay: float = Field(0.9, gt=0, lt=1)
    """RMSProp's mean-square decay (TF's ``decay``; the Inception seed uses 0.9)."""
    trust_coefficient: float = Field(0.001, gt=0)
    """LARS trust coefficient."""
    momentum_correction: bool = False
    """For optimizers with the LR inside the momentum buffer (momentum, rmsprop_tf): when the LR changes from
    lr_old to lr_new, scale the buffer by lr_new / lr_old (Goyal et al. 2017, remark 2)."""

    @field_validator("betas", mode="before")
    @classmethod
    def _betas_from_list(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value


class ClipConfig(Section):
    """Gradient clipping, at most one kind; applied to unscaled gradients, once per optimizer step."""

    max_norm: float | None = Field(None, gt=0)
    """Clip the global 2-norm of all gradients to this (MegDet: 3.0 from step 300)."""
    max_value: float | None = Field(None, gt=0)
    """Clip every gradient element to [-max_value, max_value]."""
    agc: float | None = Field(None, gt=0)
    """Adaptive gradient clipping factor (Brock et al. 2021): unit-wise ||g|| <= agc * max(||w||, eps)."""
    agc_eps: float = Field(1e-3, gt=0)
    start_step: StepCount = Field(0, ge=0)
    """Clip from this optimizer step on (0-based)."""

    @model_validator(mode="after")
    def _one_kind(self) -> ClipConfig:
        kinds = [k for k in ("max_norm", "max_value", "agc") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"clip.{kinds[1]}: give one of clip.max_norm, clip.max_value, clip.agc, not several")
        return self


class EMAConfig(Section):
    """Exponential moving average of the weights, updated once per applied optimizer step."""

    decay: Annotated[float, PerStep(POWER)] | None = Field(None, gt=0, lt=1)
    """EMA decay per optimizer step (Inception seed: 0.995); unset: no EMA."""
    warmup: bool = False
    """Use min(decay, (1 + n) / (10 + n)) at the n-th update (TensorFlow's num_updates rule)."""
    evaluate: bool = True
    """Evaluate the EMA weights (and pick ``best.pt`` by them); the raw weights are evaluated too."""


class NormConfig(Section):
    """BatchNorm running statistics."""

    running_stats: Literal["per_microbatch", "per_step"] = "per_microbatch"
    """``per_microbatch``: PyTorch's update after every forward; ``per_step``: the step's micro-batch sums and
    counts are pooled and the running mean and variance updated once per optimizer step."""
    momentum: Annotated[float, PerStep(COMPLEMENT)] | None = Field(None, gt=0, lt=1)
    """BN momentum per optimizer step (PyTorch convention: running = (1 - m) running + m batch_stat);
    converted to each update with beta = alpha ** (1 / updates per step). Unset: the model's own."""
    half_life_images: float | None = Field(None, gt=0)
    """Alternatively, the number of training images after which an observation's weight halves."""
    sync: Literal["none", "bigbatch", "torch"] = "none"
    """Cross-device BatchNorm under torchrun: ``bigbatch`` (one packed fp32 all-reduce per layer and direction,
    CPU and GPU), ``torch`` (torch.nn.SyncBatchNorm, CUDA only), ``none`` (each device its own statistics)."""
    freeze_during_warmup: bool = False
    """BatchNorm layers in eval mode (normalising with the running statistics, which stay as they are) until the
    schedule's warmup ends, as MegDet's training loop (``if iter < warmup_iters: bn.eval()``); the scales and
    shifts still learn."""

    @model_validator(mode="after")
    def _one_momentum(self) -> NormConfig:
        if self.momentum is not None and self.half_life_images is not None:
            raise ValueError("norm.momentum: give norm.momentum or norm.half_life_images, not both")
        return self


_LENGTH = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*(steps?|epochs?|images?)?\s*$")


def parse_length(value: int | float | str) -> tuple[float, str]:
    """A length: a number of optimizer steps, or ``"<number> steps|epochs|images"``; -> (number, unit)."""
    if isinstance(value, bool):
        raise ValueError("expected a length such as 500, '500 steps', '5 epochs' or '1.2e6 images'")
    if isinstance(value, (int, float)):
        number, unit = float(value), "steps"
    else:
        match = _LENGTH.match(value)
        if match is None:
            raise ValueError(f"expected a length such as 500, '500 steps', '5 epochs' or '1.2e6 images', got {value!r}")
        number, unit = float(match.group(1)), (match.group(2) or "steps")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"expected a finite length >= 0, got {value!r}")
    return number, unit.rstrip("s") + "s"


def _check_length(value: int | float | str) -> int | float | str:
    parse_length(value)
    return value


def _check_interval(value: int | float | str) -> int | float | str:
    if parse_length(value)[0] <= 0:
        raise ValueError(f"expected a length > 0, got {value!r}")
    return value


_AnyFloat = Annotated[float, Field(allow_inf_nan=True)]  # refused by the length check, with a clearer message
Length = Annotated[int | _AnyFloat | str, AfterValidator(_check_length), InImages()]
"""A length in optimizer steps (a bare number) or ``"<number> steps|epochs|images"``."""
Interval = Annotated[int | _AnyFloat | str, AfterValidator(_check_interval), InImages()]
"""A length that must be more than zero (how often something happens, a decay period)."""


class WarmupPhase(Section):
    """One warmup phase; phases run in sequence from step 0, each a factor on the scheduled LR."""

    kind: Literal["linear", "constant", "power"]
    length: Length
    start_factor: float | None = Field(None, ge=0)
    """linear: the factor at the phase's first step (default: where the previous phase ended, 0 for the first)."""
    start_lr: float | None = Field(None, ge=0)
    """linear: an absolute LR to start from instead of ``start_factor``."""
    factor: float = Field(0.1, gt=0)
    """constant: the factor held for the whole phase (the Inception guide's cold epochs at ~10 %)."""
    power: float = Field(4.0, gt=0)
    """power: factor (t / length) ** power, Darknet's burn_in (t counted from 1, as Darknet does)."""


class DecayConfig(PartSection):
    """The decay after (and under) the warmup, a factor of the scaled LR at absolute step t."""

    parts = DECAYS

    kind: Annotated[str, _registered(DECAYS)] = "constant"
    every: Interval | None = None
    """step: gamma ** floor(t / every); exponential: gamma ** (t / every), floored when ``staircase``."""
    milestones: list[Length] = []
    """multistep: the steps at which the LR is multiplied by the next of ``scales`` (default ``gamma``)."""
    scales: list[float] | None = None
    gamma: float = Field(0.1, gt=0)
    staircase: bool = True
    power: float = Field(1.0, gt=0)
    """poly: (1 - progress) ** power."""
    center: Length | None = None
    """sigmoid: 1 / (1 + exp(gamma * (t - center))), Darknet's ``sig`` policy."""
    start: Length | None = None
    """cosine, poly: where the decay starts (default: the end of the warmup)."""
    end: Length | None = None
    """cosine, poly: where it reaches the floor (default: the end of the run)."""


class InceptionTPUConfig(Section):
    """The learning-rate code of the Inception v3 TPU guide (its flag names and values)."""

    decay_rate: float = Field(0.94, gt=0)
    decay_epochs: float = Field(3.0, gt=0)
    warmup: bool = True
    cold_epochs: float = Field(2.0, ge=0)
    warmup_epochs: float = Field(7.0, ge=0)
    num_train_images: int = Field(1_281_167, gt=0)
    """Epochs of that code are ImageNet's, whatever the data here."""
    final_ratio: float = Field(1e-4, ge=0)


class DarknetScheduleConfig(Section):
    """Darknet's ``get_current_rate`` (its ``[net]`` keys)."""

    policy: Literal["constant", "step", "steps", "exp", "poly", "sig"] = "constant"
    burn_in: StepCount = Field(0, ge=0)
    power: float = Field(4.0, gt=0)
    """Burn-in exponent, and the ``poly`` exponent (one key in Darknet)."""
    steps: list[StepCount] = []
    scales: list[float] = []
    step: Annotated[int, Steps(minimum=1)] = Field(1, gt=0)
    scale: float = Field(1.0, gt=0)
    gamma: Annotated[float, PerStep(on="policy", rules=(("exp", POWER), ("sig", SLOPE)))] = 1.0
    """exp: lr * gamma ** batch_num; sig: lr / (1 + exp(gamma * (batch_num - step)))."""
    max_batches: Annotated[int, Steps(minimum=1)] | None = Field(None, gt=0)
    """poly: the horizon (default: the run's steps)."""

    @model_validator(mode="after")
    def _paired(self) -> DarknetScheduleConfig:
        if len(self.steps) != len(self.scales):
            raise ValueError("schedule.darknet.scales: expected one scale per entry of schedule.darknet.steps")
        return self


class ScheduleConfig(PartSection):
    """lr(step) = scaled lr x warmup factor x max(decay factor, floor); or a seed's preset."""

    parts = SCHEDULES

    preset: Annotated[str, _registered(SCHEDULES)] = "none"
    warmup: list[WarmupPhase] = []
    decay: DecayConfig = Field(default_factory=DecayConfig)
    min_lr: float | None = Field(None, ge=0)
    """Floor of the decayed LR, absolute."""
    min_lr_ratio: float | None = Field(None, ge=0, le=1)
    """Floor of the decayed LR, as a fraction of the scaled LR."""
    inception_tpu: Annotated[InceptionTPUConfig, UsedWhen("preset", "inception_tpu")] = InceptionTPUConfig()
    darknet: Annotated[DarknetScheduleConfig, UsedWhen("preset", "darknet")] = DarknetScheduleConfig()

    @model_validator(mode="after")
    def _one_floor(self) -> ScheduleConfig:
        if self.min_lr is not None and self.min_lr_ratio is not None:
            raise ValueError("schedule.min_lr: give schedule.min_lr or schedule.min_lr_ratio, not both")
        return self


class PrecisionConfig(Section):
    """Mixed precision (autocast, fp32 master weights) and loss scaling; see ``recipe/precision.py``."""

    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    loss_scale: Literal["auto", "none", "dynamic", "update_ratio"] | float = "auto"
    """``auto`` (dynamic for fp16, none otherwise), ``none``, a number (static), ``dynamic``
    (torch.amp.GradScaler's rule) or ``update_ratio`` (the Darknet/Jetson seed's rule)."""
    init_scale: float = Field(2.0**16, gt=0)
    """The first scale (``update_ratio``: its base scale, 1.0 unless given)."""
    growth_factor: float = Field(2.0, gt=1)
    backoff_factor: float = Field(0.5, gt=0, lt=1)
    growth_interval: int = Field(2000, gt=0)
    """Clean steps in a row before the scale grows (dynamic)."""
    hysteresis: int = Field(1, gt=0)
    """Overflows tolerated before backing off (dynamic; 1 is GradScaler's rule)."""
    min_scale: float = Field(0.0, ge=0)
    max_scale: float = Field(2.0**24, gt=0)
    burn_in: int | None = Field(None, ge=0)
    """update_ratio: steps ruled by the update ratio (default: the Darknet schedule's burn_in, else 1000)."""
    double_every: int = Field(1000, gt=0)
    """update_ratio: after burn_in, double the scale after this many clean steps in a row."""
    max_skipped: int = Field(20, gt=0)
    """Stop the run (exit code 1) after this many non-finite steps in a row."""

    @model_validator(mode="before")
    @classmethod
    def _from_dtype(cls, value: Any) -> Any:
        return {"dtype": value} if isinstance(value, str) else value  # ``precision: bf16`` shorthand

    @field_validator("loss_scale")
    @classmethod
    def _positive_scale(cls, value: Any) -> Any:
        if isinstance(value, float) and value <= 0:
            raise ValueError(f"precision.loss_scale: expected a positive number, got {value}")
        return value


class DebugConfig(Section):
    """Fault injection for tests."""

    oom_at_step: int | None = Field(None, ge=0)
    """Raise an out-of-memory error at the second micro-batch of this optimizer step (0-based), once."""
    nonfinite_at_step: int | None = Field(None, ge=0)
    """Make the gradients of this optimizer step (0-based) NaN."""
    nonfinite_repeats: int = Field(1, gt=0)
    """How many attempts at that step get NaN gradients (each retry of a skipped step is an attempt)."""


class LossConfig(Section):
    """Classification loss: cross-entropy with label smoothing, plus an auxiliary head's
    (``tasks/classification.py``)."""

    label_smoothing: float = Field(0.0, ge=0, lt=1)
    """s: the target puts 1 - s on the true class and s / classes on each (Inception v3 TPU recipe: 0.1)."""
    aux_weight: float = Field(0.4, ge=0)
    """Weight of the auxiliary head's loss, for models built with one (``model.aux_logits``; Inception v3: 0.4)."""


class EvalConfig(Section):
    every: Interval = 50
    """Evaluate every this many optimizer steps (or epochs, images), and always at the end."""
    batch: int = Field(256, gt=0)
    """Images per evaluation forward pass (any size: every validation image is seen once)."""
    metric: str | None = None
    """Metric that selects ``best.pt``: classification ``top1`` (default), ``top5`` or ``loss``; detection ``mAP``
    (default, AP@[.5:.95]), ``mAP50``, ``mAP75``, ``mAP_small``, ``mAP_medium``, ``mAP_large``, ``AP/<class>``."""
    mode: Literal["max", "min"] | None = None
    """Whether a higher or a lower ``metric`` is better; unset: ``min`` for ``loss``, else ``max``."""

    @property
    def better(self) -> str:
        return self.mode or ("min" if self.metric == "loss" else "max")


class CheckpointConfig(Section):
    every: Interval = 50
    """Write ``checkpoints/last.pt`` every this many optimizer steps (or epochs, images), and always at the end."""


class LogConfig(Section):
    every: int = Field(10, gt=0)
    """Write a training record to ``metrics.jsonl`` every this many steps (and the first and last)."""
    tensorboard: bool = True
    timing: Literal["off", "events", "exact"] = "events"
    """Phase times of the logged steps in the training records (``t_data``, ``t_forward``, ``t_backward``, ``t_sync``,
    ``t_update``, ``t_other``, ``t_step``) and the table of their shares at the end (``engine/phases.py``): ``events``
    (the host clock; CUDA events on a GPU, read at the logged steps only), ``exact`` (the device synchronised at
    every phase), ``off``."""
    noise_scale: bool = True
    """Estimate the gradient noise scale (McCandlish et al. 2018) from the micro-batch gradients every step and put it
    in the training records as ``noise_scale`` (images); absent when a step has one micro-batch in all."""
    updates: bool = True
    """Every ``every`` steps, each parameter tensor's largest update and relative update size, in ``updates.csv``
    of the run directory, and the ten largest relative updates in the training record as ``top_updates``."""

    @field_validator("timing", mode="before")
    @classmethod
    def _off_is_off(cls, value: Any) -> Any:
        return "off" if value is False else value  # YAML reads an unquoted ``off`` as false


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*$", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_size(value: int | str) -> int:
    """Bytes from a number of bytes or a size such as ``"2GiB"``, ``"512 MiB"``, ``"1.5GB"``."""
    if isinstance(value, int) and not isinstance(value, bool):
        number, unit = float(value), "b"
    else:
        match = _SIZE.match(str(value))
        if match is None:
            raise ValueError(f"expected a size such as 2GiB, 512MiB or a number of bytes, got {value!r}")
        number, unit = float(match.group(1)), (match.group(2) or "b").lower()
    size = int(number * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"expected a size > 0, got {value!r}")
    return size


def _check_size(value: int | str) -> int | str:
    parse_size(value)
    return value


Size = Annotated[int | str, AfterValidator(_check_size)]


class MemoryConfig(Section):
    interval: float = Field(5.0, gt=0)
    """Seconds between two samples of ``memory.csv`` (the seed's tegrastats interval)."""
    limit: Size | None = None
    """On the CPU, a micro-batch starting while the process's RSS exceeds this counts as out of memory
    (``subdivisions`` is doubled and the step re-run). On CUDA the device's own out-of-memory error does."""


class RunConfig(Section):
    name: str = "run"
    """Recipe name; the default run directory is ``runs/<name>-<timestamp>``."""
    task: Annotated[str, _registered(TASKS)] = "classification"
    batch: int = Field(gt=0)
    """Global images per optimizer step, across all devices (Darknet's ``batch``)."""
    subdivisions: Annotated[int, Field(gt=0)] | Literal["auto"] = 1
    """Micro-batches per device per optimizer step (Darknet's ``subdivisions``); ``auto``: the smallest number
    whose micro-batch fits in memory, measured at the start (``bigbatch plan``)."""
    steps: Annotated[int, Steps(minimum=1, up=True)] | None = Field(None, gt=0)
    """Optimizer steps. Give either ``steps`` or ``epochs``."""
    epochs: float | None = Field(None, gt=0)
    """Passes over the training set, turned into steps = ceil(epochs * images / batch)."""
    seed: int = Field(0, ge=0)
    """Seeds every random generator (numpy's legacy global generator takes ``seed mod 2^32``)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    optim: OptimConfig = Field(default_factory=OptimConfig)
    schedule: ScheduleConfig = Field(default_factory=ScheduleConfig)
    clip: ClipConfig = ClipConfig()
    ema: EMAConfig = EMAConfig()
    norm: NormConfig = NormConfig()
    precision: PrecisionConfig = PrecisionConfig()
    memory: MemoryConfig = MemoryConfig()
    debug: DebugConfig = DebugConfig()
    loss: LossConfig = LossConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _input_large_enough(self) -> RunConfig:
        smallest = self.model.part().info.get("min_input_size")
        if callable(smallest):  # depends on the model's own keys (e.g. an auxiliary head)
            smallest = smallest(self.model)
        if smallest is not None and self.data.size < smallest:
            with_aux = " with model.aux_logits" if getattr(self.model, "aux_logits", False) else ""
            raise ValueError(f"data.size: {self.model.name}{with_aux} needs images of at least {smallest} px, "
                             f"got {self.data.size}")
        return self

    @model_validator(mode="after")
    def _task_data_and_model_agree(self) -> RunConfig:
        task = TASKS.get(self.task).info
        if self.data.part().info.get("task") != self.task:
            expected = _one_of(DATASETS.names(task=self.task))
            raise ValueError(f"data.name: {self.data.name!r} is not a {self.task} dataset; expected {expected}")
        model = self.model.part().info
        if model.get("task") != self.task:
            raise ValueError(f"model.name: {self.model.name!r} is not a {task['model_kind']} (task: {self.task})")
        if self.model.weights is not None and not model.get("reads_weights"):
            raise ValueError("model.weights: local weights are read for detectors only")
        metrics, prefixes = task["metrics"], task.get("metric_prefixes", ())
        if self.eval.metric is None:
            self.eval.metric = metrics[0]
        elif self.eval.metric not in metrics and not self.eval.metric.startswith(prefixes):
            raise ValueError(f"eval.metric: {self.eval.metric!r} is not a {self.task} metric; expected one of "
                             f"{', '.join([*metrics, *(f'{p}<class>' for p in prefixes)])}")
        return self

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> RunConfig:
        if self.steps is None and self.epochs is None:
            raise ValueError("steps: missing; give steps (optimizer steps) or epochs")
        if self.steps is not None and self.epochs is not None:
            raise ValueError("steps: give either steps or epochs, not both")
        return self


def _one_of(names: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join(filter(None, [", ".join(names[:-1]), names[-1]])) if names else "none registered"


# ----------------------------------------------------------------------------- loading


def builtin_recipes() -> list[str]:
    """The recipes in ``bigbatch/configs/``: YAML files, and the Darknet ``.cfg`` files written for bigbatch."""
    return sorted(p.stem for p in [*RECIPES_DIR.glob("*.yaml"), *RECIPES_DIR.glob("*.cfg")])


MAX_YAML_NODES = 100_000
"""The most nodes a YAML document may hold once its aliases are expanded, each alias counted as the nodes of what it
names. The largest recipe holds a few hundred. PyYAML shares an aliased node rather than copying it, but bigbatch
then copies, validates and walks the values (``apply_overrides``, pydantic, ``flatten``, the report): a "billion
laughs" document (1 KB: nine levels, each a list of ten aliases of the one above) would become 10^9 values
there. Refused past this, before anything is built."""


class YAMLTooLarge(yaml.composer.ComposerError):
    """A document past :data:`MAX_YAML_NODES` once its aliases are expanded, or an alias inside what it names (a
    cycle, which never ends)."""


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, whose constructors' own errors on a malformed value (``!!int x``, the date
    ``2020-13-45``: a ValueError, IndexError, ...) become a ``ConstructorError`` marked with its line, and which
    counts the nodes as they are composed: each alias adds the (expanded) nodes of what it names; past
    :data:`MAX_YAML_NODES`, or an alias to a node that holds it, is a :class:`YAMLTooLarge`."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.nodes = 0
        self._sizes: dict[int, int] = {}  # id of an anchored node -> its nodes, aliases expanded

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        before = self.nodes
        node = super().compose_node(parent, index)
        if isinstance(event, yaml.AliasEvent):
            size = self._sizes.get(id(node))
            if size is None:  # still being composed: the alias is inside what it names
                raise YAMLTooLarge(None, None, f"the alias *{event.anchor} is inside what it names (a cycle); "
                                   "refused", event.start_mark)
            self.nodes += size
        else:
            self.nodes += 1
            if event.anchor is not None:
                self._sizes[id(node)] = self.nodes - before
        if self.nodes > MAX_YAML_NODES:
            raise YAMLTooLarge(None, None, f"more than {MAX_YAML_NODES:,} YAML nodes once aliases are expanded "
                               '(an alias bomb, "billion laughs"?); refused', event.start_mark)
        return node

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, TypeError, LookupError, AttributeError):
            value = repr(node.value) if isinstance(node, yaml.ScalarNode) else "the value"
            problem = f"{value} is not a valid {node.tag.rpartition(':')[2]}"
            raise yaml.constructor.ConstructorError(None, None, problem, node.start_mark) from None


def load_yaml(text: str) -> Any:
    """``text`` read by bigbatch's bounded safe loader (:class:`_Loader`): what every YAML reader of bigbatch
    uses. Raises ``yaml.YAMLError`` (:class:`YAMLTooLarge` past :data:`MAX_YAML_NODES`) and ``RecursionError``."""
    return yaml.load(text, Loader=_Loader)


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; every mistake (not UTF-8, syntax, a malformed value) names the file and line."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"config: cannot read {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise UserError(f"config: {path}:{line}: not UTF-8 text (byte {raw[e.start]:#04x})") from None
    try:
        data = load_yaml(text)
    except YAMLTooLarge as e:
        raise UserError(f"config: {path}:{e.problem_mark.line + 1}: {e.problem}") from None
    except yaml.MarkedYAMLError as e:
        mark, context = e.problem_mark, e.context_mark
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = e.problem
        if e.context:  # what was being read: "while scanning a quoted scalar (line 3): ..."
            line = context.line if context is not None else None
            on = f" (line {line + 1})" if line is not None and line != getattr(mark, "line", None) else ""
            problem = f"{e.context}{on}: {problem}"
        raise UserError(f"config: {where}: invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as e:  # a control character, which YAML does not allow
        line = text.count("\n", 0, e.position) + 1
        raise UserError(f"config: {path}:{line}: invalid YAML: character U+{e.character:04X} is not allowed") from None
    except RecursionError:
        raise UserError(f"config: {path}: invalid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"config: {path}: expected a mapping of keys at the top level")
    return data


def resolve_config_source(source: str) -> tuple[Path, str]:
    """A config argument is a YAML file, a Darknet ``.cfg`` or a built-in recipe name; -> (path, recipe name)."""
    path = Path(source)
    if path.is_file():
        return path, path.stem
    for suffix in (".yaml", ".cfg"):
        builtin = RECIPES_DIR / f"{source}{suffix}"
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
        value = load_yaml(raw) if raw.strip() else None
    except YAMLTooLarge as e:
        raise UserError(f"--set: {key}: {e.problem}") from None
    except (yaml.YAMLError, RecursionError):  # not YAML: the text itself (``name=2020-13-45``, ``a=[``)
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
                raise UserError(f"{_dotted(keys[: i + 1])}: is a value, not a section; cannot set {_dotted(keys)}")
            node = child
        node[keys[-1]] = value
        if len(keys) == 1 and keys[0] in _EXCLUSIVE:
            data.pop(_EXCLUSIVE[keys[0]], None)
    return data


_UNION_MEMBERS = {"float", "int", "str", "bool", "list", "dict", "tuple", "none"}


def _key(loc: tuple[Any, ...], kind: str = "") -> tuple[Any, ...]:
    """The config key of an error location, without pydantic's union-member tags (``literal[...]``, ``float``).
    The last part of an unknown key (``extra_forbidden``) is the user's own, kept whatever it looks like."""
    kept = loc[-1:] if kind == "extra_forbidden" else ()
    loc = loc[: len(loc) - len(kept)]
    return tuple(p for p in loc if not (isinstance(p, str) and ("[" in p or "-" in p or p in _UNION_MEMBERS))) + kept


def _dotted(parts: tuple[Any, ...] | list[Any]) -> str:
    """A dotted key for a one-line message; quoted when it is empty or holds a line break, a control character, a
    colon (``error: KEY: ...`` is read up to the first colon) or surrounding space."""
    key = ".".join(str(p) for p in parts)
    return key if key and key.isprintable() and key == key.strip() and ":" not in key else repr(key)


def _describe(error: dict[str, Any], section: type[Section] | None) -> tuple[str, str]:
    """(the dotted key, what is wrong with it) for one pydantic error."""
    kind = error["type"]
    loc = _dotted(_key(error["loc"], kind))
    if kind == "extra_forbidden":
        expected = f" (expected one of: {', '.join(section.keys())})" if section is not None else ""
        return loc, f"unknown key{expected}"
    if kind == "missing":
        return loc, "missing (required)"
    message = error["msg"]
    if kind == "value_error":  # our own validators start with the key they are about
        message = message.removeprefix("Value error, ")
        key, sep, rest = message.partition(": ")
        return (key, rest) if sep and " " not in key else (loc, message)
    return loc, f"{message[0].lower() + message[1:]}, got {error['input']!r}"


def _section_in(annotation: Any) -> type[Section] | None:
    """The config class an annotation holds: itself, ``X | None``, ``list[X]`` or ``Annotated[X, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, Section):
        return annotation
    return next((cls for cls in map(_section_in, get_args(annotation)) if cls is not None), None)


def _section_of(loc: tuple[Any, ...]) -> type[Section] | None:
    """The config class that holds the parent of ``loc`` (for listing the keys it accepts)."""
    cls: type[Section] | None = RunConfig
    for part in loc[:-1]:
        if isinstance(part, int):  # an item of a list of sections (schedule.warmup.0)
            continue
        annotation = cls.keys().get(str(part))
        cls = _section_in(annotation) if annotation is not None else None
        if cls is None:
            return None
    return cls


INT64_LIMIT = 2**63
"""Every whole number in a config fits a signed 64-bit integer (torch, numpy and the data order count in them)."""


def _check_whole_numbers(value: Any, key: str = "") -> None:
    """A whole number beyond 64 bits (``10**400``) is refused naming its key, before any arithmetic on it."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_whole_numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_whole_numbers(v, f"{key}.{i}")
    elif isinstance(value, int) and not isinstance(value, bool) and not -INT64_LIMIT <= value < INT64_LIMIT:
        shown = f"{value:.3g}" if abs(value) < 10**300 else f"a {len(str(abs(value)))}-digit number"
        raise UserError(f"{_dotted(key.split('.'))}: {shown} does not fit a 64-bit integer (expected a whole number "
                        f"between -2^63 and 2^63 - 1)")


def validate_config(data: dict[str, Any]) -> RunConfig:
    _check_whole_numbers(data)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        by_key: dict[str, list[str]] = {}
        for err in e.errors():
            key, message = _describe(err, _section_of(_key(err["loc"], err["type"])))
            by_key.setdefault(key, []).append(message)
        lines = [f"{key}: {' or '.join(messages)}" for key, messages in by_key.items()]
        raise UserError("; ".join(lines)) from None


def load_config(source: str, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Load a YAML file, a file of a registered format (Darknet ``.cfg``) or a built-in recipe, apply ``--set``
    overrides, validate."""
    path, recipe = resolve_config_source(source)
    reader = CONFIG_FORMATS.find(path.suffix)
    data = reader.obj(path) if reader is not None else read_yaml(path)
    data.setdefault("name", recipe)
    return validate_config(apply_overrides(data, list(overrides)))


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config dict as ``{"a.b.c": value}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def config_to_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
