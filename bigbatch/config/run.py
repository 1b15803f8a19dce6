"""The whole run config (:class:`RunConfig`): the top-level keys, a section each, and the checks across sections
(task, data and model agree; the smallest input; the metric; steps or epochs)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from bigbatch.config.adaptive import AdaptiveBatch, fold_adaptive, unfold_adaptive
from bigbatch.config.data import DataConfig
from bigbatch.config.model import ModelConfig
from bigbatch.config.monitoring import CheckpointConfig, DebugConfig, EvalConfig, LogConfig, MemoryConfig
from bigbatch.config.optim import ClipConfig, OptimConfig
from bigbatch.config.schedule import ScheduleConfig
from bigbatch.config.section import Section, one_of, registered
from bigbatch.config.training import EMAConfig, LossConfig, NormConfig, PrecisionConfig
from bigbatch.config.values import RunName, Steps
from bigbatch.registry import DATASETS, TASKS


class RunConfig(Section):
    name: RunName = "run"
    """Recipe name; the default run directory is ``runs/<name>-<timestamp>``: a plain folder name (no ``/`` or ``\\``,
    not ``.`` or ``..``, at most 200 bytes)."""
    task: Annotated[str, registered(TASKS)] = "classification"
    batch: int = Field(gt=0)
    """Global images per optimizer step, across all devices (Darknet's ``batch``); an adaptive run's first batch
    (``batch: {mode: adaptive, ...}`` is read into ``adaptive``)."""
    adaptive: AdaptiveBatch | None = None
    """AdaScale's base and largest batch (``config/adaptive.py``), written as ``batch: {mode: adaptive, ...}``."""
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
    _filled_in: dict[str, str] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _adaptive_batch(cls, data: Any) -> Any:
        return unfold_adaptive(data)

    @classmethod
    def keys(cls, load: bool = True) -> dict[str, Any]:
        """The keys a config writes (``adaptive`` is written inside ``batch``)."""
        return {key: value for key, value in super().keys(load).items() if key != "adaptive"}

    def model_dump(self, **options: Any) -> dict[str, Any]:
        """The dump, an adaptive batch folded back into ``batch: {mode: adaptive, ...}``."""
        return fold_adaptive(super().model_dump(**options))

    def filled_in(self) -> dict[str, str]:
        """The keys the config left unset and validation filled in from other keys -> where the value came from
        (``{"eval.metric": "the task's default"}``); ``bigbatch show`` prints them."""
        return dict(self._filled_in)

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
            expected = one_of(DATASETS.names(task=self.task))
            raise ValueError(f"data.name: {self.data.name!r} is not a {self.task} dataset; expected {expected}")
        model = self.model.part().info
        if model.get("task") != self.task:
            raise ValueError(f"model.name: {self.model.name!r} is not a {task['model_kind']} (task: {self.task})")
        metrics, prefixes = task["metrics"], task.get("metric_prefixes", ())
        if self.eval.metric is None:
            self.eval.metric = metrics[0]
            self._filled_in["eval.metric"] = f"the {self.task} task's default"
        elif self.eval.metric not in metrics and not self.eval.metric.startswith(prefixes):
            raise ValueError(f"eval.metric: {self.eval.metric!r} is not a {self.task} metric; expected one of "
                             f"{', '.join([*metrics, *(f'{p}<class>' for p in prefixes)])}")
        return self

    @model_validator(mode="after")
    def _one_batch_schedule(self) -> RunConfig:
        if self.adaptive is not None and self.schedule.batch:
            raise ValueError("schedule.batch: an adaptive batch (batch.mode: adaptive) chooses the batch itself; "
                             "give schedule.batch or batch.mode: adaptive, not both")
        return self

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> RunConfig:
        """At most one length; none is a config ``show`` prints (a Darknet ``.cfg`` without ``max_batches``) and a
        run refuses (``batching.require_length``)."""
        if self.steps is not None and self.epochs is not None:
            raise ValueError("steps: give either steps or epochs, not both")
        return self

