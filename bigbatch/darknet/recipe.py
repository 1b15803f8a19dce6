"""A Darknet ``.cfg`` as a bigbatch config: the ``[net]`` recipe, and the network (the ``.cfg`` config format).

A ``.cfg`` is a list of ``[section]`` headers each followed by ``key=value`` lines; ``#`` and
``;`` start comments. The ``[net]`` (or ``[network]``) section holds the training recipe, read
as Darknet's ``parse_net_options`` reads it (same defaults):

    batch, subdivisions           -> batch, subdivisions (the cfg's batch is per GPU in Darknet;
                                     here it is taken as the global batch, as on one GPU)
    learning_rate, momentum, decay-> optim (SGD; Darknet's update equals torch's SGD with
                                     weight_decay = decay on the mean loss), ref_batch = batch
    adam (B1, B2, eps)            -> refused when not 0 (:data:`ADAM_REFUSED`), once the network is read
    burn_in, power, policy, steps, scales, step, scale, gamma, max_batches, learning_rate_min, sgdr_cycle,
    sgdr_mult                     -> schedule.darknet (preset ``darknet``); steps = max_batches

The input size (width, height, channels) and the network layers are read by ``cfg.py`` (through
``text.read_cfg_sections``, the same reading with the line of each key); the recipe keys are ``cfg.NET_RECIPE_KEYS``.

:func:`darknet_config`, the reader of the ``.cfg`` config format (``registry.CONFIG_FORMATS``: ``bigbatch train
yolov3.cfg``), takes this recipe and adds the network; the ``key=value`` lines are read by ``text.read_options``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bigbatch.darknet.text import INT_MAX, parse_number, read_cfg
from bigbatch.errors import UserError
from bigbatch.registry import CONFIG_FORMATS

MOSAIC_PROBABILITY = 0.5
"""``data.mosaic`` of a ``.cfg``'s ``mosaic=1``: AlexeyAB's ``load_data_detection`` keeps the mosaic with even odds
(``if (random_gen() % 2 == 0) use_mixup = 0``)."""


CFG_POLICIES = {"constant": "constant", "step": "step", "steps": "steps", "exp": "exp", "poly": "poly",
                "sigmoid": "sig", "sgdr": "sgdr"}
"""The ``[net]`` policies bigbatch trains, as Darknet's ``get_policy`` (src/parser.c) names them, each with its
``schedule.darknet.policy``: Darknet's ``sigmoid``, lr / (1 + exp(gamma * (batch_num - step))) (``get_current_rate``,
src/network.c), is the YAML's ``sig``. ``sig`` in a ``.cfg`` is refused: Darknet does not know it."""

UNSUPPORTED_POLICIES = frozenset({"random"})
"""Darknet's other policy (``get_policy``): lr * uniform(0, 1) ** power, drawn each update; not built."""


ADAM_REFUSED = ("Darknet's Adam (its GPU build's adam_update_gpu) is not an optimizer bigbatch has: it adds "
                "decay * w to the gradient (optim.name adamw decays apart from it) and updates [convolutional] layers "
                "only; set adam=0 to train with SGD (momentum, decay), or give a YAML config")
"""Why ``[net] adam=1`` is refused rather than trained. Darknet (AlexeyAB's GPU build; both forks' CPU builds
have no Adam and train SGD; pjreddie's GPU build also applies it to ``[connected]`` layers) updates each parameter
``w`` of a ``[convolutional]`` layer (weights, biases, BN scales) with ``d = -B (g + decay w)``, ``g`` the mean
loss's gradient, ``B = batch * subdivisions``: ``m = B1 m + (1 - B1) d``, ``v = B2 v + (1 - B2) d^2``,
``w += lr (m / (1 - B1^t)) / (sqrt(v / (1 - B2^t)) + eps)``, ``t`` the iteration (blas_kernels.cu
``adam_update_gpu`` and ``adam_kernel``, convolutional_kernels.cu). That is torch's
``Adam(lr, betas=(B1, B2), eps=eps / B, weight_decay=decay)`` (L2 decay inside the gradient) on the convolutions'
parameters, with every other layer (``[connected]``, ``[local]``, ...) still on SGD with momentum; bigbatch's
optimizers have no Adam with the decay in the gradient (``adamw`` decouples it) and one optimizer for all the
parameters, so the cfg is refused, not trained as SGD in silence."""


def _number(path: Path, line: int, key: str, value: str, kind: type) -> Any:
    number = parse_number(value, kind)
    if kind is int and number is None:
        raise UserError(f"config: {path}:{line}: [net] {key}: expected an integer between -{INT_MAX} and {INT_MAX}, "
                        f"got {value!r}")
    if number is None:
        raise UserError(f"config: {path}:{line}: [net] {key}: expected a finite number, got {value!r}")
    return number


