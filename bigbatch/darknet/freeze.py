"""A Darknet cfg's freezing keys as ``largebatch.freeze.FrozenGroup`` s: ``stopbackward``, ``train_only_bn``,
``dont_update`` and ``burnin_update`` (read into each layer's spec by ``cfg.py``), registered as the Darknet families'
``frozen_groups``.

What each key freezes is what AlexeyAB's GPU build does (src/ of AlexeyAB/darknet, the build people train with), in
every ``model.darknet_dialect``. A Darknet iteration is one optimizer step; step k (0-based) is Darknet's update
whose ``iteration_num`` (``update_network_gpu``: ``seen / (batch * subdivisions)``, the images of the step counted)
is k + 1, while ``get_current_iteration`` (``*net.cur_iteration``, which ``train_network_waitkey`` in network.c
increments after the step's forward and backward passes) is k during its backward pass. bigbatch's Darknet schedule
counts the same way (``largebatch/schedule.py``, ``darknet``: ``batch_num = step + 1``).

- ``stopbackward=1`` at layer i: the layers 0..i, for the whole run. parser.c ``parse_network_cfg`` builds the
  layers before the last such layer with ``train = 0``: network_kernels.cu ``update_network_gpu`` skips them
  (``if (l.train == 0) continue;``) and convolutional_kernels.cu ``forward_convolutional_layer_gpu`` runs them as
  in inference (``if (l.train == 0) state.train = 0;``: BatchNorm normalises with its rolling statistics and leaves
  them as they are); network_kernels.cu ``backward_network_gpu`` stops at layer i before its own backward
  (``if (l.stopbackward == 1) break;``), so layer i gets no gradient either. Here: the parameters of layers 0..i
  frozen, the BatchNorm of the ``[convolutional]`` layers 0..i-1 in eval mode; layer i's BatchNorm, and that of a
  ``[connected]`` layer (whose forward does not look at ``l.train``), keep their batch statistics and update their
  running ones, as Darknet's. Only the last ``stopbackward=1`` counts.
- ``stopbackward=N``, N > 1, at layer i: the layers 0..i (i included) before step N. ``backward_network_gpu``:
  ``if (l.stopbackward > get_current_iteration(net)) break;``, before layer i's backward. Their BatchNorm layers
  stay in training mode (every layer is built with ``train = 1``).
- ``train_only_bn=1`` at layer i: the layers 0..i, for the whole run, every parameter: parser.c
  ``set_train_only_bn`` sets the flag on every layer up to the last that has it, and ``update_network_gpu`` skips
  such a layer altogether (``if (l.train_only_bn) continue;``): neither its weights (whose gradient
  ``backward_convolutional_layer_gpu`` does not even compute, ``!l.train_only_bn``) nor its biases nor its
  BatchNorm scales move. What trains there, despite the name, is BatchNorm's running statistics: the forward pass
  is in training mode, so they follow the data (here too: the BatchNorm layers stay in training mode).
- ``dont_update=N`` at layer i: that layer alone before step N: ``update_network_gpu`` updates it only
  ``if (l.dont_update < iteration_num)``, i.e. from step N on. Its backward runs (the layers before it train as
  usual) and its BatchNorm stays in training mode.
- ``burnin_update=M`` at layer i: that layer alone while ``M * burn_in > iteration_num`` (``update_network_gpu``),
  i.e. before step M * burn_in - 1: with M = 1, exactly the steps whose learning rate is still burning in (lr *
  ((k + 1) / burn_in) ** power while k + 1 < burn_in). ``burn_in`` is Darknet's one burn-in, that of its learning
  rate: the run's ``schedule.darknet.burn_in`` (a ``.cfg`` run takes it from ``[net] burn_in``; ``bigbatch scale``
  rescales it with the batch), or, under another schedule preset, the cfg's ``[net] burn_in`` as written. Its
  BatchNorm stays in training mode.

A frozen tensor here is left exactly as it is (``largebatch/freeze.py``): no gradient, no optimizer state, no weight
decay. Where Darknet's GPU build does more, bigbatch does not follow it: ``update_network_gpu`` still runs the update
of the layers ``stopbackward=N`` freezes and of ``stopbackward=1``'s own layer, so weight decay shrinks their
convolution weights (``update_convolutional_layer_gpu``: ``weight_updates -= decay * batch * weights``, with
momentum); and while ``dont_update``/``burnin_update`` skip a layer's update its backward keeps adding gradients into
``weight_updates``, whose sum the first update then applies at once. Its CPU build reads the keys otherwise (network.c
``backward_network``: any non-zero ``stopbackward`` stops the backward pass for the whole run; ``update_network``
ignores the three other keys), and pjreddie's Darknet knows ``stopbackward`` alone, which stops the backward pass for
the whole run while every layer is still updated (decayed) and its BatchNorm statistics still move. docs/darknet.md,
"Freezing", says the same for users.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from bigbatch.darknet.spec import DarknetCfg
from bigbatch.darknet.text import parse_number
from bigbatch.errors import UserError
from bigbatch.largebatch.freeze import FrozenGroup

LAYERS_PREFIX = "network.layers."
"""Where a Darknet network's layers sit in the model a run trains (the detector and the classifier alike)."""


