"""``model.name: darknet``: the network of a Darknet ``.cfg`` (``model.cfg``), as a bigbatch detector.

The network is built by ``network.py`` at the run's input size (``data.size``), for the dataset's classes: when
they differ from the cfg's, each ``[yolo]`` layer takes the dataset's number and the convolution before it
``len(mask) * (classes + 5)`` filters, as a Darknet user edits a cfg for a new dataset. ``model.weights`` starts it
from a Darknet ``.weights`` file (:func:`load_darknet_weights`) or from a state dict or bigbatch checkpoint of the
same network. The detector (training losses, decoding) is ``detector.py``. ``bigbatch show`` prints the network's
layer table (:func:`describe_darknet`, the entry's ``describe``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from bigbatch.config.model import MODEL_KEYS
from bigbatch.errors import UserError
from bigbatch.registry import MODELS

if TYPE_CHECKING:
    from bigbatch.config import ModelConfig, RunConfig
    from bigbatch.darknet import DarknetCfg, DarknetNetwork

NETWORK_PREFIX = "network."
DARKNET_PARTIAL = re.compile(r"\.conv\.\d+$")
"""A backbone file ``darknet partial`` writes (``darknet53.conv.74``): Darknet weights, whatever the suffix."""
"""Where the network's keys sit in the detector's state dict."""


def darknet_network(cfg_path: str | None, classes: int | None = None, size: int | None = None,
                    key: str = "model.cfg", dialect: str = "alexeyab") -> DarknetNetwork:
    """The network of the ``.cfg`` at ``cfg_path`` for ``classes`` classes (default: the cfg's) and a ``size`` x
    ``size`` input (default: its ``[net]``), read as the Darknet of ``dialect`` reads it. Outside torch's ``meta``
    device it is first built there and refused (``UserError`` naming ``key``) when its weights cannot fit this
    machine's memory, whichever command builds it."""
    from bigbatch.darknet import load_network

    if not cfg_path:
        raise UserError(f"{key}: missing; model.name darknet builds the network of a Darknet .cfg file "
                        "(model.cfg: path/to/net.cfg)")
    path = find_cfg(cfg_path, key)
    if torch.get_default_device().type != "meta":
        from bigbatch.telemetry.capacity import check_built_fits

        check_built_fits(lambda: load_network(path, size, size, classes, dialect), key,
                         f"the network of {cfg_path}")
    network = load_network(path, size, size, classes, dialect)
    if torch.get_default_device().type != "meta":
        warn_leniencies(network.cfg)
    return network


def warn_leniencies(cfg: DarknetCfg) -> None:
    """Print, once per process (rank 0 under torchrun), each leniency taken in reading ``cfg`` (a key given
    twice, an unknown key, a comment after a value), as ``warning: ...`` on stderr."""
    import sys

    if not cfg.warnings or (torch.distributed.is_initialized() and torch.distributed.get_rank() != 0):
        return
    if cfg.path in _WARNED:
        return
    _WARNED.add(cfg.path)
    for line in cfg.warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)


_WARNED: set[Path] = set()


def find_cfg(cfg_path: str, key: str = "model.cfg") -> Path:
    """``model.cfg`` as given (from the current folder), or else a ``.cfg`` of that name beside the built-in recipes
    (``bigbatch/configs/``, where bigbatch's own cfgs live). A name on something that is not a regular file of at
    most ``text.MAX_CFG_BYTES`` (a FIFO, a link to ``/dev/zero``, a huge file) is refused in one line naming ``key``,
    before any of it is read."""
    from bigbatch.config import RECIPES_DIR
    from bigbatch.darknet.text import MAX_CFG_BYTES
    from bigbatch.floor.user_files import open_regular

    path = Path(cfg_path)
    if not path.exists() and not path.is_absolute() and (RECIPES_DIR / path).is_file():
        path = RECIPES_DIR / path
    if not path.exists():
        raise UserError(f"{key}: {cfg_path} does not exist (expected a Darknet .cfg file)")
    try:
        with open_regular(path, MAX_CFG_BYTES, "a .cfg"):
            pass
    except OSError as e:
        if e.errno is None:  # open_regular's refusals: not a regular file, past the bound
            raise UserError(f"{key}: {e}; not read") from None
        raise UserError(f"{key}: cannot read {path}: {e.strerror}") from None
    return path


