"""Where a run's weights start: ``model.weights``, matched to the model by tensor name.

``model.weights`` takes, for every model family:

- a bigbatch run directory (its ``checkpoints/last.pt``) or checkpoint, of any task and class count:
  ``model.weights_from`` chooses its EMA weights (``ema``, the default: where the run kept an EMA) or its raw ones;
- a state dict (``.pth``, ``.pt``, ``.bin``: read with ``torch.load(weights_only=True)``, which never unpickles code;
  ``.safetensors``: read by safetensors), bare or under one of the keys its writers use (``state_dict``, ``model``,
  ``module``: timm's, torchvision's, detectron2's and MMEngine's files); of a file that holds EMA weights beside them
  (timm's ``state_dict_ema``, ``model_ema``), ``model.weights_from`` chooses as for a run;
- a Darknet ``.weights`` or ``.conv.N`` file, for a Darknet network: a flat stream of values matched by position,
  read by the family's own loader (``registry.ModelInfo.start_weights``).

A tensor loads when the model has one of the same name and shape. Names are matched after the wrappers that training
and saving add are taken off their start (``module.`` of DDP, ``_orig_mod.`` of ``torch.compile``), and after the one
prefix, of any depth, that makes the most names agree with tensors of the same shape (a bare torchvision detector's
keys against bigbatch's ``detector.*``, an ImageNet ``resnet50``'s against a Faster R-CNN's
``detector.backbone.body.*``, a Darknet network's against ``network.*``: :func:`matched_names`). A tensor of another
shape (a head for another class count) is refused by ``model.mismatched: error`` (the default), one line naming the
first ones with both shapes, or keeps the new layer's initialisation with ``reinit``. The model's tensors the file
does not hold keep their initialisation too ("missing"); a file that matches none of them is refused.

The outcome is printed ("loaded K of M tensors; reinitialised: ...; missing: ...") and recorded as the event
``weights`` in ``metrics.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from bigbatch.errors import UserError

WRAPPERS = ("module.", "_orig_mod.")
"""Prefixes training adds to every name: DDP's ``module.``, ``torch.compile``'s ``_orig_mod.``."""
CONTAINER_KEYS = ("state_dict", "model", "module", "state_dict_ema", "model_ema")
"""Keys under which a saved file holds its state dict (timm's checkpoints, detectron2's ``model``, MMEngine's
``state_dict``), looked for in this order when the file is not a state dict itself (``model.weights_from`` chooses
between the raw and the EMA ones: :func:`_chosen_entry`)."""
EMA_KEYS = ("state_dict_ema", "model_ema")
"""The keys of :data:`CONTAINER_KEYS` that hold EMA weights (timm's ``train.py``; its older checkpoints')."""
MAX_LISTED = 6
"""Names listed in a message or the printed summary before "and N more"."""


@dataclass
class Started:
    """What ``model.weights`` gave the model: the names loaded, reinitialised (another shape), missing from the file,
    and the file's tensors the model has no place for."""

    path: str
    source: str
    """What was read: ``"EMA weights, checkpoint of step N"``, ``"a state dict"``, ``"Darknet weights, by
    position"``..."""
    total: int
    loaded: list[str] = field(default_factory=list)
    reinitialised: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unused: list[str] = field(default_factory=list)
    note: str = ""
    """A line of the family's own (a Darknet file of which only the first layers loaded)."""

    def line(self) -> str:
        text = (f"model.weights: loaded {len(self.loaded)} of {self.total} tensors from {self.path} ({self.source}); "
                f"reinitialised: {listed(self.reinitialised)}; missing: {listed(self.missing)}")
        if self.unused:
            text += f"; not used, of the file: {listed(self.unused)}"
        return text + (f"\n{self.note}" if self.note else "")

    def event(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "loaded": len(self.loaded), "total": self.total,
                "reinitialised": self.reinitialised, "missing": self.missing, "unused": len(self.unused)}


def listed(names: list[str]) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def start_weights(model: nn.Module, cfg: Any) -> Started | None:
    """Load ``cfg.model.weights`` into ``model`` (see the module docstring); None where no file is named or the model
    is on the meta device (``show``'s and the planner's count)."""
    from bigbatch.registry import MODELS

    if cfg.model.weights is None or any(p.is_meta for p in model.parameters()):
        return None
    own = MODELS.get(cfg.model.name).info.get("start_weights")
    if own is not None:
        started = own(model, cfg.model)
        if started is not None:
            return started
    return load_weights_file(model, cfg.model.weights, cfg.model.weights_from, cfg.model.mismatched)