def frozen_groups(model: nn.Module, cfg: Any, plan: Any) -> list[FrozenGroup]:
    """``MODELS``' ``frozen_groups`` for the Darknet families: the groups the freezing keys of ``model.network``'s cfg
    ask for (see the module docstring), with the run's burn-in (:func:`burn_in`)."""
    return darknet_groups(model, burn_in(cfg, model.network.cfg))


def burn_in(cfg: Any, darknet: DarknetCfg) -> int:
    """Darknet's ``burn_in`` for ``burnin_update``: the learning rate's, ``schedule.darknet.burn_in``, under the
    ``darknet`` schedule preset; else the cfg's ``[net] burn_in`` (0 where it has none)."""
    if cfg.schedule.preset == "darknet":
        return int(cfg.schedule.darknet.burn_in)
    written = darknet.net.options.get("burn_in")
    if written is None:
        return 0
    value = parse_number(written, int)
    if value is None:
        raise UserError(f"{darknet.path}:{darknet.net.lines.get('burn_in', darknet.net.line)}: [net] burn_in: "
                        f"expected an integer, not {written!r}")
    return value


def darknet_groups(model: nn.Module, burn_in: int) -> list[FrozenGroup]:
    """The groups of ``model.network``'s freezing keys, ``burnin_update`` counted in ``burn_in`` steps."""
    cfg: DarknetCfg = model.network.cfg
    names: dict[int, list[str]] = {}  # layer index -> its parameters' names in the model
    for name, _ in model.named_parameters():
        if name.startswith(LAYERS_PREFIX):
            names.setdefault(int(name[len(LAYERS_PREFIX):].split(".", 1)[0]), []).append(name)

    def group(layers: range | list[int], until: int | None, reason: str, bn_eval: range | list[int] = ()
              ) -> list[FrozenGroup]:
        found = tuple(name for i in layers for name in names.get(i, ()))
        modules = tuple(f"{LAYERS_PREFIX}{i}" for i in bn_eval)
        return [FrozenGroup(found, modules, until, reason)] if found else []

    groups: list[FrozenGroup] = []
    stops = [layer.index for layer in cfg.layers if layer.stopbackward == 1]
    if stops:
        last = stops[-1]
        inference = [i for i in range(last) if cfg.layers[i].kind == "convolutional"]  # built with train = 0
        groups += group(range(last + 1), None, f"stopbackward=1 at layer {last}: layers 0-{last}", inference)
    for layer in cfg.layers:
        if layer.stopbackward > 1:
            groups += group(range(layer.index + 1), layer.stopbackward,
                            f"stopbackward={layer.stopbackward} at layer {layer.index}: layers 0-{layer.index}")
    only_bn = [layer.index for layer in cfg.layers if layer.train_only_bn]
    if only_bn:
        last = only_bn[-1]
        groups += group(range(last + 1), None, f"train_only_bn=1 at layer {last}: layers 0-{last}; their BatchNorm "
                                               "running statistics still move")
    for layer in cfg.layers:
        if layer.dont_update > 0:
            groups += group([layer.index], layer.dont_update, f"dont_update={layer.dont_update} at layer {layer.index}")
        until = layer.burnin_update * burn_in - 1
        if layer.burnin_update > 0 and until > 0:
            groups += group([layer.index], until, f"burnin_update={layer.burnin_update} at layer {layer.index} "
                                                  f"(x burn_in {burn_in})")
    return groups