def network_state(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A network's own state dict out of a detector's (``network.*`` keys), a bigbatch checkpoint's ``model``, or
    a bare network state dict."""
    if isinstance(state.get("model"), dict):
        state = state["model"]
    if any(key.startswith(NETWORK_PREFIX) for key in state):
        state = {key[len(NETWORK_PREFIX):]: value for key, value in state.items() if key.startswith(NETWORK_PREFIX)}
    return state


def load_darknet_weights(network: DarknetNetwork, path: str | Path, key: str = "model.weights") -> int:
    """Load ``path`` into ``network``: a Darknet ``.weights`` file, or a state dict / bigbatch checkpoint holding
    this network's weights; -> images seen (the ``.weights`` header's ``seen``; 0 for a state dict). A missing or
    non-matching file is one ``UserError`` naming ``key``."""
    from bigbatch.darknet.weights import named_weight_tensors, read_weights_upto
    from bigbatch.floor.files import load_tensors, mismatch_detail

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{key}: {path} does not exist (expected a Darknet .weights file, a state dict or a "
                        "bigbatch checkpoint)")
    if path.suffix == ".weights" or DARKNET_PARTIAL.search(path.name):
        seen, layers = read_weights_upto(network, path)
        if layers < len(network.layers) and torch.get_default_device().type != "meta":
            import sys

            with_weights = {index for index, _, _ in named_weight_tensors(network)}
            loaded = len([i for i in with_weights if i < layers])
            print(f"{key}: {path} holds the first {layers} of {len(network.layers)} layers: loaded the weights of "
                  f"{loaded} of {len(with_weights)} layers with weights (as Darknet's load_weights_upto)",
                  file=sys.stderr, flush=True)
        return seen
    state = load_tensors(path, key)
    if not isinstance(state, dict):
        raise UserError(f"{key}: {path} holds no state dict (a dict of tensors)")
    state = network_state(state)
    try:
        network.load_state_dict(state)
    except RuntimeError as e:
        raise UserError(f"{key}: {path} does not fit the network of {network.cfg.path} ({mismatch_detail(e)})"
                        ) from None
    return 0


def without_batch_counters(names: Any) -> Any:
    """``names`` (a list, or a state dict's keys and values) without BatchNorm's ``num_batches_tracked``: a Darknet
    file never holds one (Darknet keeps no such counter), so none is loaded from it, counted or listed as missing."""
    if isinstance(names, dict):
        return {name: value for name, value in names.items() if not name.endswith("num_batches_tracked")}
    return [name for name in names if not name.endswith("num_batches_tracked")]


def darknet_start(model: nn.Module, cfg: ModelConfig) -> Any:
    """``MODELS``' ``start_weights`` for the Darknet families: ``model.weights`` when it is a Darknet ``.weights`` or
    ``.conv.N`` file (else None: a state dict or a run, matched by name as for every family).

    Its values are a flat stream, matched by position: one layer of another size shifts every later one. The file of
    this network (or of its first N layers) loads whole. Another network's, or this one's for another class count:
    with ``model.weights_cfg``, the cfg it was written for, it is read into that network and matched by name
    (``model.mismatched`` deciding for the tensors of other shapes); without it, ``model.mismatched: reinit`` loads
    the layers before the first that depends on the classes, as a ``.conv.N`` backbone, and says so; ``error``
    refuses it in one line."""
    from bigbatch.darknet.weights import class_free_layers, read_weights_upto
    from bigbatch.engine.start_weights import Started, load_by_name

    path = Path(cfg.weights)
    if not (path.suffix == ".weights" or DARKNET_PARTIAL.search(path.name)):
        return None
    if not path.is_file():
        raise UserError(f"model.weights: {path} does not exist (expected a Darknet .weights file)")
    network = model.network
    if cfg.weights_cfg is not None:
        source = darknet_network(cfg.weights_cfg, None, None, key="model.weights_cfg", dialect=cfg.darknet_dialect)
        read_weights_upto(source, path)
        started = load_by_name(network, without_batch_counters(source.state_dict()), str(path),
                               f"Darknet weights of {cfg.weights_cfg}", cfg.mismatched)
        started.missing = without_batch_counters(started.missing)
        started.total = len(without_batch_counters(network.state_dict()))
        return started
    note = ""
    try:
        _, layers = read_weights_upto(network, path)
    except UserError as error:
        upto = class_free_layers(network.cfg)
        if cfg.mismatched != "reinit" or "larger than the whole network" not in str(error) or not upto:
            hint = ("; or set model.mismatched=reinit, with model.weights_cfg=ITS.cfg to keep every layer that fits"
                    if "larger than the whole network" in str(error) else "")
            raise UserError(f"model.weights: {error}{hint}") from None
        _, layers = read_weights_upto(network, path, first_layers=upto)
        note = (f"model.weights: {path} holds another network's weights, or this one's for another class count, and "
                f"no model.weights_cfg names its cfg: loaded its first {upto} layers (before the first that depends "
                f"on the classes), as a .conv.{upto} backbone")
    if layers < len(network.layers) and not note:
        note = f"model.weights: {path} holds the first {layers} of the network's {len(network.layers)} layers"
    names = without_batch_counters(network.state_dict())
    loaded = [name for name in names if name.startswith("layers.") and int(name.split(".")[1]) < layers]
    return Started(str(path), "Darknet weights, by position", len(names), loaded=loaded,
                   missing=[name for name in names if name not in set(loaded)], note=note)


def darknet_detector(cfg: ModelConfig, num_classes: int, *, min_size: int, max_size: int) -> nn.Module:
    """``MODELS``' builder for ``darknet``: the network of ``model.cfg`` at ``data.size`` for the dataset's
    classes, from ``model.weights`` when given, as a detector."""
    from bigbatch.darknet.detector import DarknetDetector, check_supported

    network = darknet_network(cfg.cfg, num_classes, min_size, dialect=cfg.darknet_dialect)
    if torch.get_default_device().type != "meta":  # a run (train, eval), not show's or the planner's count
        check_supported(network, cfg.darknet_dialect)  # what the YOLO loss cannot do, said before any step
    return DarknetDetector(network, dialect=cfg.darknet_dialect)


class DarknetClassifier(nn.Module):
    """A Darknet classifier network: the logits are the input of its final ``[softmax]``, flattened."""

    def __init__(self, network: DarknetNetwork) -> None:
        super().__init__()
        self.network = network

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(images)[-1].flatten(1)


def darknet_classifier(cfg: ModelConfig, num_classes: int, in_channels: int = 3, size: int | None = None
                       ) -> nn.Module:
    """``MODELS``' builder for ``darknet_classifier``: the network of ``model.cfg`` at ``data.size``, its last layer
    giving the dataset's classes (``cfg.with_head_classes``), from ``model.weights`` when given (a whole
    ``.weights`` file, a ``.conv.N`` backbone, a state dict or a checkpoint)."""
    network = darknet_network(cfg.cfg, num_classes, size, dialect=cfg.darknet_dialect)
    from bigbatch.darknet.cfg import classifier_head

    if classifier_head(network.cfg) is None:
        raise UserError(f"model.cfg: {network.cfg.path}: the network does not end in a [softmax]; "
                        "model.name darknet_classifier trains Darknet classifiers")
    return DarknetClassifier(network)


def describe_network(cfg_path: str, size: int, dialect: str = "alexeyab") -> str:
    """``bigbatch show``'s part for a Darknet network: the cfg's layer table at ``size`` (as Darknet lists its layers
    when it loads a cfg) with the parameter count, and the keys bigbatch does not use. Built on the meta device: no
    memory, no weights."""
    from bigbatch.darknet import ignored_keys, layer_table

    with torch.device("meta"):
        network = darknet_network(cfg_path, None, size, dialect=dialect)
    from bigbatch.darknet.cfg import classifier_head

    if network.cfg.yolo_layers or classifier_head(network.cfg) is not None:
        gives = "each [yolo] layer" if network.cfg.yolo_layers else "the last layer before the [softmax]"
        role = f"the run gives {gives} the dataset's classes; read and trained as model.darknet_dialect: {dialect}"
    else:
        role = "no [yolo] or [softmax] head: shown and exported, not trained"
    lines = [f"network of {network.cfg.path} ({size} x {size} input; {role}):", layer_table(network)]
    ignored = ignored_keys(network.cfg)
    if ignored:
        lines.append(f"keys Darknet uses and bigbatch ignores: {', '.join(ignored)}")
    if network.cfg.warnings:
        lines.append("read as Darknet reads it:")
        lines += [f"  {line}" for line in network.cfg.warnings]
    return "\n".join(lines)


def describe_darknet(cfg: RunConfig) -> str:
    """``MODELS``' ``describe`` for ``darknet``: the network of ``model.cfg`` at ``data.size``
    (:func:`describe_network`), read and trained as ``model.darknet_dialect``."""
    return describe_network(cfg.model.cfg, cfg.data.size, cfg.model.darknet_dialect)


# No min_input_size: the smallest input is the cfg's own (jnet-conv.cfg's is 10 px), checked layer by layer when the
# network is built on the meta device before any work (telemetry/capacity.py).
def kept_cfg(model: nn.Module) -> str:
    """``MODELS``' ``keeps`` for the Darknet families: ``model.cfg`` as the run built it, for the dataset's classes
    (``cfg_edit.cfg_text_of``), so that a run directory evaluates, resumes and exports after its cfg is moved, and
    Darknet loads the exported ``.weights`` with it."""
    from bigbatch.darknet.cfg_edit import KEPT_CFG_MARK, cfg_text_of

    cfg = model.network.cfg
    return cfg_text_of(cfg, f"{KEPT_CFG_MARK} the network a run trained, {cfg.path} for its dataset's classes")


def darknet_frozen_groups(model: nn.Module, cfg: RunConfig, plan: Any) -> list[Any]:
    """``MODELS``' ``frozen_groups`` for the Darknet families: the cfg's ``stopbackward``, ``train_only_bn``,
    ``dont_update`` and ``burnin_update``, as AlexeyAB's GPU build reads them (``darknet/freeze.py``)."""
    from bigbatch.darknet.freeze import frozen_groups

    return frozen_groups(model, cfg, plan)


MODELS.register("darknet", darknet_detector, task="detection", start_weights=darknet_start,
                describe=describe_darknet, keeps={"model.cfg": kept_cfg}, fields=MODEL_KEYS["darknet"],
                frozen_groups=darknet_frozen_groups)
MODELS.register("darknet_classifier", darknet_classifier, task="classification", start_weights=darknet_start,
                describe=describe_darknet, keeps={"model.cfg": kept_cfg}, fields=MODEL_KEYS["darknet_classifier"],
                frozen_groups=darknet_frozen_groups)