def load_weights_file(model: nn.Module, path: str | Path, weights_from: str = "ema", mismatched: str = "error"
                      ) -> Started:
    """A run directory's, checkpoint's or state dict's tensors loaded into ``model`` by name (the module docstring)."""
    state, source = read_state(Path(path), weights_from)
    return load_by_name(model, state, str(path), source, mismatched)


def read_state(path: Path, weights_from: str = "ema") -> tuple[dict[str, Tensor], str]:
    """The state dict a ``model.weights`` file or run directory holds, and what it is (see the module docstring)."""
    from bigbatch.engine import checkpoint
    from bigbatch.engine.run_dir import last_checkpoint, run_checkpoint
    from bigbatch.floor.files import load_tensors

    if path.is_dir():
        run_checkpoint(path, "model.weights")  # a run's checkpoint is read only from inside it
        found = last_checkpoint(path)
        if not found.is_file():
            raise UserError(f"model.weights: {path} is a folder without checkpoints/last.pt: not a bigbatch run "
                            "directory (expected a run, a checkpoint or a weights file)")
        path = found
    elif not path.exists():
        raise UserError(f"model.weights: {path} does not exist (expected a run directory, a checkpoint or a weights "
                        "file)")
    elif not path.is_file():
        raise UserError(f"model.weights: {path} is not a regular file")
    if path.suffix == ".safetensors":
        return _safetensors(path), "a safetensors state dict"
    state = load_tensors(path, "model.weights")
    if isinstance(state, dict) and "format" in state and isinstance(state.get("model"), dict):  # bigbatch's own
        state = checkpoint.load(path, ("step", "model"))
        ema = state.get("ema")
        if weights_from == "ema" and isinstance(ema, dict) and isinstance(ema.get("module"), dict):
            return ema["module"], f"EMA weights, checkpoint of step {state['step']}"
        kept_none = "; the run kept no EMA" if weights_from == "ema" else ""
        return state["model"], f"raw weights, checkpoint of step {state['step']}{kept_none}"
    if not isinstance(state, dict):
        raise UserError(f"model.weights: {path} holds no state dict (a dict of tensors), but a {type(state).__name__}")
    if not _tensors_only(state):
        held = [key for key in CONTAINER_KEYS if isinstance(state.get(key), dict) and _tensors_only(state[key])]
        if not held:
            raise UserError(f"model.weights: {path} holds no state dict (a dict of tensors, or one under "
                            f"{', '.join(CONTAINER_KEYS)})")
        return _chosen_entry(state, held, weights_from)
    return state, "a state dict"


def _chosen_entry(state: dict, held: list[str], weights_from: str) -> tuple[dict[str, Tensor], str]:
    """The state dict ``model.weights_from`` chooses among a saved file's entries (``held``): ``ema``, the EMA's
    (:data:`EMA_KEYS`) where the file has one, as timm's ``load_checkpoint(use_ema=True)`` prefers it, else the raw;
    ``raw``, the raw (``state_dict``, ``model``, ``module``), else the EMA's."""
    ema = [key for key in held if key in EMA_KEYS]
    raw = [key for key in held if key not in EMA_KEYS]
    if weights_from == "ema":
        key = (ema or raw)[0]
        note = "" if ema else "; the file holds no EMA"
    else:
        key = (raw or ema)[0]
        note = "" if raw else "; the file holds no raw weights"
    kind = "the EMA state dict" if key in EMA_KEYS else ("the raw state dict" if ema else "the state dict")
    return state[key], f"{kind} under {key!r}{note}"


def _tensors_only(state: dict) -> bool:
    return bool(state) and all(isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items())