def _numbers(path: Path, line: int, key: str, value: str, kind: type) -> list[Any]:
    return [_number(path, line, key, v.strip(), kind) for v in value.split(",") if v.strip()]


def net_recipe(path: Path) -> dict[str, Any]:
    """The ``[net]`` section of a Darknet ``.cfg`` as a bigbatch config dictionary."""
    sections = read_cfg(path)
    if not sections or sections[0][0] not in ("net", "network"):
        raise UserError(f"config: {path}: a Darknet .cfg starts with a [net] section")
    _, net, line = sections[0]

    def get(key: str, default: Any, kind: type = float) -> Any:
        return _number(path, line, key, net[key], kind) if key in net else default

    batch = get("batch", 1, int)
    subdivisions = get("subdivisions", 1, int)
    policy = net.get("policy", "constant")
    if policy not in CFG_POLICIES:
        what = ("is Darknet's, not supported by bigbatch" if policy in UNSUPPORTED_POLICIES else
                "is not a Darknet policy (Darknet's get_policy warns and trains at a constant rate)")
        raise UserError(f"config: {path}:{line}: [net] policy: {policy!r} {what}; expected one of "
                        f"{', '.join(CFG_POLICIES)}")
    darknet: dict[str, Any] = {
        "policy": CFG_POLICIES[policy],
        "burn_in": get("burn_in", 0, int),
        "power": get("power", 4.0),
        "step": get("step", 1, int),
        "scale": get("scale", 1.0),
        "gamma": get("gamma", 1.0),
    }
    if policy == "steps":  # Darknet reads steps and scales for this policy alone (and sgdr, whose rate ignores them)
        missing = [key for key in ("steps", "scales") if key not in net]
        if missing:  # parse_net_options: error("STEPS policy must have steps and scales in cfg file")
            raise UserError(f"config: {path}:{line}: [net] policy=steps: {' and '.join(missing)} missing; Darknet "
                            "refuses the policy without both (e.g. steps=4000,4500 and scales=.1,.1)")
        darknet["steps"] = _numbers(path, line, "steps", net.get("steps", ""), int)
        darknet["scales"] = _numbers(path, line, "scales", net.get("scales", ""), float)
    if policy == "sgdr":  # AlexeyAB's parse_net_options: learning_rate_min .00001, sgdr_cycle max_batches, sgdr_mult 2
        darknet["learning_rate_min"] = get("learning_rate_min", 1e-5)
        if "sgdr_cycle" in net:
            darknet["sgdr_cycle"] = get("sgdr_cycle", 0, int)
        darknet["sgdr_mult"] = get("sgdr_mult", 2, int)
    max_batches = get("max_batches", 0, int)
    if max_batches:
        darknet["max_batches"] = max_batches
    recipe: dict[str, Any] = {
        "batch": batch,
        "subdivisions": subdivisions,
        "optim": {
            "name": "sgd",
            "lr": get("learning_rate", 0.001),
            "ref_batch": batch,
            "scaling": "linear",
            "momentum": get("momentum", 0.9),
            "weight_decay": get("decay", 0.0001),
        },
        "schedule": {"preset": "darknet", "darknet": darknet},
    }
    if max_batches:
        recipe["steps"] = max_batches
    return recipe


