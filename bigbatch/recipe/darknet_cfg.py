"""Darknet ``.cfg`` files: the sections, and the ``[net]`` recipe as a bigbatch config.

A ``.cfg`` is a list of ``[section]`` headers each followed by ``key=value`` lines; ``#`` and
``;`` start comments. The ``[net]`` (or ``[network]``) section holds the training recipe, read
as Darknet's ``parse_net_options`` reads it (same defaults):

    batch, subdivisions           -> batch, subdivisions (the cfg's batch is per GPU in Darknet;
                                     here it is taken as the global batch, as on one GPU)
    learning_rate, momentum, decay-> optim (SGD; Darknet's update equals torch's SGD with
                                     weight_decay = decay on the mean loss), ref_batch = batch
    burn_in, power, policy, steps, scales, step, scale, gamma, max_batches
                                  -> schedule.darknet (preset ``darknet``); steps = max_batches

The input size (width, height, channels) and the network layers are read by ``models/darknet/cfg.py``
(through ``read_cfg_sections``, the same reading with the line of each key); the recipe keys are
``NET_RECIPE_KEYS``.

``models/darknet_models.py``'s ``darknet_config``, the reader of the ``.cfg`` config format
(``registry.CONFIG_FORMATS``: ``bigbatch train yolov3.cfg``), takes this recipe and adds the network; the
``key=value`` lines are read by ``darknet_text.read_options``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bigbatch.darknet_text import INT_MAX, KeyedSection, parse_number, read_keyed_sections
from bigbatch.errors import UserError


def read_cfg_sections(path: Path, prefix: str = "config: ") -> list[KeyedSection]:
    """The sections of a ``.cfg`` file in order, with the line of each key; errors begin ``{prefix}{path}``."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise UserError(f"{prefix}cannot read {path}: {e.strerror}") from None
    lines = text.split("\n")  # lines as Darknet and editors count them
    return read_keyed_sections(lines, f"{prefix}{path}", sections=True)


def read_cfg(path: Path) -> list[tuple[str, dict[str, str], int]]:
    """The sections of a ``.cfg`` file in order: (name, options, line number of the header)."""
    return [(s.name, s.options, s.line) for s in read_cfg_sections(path)]


NET_RECIPE_KEYS = frozenset({
    "batch", "subdivisions", "learning_rate", "momentum", "decay", "burn_in", "power", "policy", "steps", "scales",
    "step", "scale", "gamma", "max_batches"})
"""The ``[net]`` keys ``net_recipe`` reads (the network's own, width, height and channels, are read in
``models/darknet/cfg.py``)."""


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
    if policy not in ("constant", "step", "steps", "exp", "poly", "sig"):
        raise UserError(f"config: {path}:{line}: [net] policy: {policy!r} is not supported "
                        "(expected constant, step, steps, exp, poly or sig)")
    darknet: dict[str, Any] = {
        "policy": policy,
        "burn_in": get("burn_in", 0, int),
        "power": get("power", 4.0),
        "step": get("step", 1, int),
        "scale": get("scale", 1.0),
        "gamma": get("gamma", 1.0),
    }
    if "steps" in net:
        darknet["steps"] = _numbers(path, line, "steps", net["steps"], int)
        darknet["scales"] = _numbers(path, line, "scales", net.get("scales", ""), float)
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