def _safetensors(path: Path) -> dict[str, Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(path)
    except Exception as e:  # safetensors raises its own error types for a truncated or foreign file
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise UserError(f"model.weights: cannot read {path} as safetensors ({type(e).__name__}: {first})") from None


def unwrapped(name: str) -> str:
    """``name`` without the prefixes training adds (:data:`WRAPPERS`) at its start, as often and in whatever order
    they stand there (``module._orig_mod.``); the same words inside a name are the model's own (timm's
    ``se_module.``, ``context_module.``)."""
    while True:
        prefix = next((prefix for prefix in WRAPPERS if name.startswith(prefix)), None)
        if prefix is None:
            return name
        name = name[len(prefix):]


def matched_names(theirs: list[str] | dict[str, Tensor], ours: list[str] | dict[str, Tensor]) -> dict[str, str]:
    """{our name: their name}: names equal after :func:`unwrapped`, and after the one prefix, added to theirs or taken
    off them, under which most agree.

    The prefixes tried are every one that makes a name agree: a leading run of dotted parts of one of our names that
    one of theirs completes (``detector.backbone.body.`` for a torchvision ``resnet50`` file in a Faster R-CNN), or of
    one of theirs whose rest is one of our names (``network.`` of a Darknet detector's checkpoint in a bare network),
    and the empty one. Given tensors (dicts), a prefix scores the names it maps onto a tensor of the same shape, then
    the names it maps (a head of another class count is still matched, to be refused or reinitialised); without,
    the names it maps. The best score wins; of equal ones the empty prefix, then the shorter, then one added before
    one taken off, then the first in sorted order, so the choice never depends on the order of either list."""
    plain = {unwrapped(name): name for name in theirs}
    ours_set = set(ours)
    shapes = isinstance(theirs, dict) and isinstance(ours, dict)

    def same_shape(our: str, their: str) -> bool:
        return not shapes or tuple(theirs[their].shape) == tuple(ours[our].shape)

    completes: dict[str, list[str]] = {}  # the prefix added: our name = prefix + their (unwrapped) name
    for name in ours_set:
        for i, char in enumerate(name):
            if char == "." and name[i + 1:] in plain:
                completes.setdefault(name[:i + 1], []).append(name[i + 1:])
    taken_off: dict[str, list[str]] = {}  # the prefix taken off: their (unwrapped) name = prefix + our name
    for key in plain:
        for i, char in enumerate(key):
            if char == "." and key[i + 1:] in ours_set:
                taken_off.setdefault(key[:i + 1], []).append(key)
    candidates = [(0, "", {key: plain[key] for key in plain if key in ours_set})]
    candidates += [(1, prefix, {prefix + key: plain[key] for key in keys}) for prefix, keys in completes.items()]
    candidates += [(2, prefix, {key[len(prefix):]: plain[key] for key in keys}) for prefix, keys in taken_off.items()]

    def rank(candidate: tuple[int, str, dict[str, str]]) -> tuple:
        way, prefix, mapping = candidate
        same = sum(same_shape(our, their) for our, their in mapping.items())
        return -same, -len(mapping), len(prefix), way, prefix

    return min(candidates, key=rank)[2]


def load_by_name(model: nn.Module, state: dict[str, Tensor], path: str, source: str, mismatched: str) -> Started:
    """Load the tensors of ``state`` into ``model`` by name (see the module docstring); -> what loaded."""
    ours = model.state_dict()
    mapping = matched_names(state, ours)
    if not mapping:
        theirs = listed(sorted(state)[:MAX_LISTED])
        raise UserError(f"model.weights: {path} ({source}) matches none of the model's {len(ours)} tensors by name "
                        f"(its first: {theirs}; the model's first: {listed(list(ours)[:MAX_LISTED])})")
    started = Started(path, source, len(ours))
    other_shapes = [(name, tuple(state[mapping[name]].shape), tuple(ours[name].shape))
                    for name in ours if name in mapping and state[mapping[name]].shape != ours[name].shape]
    if other_shapes and mismatched == "error":
        shown = "; ".join(f"{name} {list(a)} in the file, {list(b)} here" for name, a, b in other_shapes[:3])
        more = f" and {len(other_shapes) - 3} more" if len(other_shapes) > 3 else ""
        raise UserError(f"model.mismatched: {path} ({source}) has tensors of other shapes: {shown}{more}; "
                        "set model.mismatched=reinit to keep these layers' new initialisation")
    skipped = {name for name, _, _ in other_shapes}
    merged = dict(ours)
    for name in ours:
        if name in mapping and name not in skipped:
            merged[name] = state[mapping[name]].to(dtype=ours[name].dtype)
            started.loaded.append(name)
    started.reinitialised = [name for name, _, _ in other_shapes]
    started.missing = [name for name in ours if name not in mapping]
    used = set(mapping.values())
    started.unused = [name for name in state if name not in used]
    if not started.loaded:
        raise UserError(f"model.weights: {path} ({source}) loads no tensor of the model: every one it names has "
                        "another shape")
    with torch.no_grad():
        model.load_state_dict(merged)
    return started