def darknet_config(path: Path) -> dict[str, Any]:
    """A Darknet ``.cfg`` given as the CONFIG (``bigbatch train yolov3.cfg``): the ``[net]`` recipe
    (:func:`net_recipe`: batch, subdivisions, optimizer, schedule), and the network: ``model.name: darknet``
    with ``model.cfg`` this file (absolute), square inputs of the ``[net]`` width, stretched (``data.resize:
    stretch``) or letterboxed where ``[net] letter_box`` is non-zero (Darknet's training and ``map``), and Darknet's
    multi-scale when the last ``[yolo]`` layer has ``random`` (1: the range 1.4; a fraction such as 1.25: that
    range). Darknet's augmentation as the cfg asks: the last ``[yolo]`` layer's ``jitter``, ``[net]`` ``hue``,
    ``saturation``, ``exposure``, ``flip``, and ``mosaic`` (``data.mosaic: 0.5``, AlexeyAB's odds) with
    ``mosaic_bound``. The data default to bigbatch's generated shapes set;
    ``--set data.name=yolo data.path=obj.data`` trains on a Darknet dataset. Evaluation reports mAP@0.5, as
    Darknet's ``map``.

    A classifier (a network ending in ``[softmax]``, without ``[yolo]``) becomes a classification run:
    ``model.name: darknet_classifier``, an image folder (``--set data.path=DIR``; or ``data.name=shards``) with
    Darknet's classifier augmentation from ``[net]`` (``data.preprocessing: darknet``, :func:`classifier_augment`).
    Any other network (a backbone, YOLOv1/v2 heads) is a detection config that ``show`` and ``export`` use and a run
    refuses with one line."""
    import os

    from bigbatch.darknet.cfg import classifier_head, read_darknet_cfg
    from bigbatch.darknet.shapes import layer_shapes

    recipe = net_recipe(path)
    cfg = read_darknet_cfg(path)
    net = cfg.net
    adam = net.options.get("adam")
    if adam is not None and _number(path, net.lines["adam"], "adam", adam, int):  # Darknet: if (net->adam)
        raise UserError(f"config: {path}:{net.lines['adam']}: [net] adam: {adam!r}: {ADAM_REFUSED}")
    for key in ("width", "height"):
        if not getattr(net, key):
            raise UserError(f"config: {path}:{net.line}: [net] {key}: missing; expected the input size")
    if net.width != net.height:
        raise UserError(f"config: {path}:{net.lines.get('height', net.line)}: [net] height: {net.height} differs from "
                        f"width {net.width}; bigbatch trains square inputs")
    layer_shapes(cfg, net.channels or 3, net.height, net.width)  # every layer fits its input: checked before any work
    letter_box = net.options.get("letter_box")  # Darknet's default 0: the image stretched to the input
    resize = ("letterbox" if letter_box is not None and _number(path, net.lines["letter_box"], "letter_box",
                                                                  letter_box, int) else "stretch")
    recipe["optim"]["no_decay_norm_bias"] = True  # Darknet decays the convolution weights, not biases or BN scales
    if not cfg.yolo_layers and classifier_head(cfg) is not None:
        recipe.update(task="classification", model={"name": "darknet_classifier", "cfg": os.path.abspath(path)},
                      data={"name": "folder", "size": net.width, "preprocessing": "darknet",
                            "darknet": classifier_augment(path, net)})
        return recipe
    if not cfg.yolo_layers:  # a backbone, or YOLOv1/v2: shown and exported; a run says why it cannot train
        recipe.update(task="detection", model={"name": "darknet", "cfg": os.path.abspath(path)},
                      data={"name": "shapes", "size": net.width, "resize": resize}, eval={"metric": "mAP50"})
        return recipe
    last = cfg.yolo_layers[-1]  # Darknet reads jitter and random from its last detection layer
    data: dict[str, Any] = {"name": "shapes", "size": net.width, "resize": resize, "jitter": last.jitter,
                            "hue": net.hue, "saturation": max(net.saturation, 1 / net.saturation),
                            "exposure": max(net.exposure, 1 / net.exposure), "flip": 0.5 if net.flip else 0.0}
    if last.resize != 1:  # AlexeyAB's random zoom (detector.c: args.resize = l.resize, the last layer's)
        data["jitter_resize"] = last.resize
    if net.mosaic:  # AlexeyAB turns a batch's mosaic off with even odds (load_data_detection): half the samples
        data["mosaic"] = MOSAIC_PROBABILITY
    if net.mosaic_bound:
        data["mosaic_bound"] = True
    random = last.random
    if random:
        data["multiscale"] = {"sizes": "auto", "range": 1.4 if random == 1 else random}
    recipe.update(task="detection", model={"name": "darknet", "cfg": os.path.abspath(path)}, data=data,
                  eval={"metric": "mAP50"})
    return recipe


def classifier_augment(path: Path, net: Any) -> dict[str, Any]:
    """``data.darknet`` from a classifier's ``[net]``, with ``parse_net_options``' defaults: ``min_crop`` (w) and
    ``max_crop`` (2 w) as fractions of the width, ``aspect``, ``angle``, ``hue``, ``saturation``, ``exposure``,
    ``flip``."""

    def get(key: str, default: float) -> float:
        value = net.options.get(key)
        return default if value is None else float(_number(path, net.lines.get(key, net.line), key, value, float))

    width = float(net.width)
    return {"min_crop": get("min_crop", width) / width, "max_crop": get("max_crop", 2 * width) / width,
            "aspect": max(get("aspect", 1.0), 1 / get("aspect", 1.0)), "angle": get("angle", 0.0), "hue": net.hue,
            "saturation": max(net.saturation, 1 / net.saturation), "exposure": max(net.exposure, 1 / net.exposure),
            "flip": net.flip}


CONFIG_FORMATS.register(".cfg", darknet_config)
