"""A Darknet ``.cfg`` as typed layer specs: every section after ``[net]`` read and checked, one spec per layer.

The semantics are Darknet's ``parse_*`` functions (src/parser.c, AlexeyAB/darknet, a superset of pjreddie's), with
their defaults; the reading of the text is ``text.py`` (shared with the ``[net]`` recipe, ``recipe.py``); each layer
kind's section is read by its module in ``layers/`` (``spec.KINDS``), through ``reading.SectionReader``.

Where Darknet is lenient, bigbatch reads the cfg as Darknet does and says so once (:attr:`DarknetCfg.warnings`,
which ``show`` and ``train`` print): a key given twice (Darknet's ``option_find`` reads the first), a key Darknet
does not read (``max_epochs``, ``seen``: Darknet's ``option_unused`` warns), a comment after a value
(``layers = 180 ###P6``).

Where bigbatch is stricter than Darknet, it says so rather than guess:

- a value must be a number of the right kind and range (Darknet's ``atoi``/``atof`` read ``"3x"`` as 3 and ``""``
  as 0);
- an unknown section, an unknown activation (Darknet falls back to relu), a layer index outside the network
  or not before the layer, a mask index ``>= num``, ``anchors`` not ``2 * num`` numbers, ``groups`` that do not
  divide the channels: each is a :class:`UserError`, one line ``"{path}:{line}: [section] key: what is wrong"``;
- a key Darknet knows whose non-default value changes what the network computes or how ``.weights`` are laid out
  and that bigbatch does not implement (``binary``, ``xnor``, ``dontload``, ``weights_type``...) is refused, as
  are the recurrent layers; a key Darknet knows that changes nothing bigbatch builds (augmentation in ``[net]``,
  ``stream``, ``onlyforward``...) is collected in :attr:`DarknetCfg.ignored` as ``"section:key"``, for the caller
  to list once.

The freezing keys of every layer (``stopbackward``, ``train_only_bn``, ``dont_update``, ``burnin_update``) are read
into each spec (integers >= 0; ``train_only_bn`` 0 or 1); what they freeze is ``freeze.py``'s.

Shapes (which depend on the input size) are checked in ``shapes.py``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bigbatch.darknet.layers import Convolutional, Dropout, MaxPool, Route, Shortcut, Upsample, Yolo
from bigbatch.darknet.reading import SectionReader
from bigbatch.darknet.spec import KINDS, SECTIONS, DarknetCfg, LayerSpec, NetInput
from bigbatch.darknet.text import KeyedSection, read_cfg_sections
from bigbatch.errors import UserError

__all__ = ["Convolutional", "DarknetCfg", "Dropout", "LayerSpec", "MaxPool", "NetInput", "Route", "Shortcut",
           "Upsample", "Yolo", "classifier_head", "ignored_keys", "read_darknet_cfg", "with_classes",
           "with_head_classes"]


def ignored_keys(cfg: DarknetCfg) -> list[str]:
    """The keys of ``cfg`` Darknet knows and bigbatch does not use, each once, as ``"section:key"``, in order."""
    return list(cfg.ignored)


# ----------------------------------------------------------------------------- the keys Darknet knows

NET_RECIPE_KEYS = frozenset({
    "batch", "subdivisions", "learning_rate", "momentum", "decay", "burn_in", "power", "policy", "steps", "scales",
    "step", "scale", "gamma", "max_batches", "learning_rate_min", "sgdr_cycle", "sgdr_mult"})
"""The ``[net]`` keys of the training recipe, which ``recipe.net_recipe`` reads (the network's own, width, height
and channels, are read here)."""


NET_KEYS = NET_RECIPE_KEYS | {
    # the network's input: read here
    "width", "height", "channels",
    # known to Darknet's parse_net_options (pjreddie and AlexeyAB); not used by bigbatch
    "inputs", "time_steps", "track", "augment_speed", "sequential_subdivisions", "try_fix_nan", "learning_rate_min",
    "sgdr_cycle", "sgdr_mult", "seq_scales", "weights_reject_freq", "equidistant_point",
    "badlabels_rejection_percentage", "num_sigmas_reject_badlabels", "ema_alpha", "use_cuda_graph", "loss_scale",
    "dynamic_minibatch", "optimized_memory", "workspace_size_limit_MB", "adam", "B1", "B2", "eps", "max_crop",
    "min_crop", "max_ratio", "min_ratio", "center", "clip", "notruth", "flip", "blur", "gaussian_noise", "mixup",
    "cutmix", "mosaic", "letter_box", "mosaic_bound", "contrastive", "contrastive_jit_flip", "contrastive_color",
    "unsupervised", "label_smooth_eps", "resize_step", "attention", "adversarial_lr", "max_chart_loss", "angle",
    "aspect", "saturation", "exposure", "hue", "show_receptive_field", "random"}
"""Every ``[net]`` key Darknet reads (pjreddie and AlexeyAB): the recipe's, the input's, and the rest (ignored)."""

NET_INPUT_KEYS = frozenset({"width", "height", "channels"})
NET_AUGMENT_KEYS = frozenset({"hue", "saturation", "exposure", "flip", "mosaic", "mosaic_bound"})
"""The ``[net]`` augmentation keys bigbatch uses (``data.hue``, ``saturation``, ``exposure``, ``flip``, ``mosaic``,
``mosaic_bound``)."""
NET_DETECTOR_KEYS = frozenset({"mosaic", "mosaic_bound"})
"""Those used by a detector only (a network with ``[yolo]`` layers): a classifier's ``mosaic`` is another augmentation
(AlexeyAB's ``load_data_augment``) that bigbatch does not implement, so there they are listed as ignored."""

NOT_BUILT_SECTIONS = {
    "rnn": "a recurrent layer", "gru": "a recurrent layer", "lstm": "a recurrent layer",
    "crnn": "a recurrent layer", "conv_lstm": "a recurrent layer", "history": "a recurrent layer's history"}
"""Darknet layer sections bigbatch refuses, with the reason."""

OTHER_DARKNET_SECTIONS = frozenset({
    "scale_channels", "sam", "crop", "cost", "detection", "region", "Gaussian_yolo", "local", "activation",
    "conn", "connected", "local_avg", "local_avgpool", "reorg3d", "reorg", "avg", "avgpool", "lrn",
    "normalization", "batchnorm", "soft", "softmax", "contrastive", "empty", "silence", "implicit", "deconvolutional",
    "deconv"})
"""Darknet layer sections (string_to_layer_type) that may not be built by bigbatch."""


# ----------------------------------------------------------------------------- the file

MAX_LAYERS = 10_000
"""The most layers (sections after ``[net]``) a ``.cfg`` may have; one more is refused, naming its line, before any
section is parsed. The largest stock cfgs (AlexeyAB's ``cspx-p7-mish.cfg`` and ``cspx-p7-mish_hp.cfg``, in
``tests/fixtures/darknet/stock/``) have 375 layers: this leaves room for networks 26 times deeper. Reading and building
a network is linear in its layers (each layer's shape and module made once, ``shapes.py``, ``network.py``), yet a
cfg of 10^5 layers would still keep each command that builds it (``show``, ``export``, ``train``: its parameters
counted on the meta device first, then built) busy for a minute or more; 10,000 keeps it to seconds."""


def _net_input(path: Path, section: KeyedSection, ignored: list[str], warnings: list[str]) -> NetInput:
    s = SectionReader(path, section, -1, warnings)
    for key in section.options:
        if key not in NET_KEYS:
            s.warn(key, "unknown key, not used (Darknet's [net] does not read it either)")
        elif key in NET_DETECTOR_KEYS or (key not in NET_INPUT_KEYS and key not in NET_RECIPE_KEYS
                                          and key not in NET_AUGMENT_KEYS):
            ignored.append(f"{section.name}:{key}")  # a detector's keys: taken off once the layers are known
    width = s.integer("width", 0, 0)
    height = s.integer("height", 0, 0)
    channels = s.integer("channels", 0, 0)
    hue = s.number("hue", 0.0, 0, 0.5)
    saturation = s.number("saturation", 1.0, above=0)
    exposure = s.number("exposure", 1.0, above=0)
    flip = bool(s.integer("flip", 1, 0, 1))
    mosaic, mosaic_bound = s.flag("mosaic"), s.flag("mosaic_bound")
    return NetInput(width or None, height or None, channels or None, section.line, s.lines(), hue, saturation,
                    exposure, flip, dict(section.options), mosaic, mosaic_bound)


def _freezing(s: SectionReader) -> dict[str, int | bool]:
    """The freezing keys of a layer section (``spec.FREEZING_KEYS``), read for every layer as AlexeyAB's
    ``parse_network_cfg`` reads them (``option_find_int_quiet``, 0 by default), strictly: whole numbers >= 0
    (Darknet reads a negative one and it changes nothing) and ``train_only_bn`` 0 or 1."""
    return {"stopbackward": s.integer("stopbackward", 0, 0), "train_only_bn": s.flag("train_only_bn"),
            "dont_update": s.integer("dont_update", 0, 0), "burnin_update": s.integer("burnin_update", 0, 0)}


def read_darknet_cfg(path: str | Path, key: str | None = None) -> DarknetCfg:
    """The ``.cfg`` at ``path`` as :class:`DarknetCfg`, every section and value checked (shapes aside).

    A mistake is one :class:`UserError` line ``"{path}:{line}: [section] key: what is wrong"``; a file that cannot
    be read, or is not a regular file within ``text.MAX_CFG_BYTES``, one line beginning ``"{key}: "`` (the option that
    named it) when ``key`` is given."""
    path = Path(path)
    warnings: list[str] = []
    sections = read_cfg_sections(path, prefix="", warnings=warnings, key=key)
    if not sections or sections[0].name not in ("net", "network"):
        raise UserError(f"{path}:{sections[0].line if sections else 1}: a Darknet .cfg starts with a [net] section")
    if len(sections) - 1 > MAX_LAYERS:
        first_past = sections[MAX_LAYERS + 1]
        raise UserError(f"{path}:{first_past.line}: [{first_past.name}]: layer {MAX_LAYERS} is past the most layers "
                        f"a .cfg may have, {MAX_LAYERS:,} (the cfg has {len(sections) - 1:,}; the largest stock cfgs "
                        "have 375)")
    ignored: list[str] = []
    net = _net_input(path, sections[0], ignored, warnings)
    layers: list[LayerSpec] = []
    for index, section in enumerate(sections[1:]):
        if section.name in ("net", "network"):
            raise UserError(f"{path}:{section.line}: [{section.name}]: a second [net] section")
        kind = SECTIONS.get(section.name)
        if kind is None:
            if section.name in NOT_BUILT_SECTIONS:
                what = f"{NOT_BUILT_SECTIONS[section.name]}, which bigbatch does not build"
            elif section.name in OTHER_DARKNET_SECTIONS:
                what = "a Darknet layer bigbatch does not build"
            else:
                what = "unknown section"
            raise UserError(f"{path}:{section.line}: [{section.name}]: {what} (bigbatch builds: "
                            f"{', '.join(sorted(SECTIONS))})")
        s = SectionReader(path, section, index, warnings)
        common = {"index": index, "section": section.name, "line": section.line, "lines": s.lines(),
                  **_freezing(s)}
        layer_kind = KINDS[kind]
        layers.append(layer_kind.parse(s, common))
        s.rest(layer_kind.ignored, layer_kind.refused, ignored)
    if not layers:
        raise UserError(f"{path}:{sections[0].line}: [net]: the cfg has no layers after [net]")
    if any(layer.kind == "yolo" for layer in layers):  # a detector uses them (data.mosaic, data.mosaic_bound)
        detector_keys = {f"{sections[0].name}:{k}" for k in NET_DETECTOR_KEYS}
        ignored = [key for key in ignored if key not in detector_keys]
    return DarknetCfg(path, net, tuple(layers), tuple(dict.fromkeys(ignored)), tuple(dict.fromkeys(warnings)))


def classifier_head(cfg: DarknetCfg) -> LayerSpec | None:
    """The ``[softmax]`` a classifier ends in (only ``[cost]`` layers after it), else None."""
    for layer in reversed(cfg.layers):
        if layer.kind == "softmax":
            return layer
        if layer.kind != "cost":
            return None
    return None


def with_head_classes(cfg: DarknetCfg, classes: int) -> DarknetCfg:
    """A classifier ``cfg`` for ``classes`` classes: the last ``[convolutional]`` (``filters``) or ``[connected]``
    (``output``) before its ``[softmax]`` gives ``classes`` outputs, as one edits a cfg for a new dataset."""
    head = classifier_head(cfg)
    if head is None:
        raise UserError(f"{cfg.path}: the network does not end in a [softmax]: not a classifier")
    if getattr(head, "tree_groups", ()):
        raise cfg.error(head, "tree", "a WordTree head cannot follow a new number of classes; remove tree= to train "
                                      "on another dataset")
    last = next((layer for layer in reversed(cfg.layers[:head.index]) if layer.kind in ("convolutional", "connected")),
                None)
    if last is None:
        raise cfg.error(head, None, "no [convolutional] or [connected] before it to give the dataset's classes")
    key = "filters" if last.kind == "convolutional" else "output"
    if getattr(last, key) == classes:
        return cfg
    if getattr(last, "groups", 1) > 1 and classes % last.groups:
        raise cfg.error(last, "groups", f"{last.groups} groups do not divide {classes} classes")
    layers = list(cfg.layers)
    layers[last.index] = replace(last, **{key: classes})
    return replace(cfg, layers=tuple(layers))


def with_classes(cfg: DarknetCfg, classes: int) -> DarknetCfg:
    """``cfg`` for ``classes`` classes: each ``[yolo]`` gets ``classes``, and the convolution before it
    ``filters = len(mask) * (classes + 5)``. Each ``[yolo]`` must follow a ``[convolutional]``. A classifier (no
    ``[yolo]``, a final ``[softmax]``): :func:`with_head_classes`."""
    if classes < 1:
        raise UserError(f"classes: expected an integer >= 1, not {classes}")
    if not cfg.yolo_layers and classifier_head(cfg) is not None:
        return with_head_classes(cfg, classes)
    layers = list(cfg.layers)
    for yolo in cfg.yolo_layers:
        before = layers[yolo.index - 1] if yolo.index else None
        if not isinstance(before, Convolutional):
            raise cfg.error(yolo, None, "the layer before is not a [convolutional]: its filters cannot follow "
                                        "a new number of classes")
        if yolo.counters_per_class is not None and classes != yolo.classes:
            raise cfg.error(yolo, "counters_per_class", f"one per class of {yolo.classes}; cannot follow "
                                                         f"{classes} classes")
        layers[yolo.index] = replace(yolo, classes=classes)
        layers[before.index] = replace(before, filters=len(yolo.mask) * (classes + 5))
    return replace(cfg, layers=tuple(layers))


def for_dialect(cfg: DarknetCfg, dialect: str) -> DarknetCfg:
    """``cfg`` as the Darknet of ``dialect`` (``model.darknet_dialect``) reads it: AlexeyAB's parse_shortcut does
    not read ``alpha`` and ``beta`` (pjreddie's scales the two inputs by them), so under ``alexeyab`` and
    ``gradient`` a ``[shortcut]`` that sets them is read with both 1, and a warning says so."""
    if dialect == "pjreddie":
        return cfg
    layers = list(cfg.layers)
    warnings = list(cfg.warnings)
    for layer in cfg.layers:
        if isinstance(layer, Shortcut) and (layer.alpha != 1 or layer.beta != 1):
            key = "alpha" if layer.alpha != 1 else "beta"
            warnings.append(str(cfg.error(layer, key, f"alpha={layer.alpha:g}, beta={layer.beta:g}: AlexeyAB's "
                                                      "Darknet does not read them and adds the inputs as they are; "
                                                      "read as 1 (model.darknet_dialect: pjreddie applies them)")))
            layers[layer.index] = replace(layer, alpha=1.0, beta=1.0)
    return replace(cfg, layers=tuple(layers), warnings=tuple(warnings))
