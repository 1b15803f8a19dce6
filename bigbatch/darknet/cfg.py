"""A Darknet ``.cfg`` as typed layer specs: every section after ``[net]`` read and checked, one dataclass per kind.

The semantics are Darknet's ``parse_*`` functions (src/parser.c, AlexeyAB/darknet, a superset of pjreddie's), with
their defaults; the reading of the text is ``text.py`` (shared with the ``[net]`` recipe,
``recipe.py``). Built here: ``[convolutional]`` (alias ``[conv]``), ``[maxpool]`` (``[max]``),
``[upsample]``, ``[shortcut]``, ``[route]``, ``[yolo]`` and ``[dropout]``.

Where bigbatch is stricter than Darknet, it says so rather than guess:

- a value must be a number of the right kind and range (Darknet's ``atoi``/``atof`` read ``"3x"`` as 3 and ``""``
  as 0); a key given twice is refused (Darknet reads the first, the ``[net]`` recipe reader the last);
- an unknown section or key, an unknown activation (Darknet falls back to relu), a layer index outside the network
  or not before the layer, a mask index ``>= num``, ``anchors`` not ``2 * num`` numbers, ``groups`` that do not
  divide the channels: each is a :class:`UserError`, one line ``"{path}:{line}: [section] key: what is wrong"``;
- a key Darknet knows whose non-default value changes what the network computes or how ``.weights`` are laid out
  and that bigbatch does not implement (``binary``, ``xnor``, ``share_index``, ``dontload``, ``weights_type``...)
  is refused; a key Darknet knows that changes nothing bigbatch builds (augmentation in ``[net]``, ``stopbackward``,
  ``stream``...) is collected in :attr:`DarknetCfg.ignored` as ``"section:key"``, for the caller to warn once.

Padding of a convolution, as parser.c: ``padding`` (default 0) unless ``pad`` is non-zero, then ``size // 2``:
``pad`` wins over ``padding``. A maxpool's ``padding`` defaults to ``size - 1``. ``stride_x``/``stride_y`` default to
``stride``. A relative (negative) index ``i`` in ``layers``/``from`` means layer ``index + i``.

Shapes (which depend on the input size) are checked in ``shapes.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

from bigbatch.darknet.activations import ACTIVATIONS
from bigbatch.darknet.text import KeyedSection, parse_number, read_cfg_sections
from bigbatch.errors import UserError

# ----------------------------------------------------------------------------- the specs


@dataclass(frozen=True, kw_only=True)
class LayerSpec:
    """What every layer spec has: its index in the network (from 0, ``[net]`` not counted), the section name as
    written, the line of its header and of each of its keys (for messages)."""

    kind: ClassVar[str] = ""
    index: int
    section: str
    line: int
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def line_of(self, key: str | None) -> int:
        """The line of ``key`` in the cfg, else the line of the header."""
        return self.lines.get(key, self.line) if key else self.line


@dataclass(frozen=True, kw_only=True)
class Convolutional(LayerSpec):
    """``[convolutional]``: ``filters`` outputs of ``size x size`` kernels over ``channels / groups`` inputs each.

    Output size (convolutional_layer.c): ``out = (in + 2 * padding - size) // stride + 1`` per axis."""

    kind: ClassVar[str] = "convolutional"
    filters: int = 1
    size: int = 1
    stride_x: int = 1
    stride_y: int = 1
    padding: int = 0
    groups: int = 1
    dilation: int = 1
    batch_normalize: bool = False
    activation: str = "logistic"


@dataclass(frozen=True, kw_only=True)
class MaxPool(LayerSpec):
    """``[maxpool]``: the max over ``size x size`` windows, ``padding // 2`` out-of-bounds cells left and top (the
    rest right and bottom), which never win (maxpool_layer.c reads them as ``-FLT_MAX``).

    Output size: ``out = (in + padding - size) // stride + 1`` per axis."""

    kind: ClassVar[str] = "maxpool"
    size: int = 1
    stride_x: int = 1
    stride_y: int = 1
    padding: int = 0


@dataclass(frozen=True, kw_only=True)
class Upsample(LayerSpec):
    """``[upsample]``: nearest neighbour, ``stride`` times in each axis, times ``scale`` (upsample_layer.c)."""

    kind: ClassVar[str] = "upsample"
    stride: int = 2
    scale: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Shortcut(LayerSpec):
    """``[shortcut]``: ``activation(alpha * previous + beta * sum(layers in sources))`` (shortcut_layer.c;
    ``alpha``, ``beta`` are pjreddie's, default 1); ``sources`` are absolute indices."""

    kind: ClassVar[str] = "shortcut"
    sources: tuple[int, ...] = ()
    activation: str = "linear"
    alpha: float = 1.0
    beta: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Route(LayerSpec):
    """``[route]``: the outputs of ``sources`` (absolute indices) concatenated along channels; with ``groups``, only
    the ``group_id``-th of ``groups`` equal channel chunks of each (route_layer.c)."""

    kind: ClassVar[str] = "route"
    sources: tuple[int, ...] = ()
    groups: int = 1
    group_id: int = 0


@dataclass(frozen=True, kw_only=True)
class Yolo(LayerSpec):
    """``[yolo]``: every key of parse_yolo (AlexeyAB), with its default. ``anchors`` are the ``num`` (w, h) pairs
    in input pixels; ``mask`` the indices of those this layer predicts (default: all). The network passes the layer's
    input through unchanged: the logistic and the decoding belong to the loss and the decoder."""

    kind: ClassVar[str] = "yolo"
    mask: tuple[int, ...] = ()
    anchors: tuple[tuple[float, float], ...] = ()
    classes: int = 20
    num: int = 1
    max_boxes: int = 200
    jitter: float = 0.2
    resize: float = 1.0
    ignore_thresh: float = 0.5
    truth_thresh: float = 1.0
    iou_thresh: float = 1.0
    random: float = 0.0
    scale_x_y: float = 1.0
    iou_normalizer: float = 0.75
    obj_normalizer: float = 1.0
    cls_normalizer: float = 1.0
    delta_normalizer: float = 1.0
    iou_loss: str = "mse"
    iou_thresh_kind: str = "iou"
    nms_kind: str = "default"
    beta_nms: float = 0.6
    max_delta: float = math.inf
    counters_per_class: tuple[int, ...] | None = None
    label_smooth_eps: float = 0.0
    new_coords: int = 0
    objectness_smooth: int = 0
    focal_loss: int = 0

    @property
    def masked_anchors(self) -> tuple[tuple[float, float], ...]:
        """The (w, h) anchors this layer predicts, in mask order."""
        return tuple(self.anchors[m] for m in self.mask)

    @property
    def filters(self) -> int:
        """The channels this layer takes: ``len(mask) * (classes + 5)`` (yolo_layer.c: 4 box, 1 objectness)."""
        return len(self.mask) * (self.classes + 5)


@dataclass(frozen=True, kw_only=True)
class Dropout(LayerSpec):
    """``[dropout]``: zero with ``probability``, scale the rest by ``1 / (1 - probability)`` in training
    (dropout_layer.c); the identity in evaluation."""

    kind: ClassVar[str] = "dropout"
    probability: float = 0.2


@dataclass(frozen=True)
class NetInput:
    """The network's input from ``[net]``: width, height (None where the cfg has none) and channels."""

    width: int | None
    height: int | None
    channels: int | None
    line: int
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)
    hue: float = 0.0
    """Darknet's colour augmentation (``parse_net_options``' defaults): a hue shift in [-hue, hue] turns,"""
    saturation: float = 1.0
    """saturation and exposure (HSV value) scaled by ``rand_scale``: in [1/s, s],"""
    exposure: float = 1.0
    flip: bool = True
    """and a horizontal flip of half the images (AlexeyAB's ``flip``, 1 by default)."""


@dataclass(frozen=True)
class DarknetCfg:
    """A whole ``.cfg``: its path, the input, the layers in order, and the keys bigbatch knows but does not use."""

    path: Path
    net: NetInput
    layers: tuple[LayerSpec, ...]
    ignored: tuple[str, ...] = ()

    def error(self, layer: LayerSpec, key: str | None, what: str) -> UserError:
        """The one-line error ``"{path}:{line}: [section] key: what"`` about ``key`` of ``layer``."""
        name = f"[{layer.section}] {key}" if key else f"[{layer.section}]"
        return UserError(f"{self.path}:{layer.line_of(key)}: {name}: {what}")

    @property
    def yolo_layers(self) -> tuple[Yolo, ...]:
        return tuple(layer for layer in self.layers if isinstance(layer, Yolo))


def ignored_keys(cfg: DarknetCfg) -> list[str]:
    """The keys of ``cfg`` Darknet knows and bigbatch does not use, each once, as ``"section:key"``, in order."""
    return list(cfg.ignored)


# ----------------------------------------------------------------------------- the keys Darknet knows

NET_RECIPE_KEYS = frozenset({
    "batch", "subdivisions", "learning_rate", "momentum", "decay", "burn_in", "power", "policy", "steps", "scales",
    "step", "scale", "gamma", "max_batches"})
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
NET_AUGMENT_KEYS = frozenset({"hue", "saturation", "exposure", "flip"})
"""The ``[net]`` augmentation keys bigbatch uses (``data.hue``, ``saturation``, ``exposure``, ``flip``)."""

LAYER_KEYS_IGNORED = frozenset({
    "clip", "onlyforward", "dont_update", "burnin_update", "stopbackward", "train_only_bn", "learning_rate",
    "stream", "wait_stream"})
"""Keys parse_network_cfg reads for every layer (training controls bigbatch does not use)."""

LAYER_KEYS_REFUSED = frozenset({"dontload", "dontloadscales"})
"""Keys of every layer that change how ``.weights`` are read when non-zero."""

IGNORED: dict[str, frozenset[str]] = {
    "convolutional": frozenset({"cbn", "dot", "angle", "grad_centr", "reverse", "assisted_excitation"}),
    "maxpool": frozenset({"out_channels"}),
    "upsample": frozenset(),
    "shortcut": frozenset(),
    "route": frozenset(),
    "yolo": frozenset({"show_details", "track_history_size", "sim_thresh", "dets_for_track", "dets_for_show",
                       "track_ciou_norm", "embedding_layer", "map"}),
    "dropout": frozenset({"dropblock_size_rel", "dropblock_size_abs"}),
}
"""Per kind, the keys Darknet reads that change nothing bigbatch builds (training or display options)."""

REFUSED: dict[str, dict[str, str]] = {
    "convolutional": {"binary": "0", "xnor": "0", "bin_output": "0", "sway": "0", "rotate": "0", "stretch": "0",
                      "stretch_sway": "0", "antialiasing": "0", "flipped": "0", "coordconv": "0"},
    "maxpool": {"maxpool_depth": "0", "antialiasing": "0", "maxpool_zero_nonmax": "0"},
    "upsample": {},
    "shortcut": {"weights_type": "none", "weights_normalization": "none"},
    "route": {},
    "yolo": {},
    "dropout": {"dropblock": "0"},
}
"""Per kind, the keys Darknet reads that bigbatch does not implement, with the value that leaves them off."""

SECTION_KINDS = {"convolutional": "convolutional", "conv": "convolutional", "maxpool": "maxpool", "max": "maxpool",
                 "upsample": "upsample", "shortcut": "shortcut", "route": "route", "yolo": "yolo",
                 "dropout": "dropout"}
"""Section name (as Darknet's string_to_layer_type spells it) -> kind."""

OTHER_DARKNET_SECTIONS = frozenset({
    "scale_channels", "sam", "crop", "cost", "detection", "region", "Gaussian_yolo", "local", "activation", "crnn",
    "gru", "lstm", "conv_lstm", "history", "rnn", "conn", "connected", "local_avg", "local_avgpool", "reorg3d",
    "reorg", "avg", "avgpool", "lrn", "normalization", "batchnorm", "soft", "softmax", "contrastive", "empty",
    "silence", "implicit"})
"""Darknet layer sections bigbatch does not build."""


# ----------------------------------------------------------------------------- reading one section


class _Section:
    """One section's options, read key by key with Darknet's defaults; remembers which keys were read."""

    def __init__(self, path: Path, section: KeyedSection, index: int) -> None:
        self.path, self.name, self.options, self.line = path, section.name, section.options, section.line
        self.key_lines = section.key_lines
        self.index = index
        self.read: set[str] = set()
        for key, lines in section.key_lines.items():
            if len(lines) > 1:
                raise self.error(key, f"given twice (lines {lines[0]} and {lines[1]}); Darknet reads the first, "
                                      "bigbatch refuses to guess: keep one", line=lines[1])

    def lines(self) -> dict[str, int]:
        return {key: lines[0] for key, lines in self.key_lines.items()}

    def error(self, key: str | None, what: str, line: int | None = None) -> UserError:
        line = line or (self.key_lines[key][0] if key in self.key_lines else self.line)
        name = f"[{self.name}] {key}" if key else f"[{self.name}]"
        return UserError(f"{self.path}:{line}: {name}: {what}")

    def has(self, key: str) -> bool:
        return key in self.options

    def text(self, key: str, default: str) -> str:
        self.read.add(key)
        return self.options.get(key, default)

    def integer(self, key: str, default: int, low: int | None = None, high: int | None = None) -> int:
        self.read.add(key)
        if key not in self.options:
            return default
        return self._integer(key, self.options[key], low, high)

    def _integer(self, key: str, value: str, low: int | None, high: int | None) -> int:
        number = parse_number(value, float)
        if number is None or not float(number).is_integer() or parse_number(str(int(number)), int) is None:
            raise self.error(key, f"expected {_range('an integer', low, high)}, not {value!r}")
        number = int(number)
        if (low is not None and number < low) or (high is not None and number > high):
            raise self.error(key, f"expected {_range('an integer', low, high)}, not {value!r}")
        return number

    def flag(self, key: str, default: bool = False) -> bool:
        return bool(self.integer(key, int(default), 0, 1))

    def number(self, key: str, default: float, low: float | None = None, high: float | None = None,
               above: float | None = None) -> float:
        self.read.add(key)
        if key not in self.options:
            return default
        return self._number(key, self.options[key], low, high, above)

    def _number(self, key: str, value: str, low: float | None, high: float | None, above: float | None) -> float:
        number = parse_number(value, float)
        ok = number is not None and (low is None or number >= low) and (high is None or number <= high) and (
            above is None or number > above)
        if not ok:
            what = f"a number > {above:g}" if above is not None else _range("a finite number", low, high)
            raise self.error(key, f"expected {what}, not {value!r}")
        return float(number)

    def choice(self, key: str, default: str, choices: Iterable[str]) -> str:
        value = self.text(key, default)
        choices = tuple(choices)
        if value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, not {value!r}")
        return value

    def items(self, key: str) -> list[str] | None:
        """The comma-separated items of ``key`` (None when absent); an empty item is an error."""
        self.read.add(key)
        if key not in self.options:
            return None
        items = [item.strip() for item in self.options[key].split(",")]
        if items and items[-1] == "" and len(items) > 1:  # a trailing comma, as Darknet's lists allow
            items.pop()
        if any(item == "" for item in items):
            raise self.error(key, f"expected comma-separated numbers, not {self.options[key]!r}")
        return items

    def integers(self, key: str, low: int | None = None, high: int | None = None) -> list[int] | None:
        items = self.items(key)
        return None if items is None else [self._integer(key, item, low, high) for item in items]

    def numbers(self, key: str, above: float | None = None) -> list[float] | None:
        items = self.items(key)
        return None if items is None else [self._number(key, item, None, None, above) for item in items]

    def activation(self, default: str) -> str:
        return self.choice("activation", default, ACTIVATIONS)

    def layer_indices(self, key: str) -> tuple[int, ...]:
        """``key``'s layer indices, relative ones resolved (``i < 0`` means ``index + i``): each must be a layer
        before this one."""
        values = self.integers(key)
        if not values:
            raise self.error(key, "missing: expected the indices of earlier layers (e.g. -1 or -1, 8)")
        found = []
        for value in values:
            absolute = self.index + value if value < 0 else value
            if not 0 <= absolute < self.index:
                raise self.error(key, f"{value} is layer {absolute}, not a layer before this one "
                                      f"(this is layer {self.index}; valid: -{self.index}..-1 or 0..{self.index - 1})")
            found.append(absolute)
        return tuple(found)

    def refuse(self, known: Mapping[str, str]) -> None:
        """Refuse a key of ``known`` set to other than its off value."""
        for key, off in known.items():
            if key in self.options:
                self.read.add(key)
                value = self.options[key]
                numeric = parse_number(off, float) is not None
                if (parse_number(value, float) != float(off)) if numeric else (value != off):
                    raise self.error(key, f"{value!r} is not supported by bigbatch (only {off})")

    def rest(self, kind: str, ignored: list[str]) -> None:
        """Check the keys not read: known to Darknet -> ``ignored``; else an error."""
        self.refuse(dict.fromkeys(LAYER_KEYS_REFUSED, "0"))
        for key in self.options:
            if key in self.read:
                continue
            if key in LAYER_KEYS_IGNORED or key in IGNORED[kind]:
                ignored.append(f"{self.name}:{key}")
                continue
            expected = sorted(self.read - LAYER_KEYS_REFUSED - set(REFUSED[kind]))
            raise self.error(key, f"unknown key (bigbatch reads: {', '.join(expected)})")


def _range(what: str, low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f"{what} between {low:g} and {high:g}"
    if low is not None:
        return f"{what} >= {low:g}"
    if high is not None:
        return f"{what} <= {high:g}"
    return what


# ----------------------------------------------------------------------------- one parser per kind


def _convolutional(s: _Section, common: dict[str, Any]) -> Convolutional:
    s.refuse(REFUSED["convolutional"])
    if s.has("share_index"):
        s.read.add("share_index")
        raise s.error("share_index", "shared weights are not supported by bigbatch")
    size = s.integer("size", 1, 1)
    stride = s.integer("stride", 1, 1)
    pad = s.integer("pad", 0, 0)
    padding = s.integer("padding", 0, 0)
    dilation = s.integer("dilation", 1, 1)
    return Convolutional(
        **common,
        filters=s.integer("filters", 1, 1),
        size=size,
        stride_x=s.integer("stride_x", stride, 1),
        stride_y=s.integer("stride_y", stride, 1),
        padding=size // 2 if pad else padding,  # parser.c: if(pad) padding = size/2;
        groups=s.integer("groups", 1, 1),
        dilation=1 if size == 1 else dilation,  # parser.c: if (size == 1) dilation = 1;
        batch_normalize=s.flag("batch_normalize"),
        activation=s.activation("logistic"),  # Darknet's default for a convolution
    )


def _maxpool(s: _Section, common: dict[str, Any]) -> MaxPool:
    s.refuse(REFUSED["maxpool"])
    stride = s.integer("stride", 1, 1)
    size = s.integer("size", stride, 1)
    return MaxPool(**common, size=size, stride_x=s.integer("stride_x", stride, 1),
                   stride_y=s.integer("stride_y", stride, 1), padding=s.integer("padding", size - 1, 0))


def _upsample(s: _Section, common: dict[str, Any]) -> Upsample:
    stride = s.integer("stride", 2)
    if stride < 1:
        raise s.error("stride", f"expected an integer >= 1 (a negative stride, Darknet's downsampling, is not "
                                f"supported), not {s.options['stride']!r}")
    return Upsample(**common, stride=stride, scale=s.number("scale", 1.0))


def _shortcut(s: _Section, common: dict[str, Any]) -> Shortcut:
    s.refuse(REFUSED["shortcut"])
    return Shortcut(**common, sources=s.layer_indices("from"), activation=s.activation("linear"),
                    alpha=s.number("alpha", 1.0), beta=s.number("beta", 1.0))


def _route(s: _Section, common: dict[str, Any]) -> Route:
    sources = s.layer_indices("layers")
    groups = s.integer("groups", 1, 1)
    return Route(**common, sources=sources, groups=groups, group_id=s.integer("group_id", 0, 0, groups - 1))


IOU_LOSSES = ("mse", "iou", "giou", "diou", "ciou")
IOU_THRESH_KINDS = ("iou", "giou", "diou", "ciou")
NMS_KINDS = ("default", "greedynms", "diounms", "cornersnms")


def _yolo(s: _Section, common: dict[str, Any]) -> Yolo:
    classes = s.integer("classes", 20, 1)
    num = s.integer("num", 1, 1)
    mask = s.integers("mask", 0)
    if mask is None:
        mask = list(range(num))  # make_yolo_layer: without a mask, every anchor
    elif any(m >= num for m in mask):
        raise s.error("mask", f"index {max(mask)} is not below num={num}")
    anchors = s.numbers("anchors", above=0)
    if anchors is None:
        raise s.error("anchors", f"missing: expected {2 * num} numbers, w,h for each of num={num} anchors")
    if len(anchors) != 2 * num:
        raise s.error("anchors", f"{len(anchors)} numbers, expected {2 * num} (w,h for each of num={num} anchors)")
    counters = s.integers("counters_per_class", 0)
    if counters is not None and len(counters) != classes:
        raise s.error("counters_per_class", f"{len(counters)} numbers, expected one per class (classes={classes})")
    return Yolo(
        **common,
        mask=tuple(mask),
        anchors=tuple(zip(anchors[::2], anchors[1::2], strict=True)),
        classes=classes,
        num=num,
        max_boxes=s.integer("max", 200, 1),
        jitter=s.number("jitter", 0.2, 0),
        resize=s.number("resize", 1.0, above=0),
        ignore_thresh=s.number("ignore_thresh", 0.5, 0),
        truth_thresh=s.number("truth_thresh", 1.0, 0),
        iou_thresh=s.number("iou_thresh", 1.0, 0),
        random=s.number("random", 0.0, 0),
        scale_x_y=s.number("scale_x_y", 1.0, above=0),
        iou_normalizer=s.number("iou_normalizer", 0.75, 0),
        obj_normalizer=s.number("obj_normalizer", 1.0, 0),
        cls_normalizer=s.number("cls_normalizer", 1.0, 0),
        delta_normalizer=s.number("delta_normalizer", 1.0, 0),
        iou_loss=s.choice("iou_loss", "mse", IOU_LOSSES),
        iou_thresh_kind=s.choice("iou_thresh_kind", "iou", IOU_THRESH_KINDS),
        nms_kind=s.choice("nms_kind", "default", NMS_KINDS),
        beta_nms=s.number("beta_nms", 0.6, 0),
        max_delta=s.number("max_delta", math.inf, above=0),
        counters_per_class=None if counters is None else tuple(counters),
        label_smooth_eps=s.number("label_smooth_eps", 0.0, 0, 1),
        new_coords=s.integer("new_coords", 0, 0, 1),
        objectness_smooth=s.integer("objectness_smooth", 0, 0, 1),
        focal_loss=s.integer("focal_loss", 0, 0, 1),
    )


def _dropout(s: _Section, common: dict[str, Any]) -> Dropout:
    s.refuse(REFUSED["dropout"])
    probability = s.number("probability", 0.2, 0)
    if probability >= 1:
        raise s.error("probability", f"expected a number in [0, 1), not {s.options['probability']!r}")
    return Dropout(**common, probability=probability)


PARSERS = {"convolutional": _convolutional, "maxpool": _maxpool, "upsample": _upsample, "shortcut": _shortcut,
           "route": _route, "yolo": _yolo, "dropout": _dropout}


# ----------------------------------------------------------------------------- the file


def _net_input(path: Path, section: KeyedSection, ignored: list[str]) -> NetInput:
    s = _Section(path, section, -1)
    for key in section.options:
        if key not in NET_KEYS:
            raise s.error(key, "unknown key (not one of Darknet's [net] keys)")
        if key not in NET_INPUT_KEYS and key not in NET_RECIPE_KEYS and key not in NET_AUGMENT_KEYS:
            ignored.append(f"{section.name}:{key}")
    width = s.integer("width", 0, 0)
    height = s.integer("height", 0, 0)
    channels = s.integer("channels", 0, 0)
    hue = s.number("hue", 0.0, 0, 0.5)
    saturation = s.number("saturation", 1.0, above=0)
    exposure = s.number("exposure", 1.0, above=0)
    flip = bool(s.integer("flip", 1, 0, 1))
    return NetInput(width or None, height or None, channels or None, section.line, s.lines(), hue, saturation,
                    exposure, flip)


def read_darknet_cfg(path: str | Path) -> DarknetCfg:
    """The ``.cfg`` at ``path`` as :class:`DarknetCfg`, every section and value checked (shapes aside).

    A mistake is one :class:`UserError` line ``"{path}:{line}: [section] key: what is wrong"``."""
    path = Path(path)
    sections = read_cfg_sections(path, prefix="")
    if not sections or sections[0].name not in ("net", "network"):
        raise UserError(f"{path}:{sections[0].line if sections else 1}: a Darknet .cfg starts with a [net] section")
    ignored: list[str] = []
    net = _net_input(path, sections[0], ignored)
    layers: list[LayerSpec] = []
    for index, section in enumerate(sections[1:]):
        if section.name in ("net", "network"):
            raise UserError(f"{path}:{section.line}: [{section.name}]: a second [net] section")
        kind = SECTION_KINDS.get(section.name)
        if kind is None:
            what = ("a Darknet layer bigbatch does not build" if section.name in OTHER_DARKNET_SECTIONS
                    else "unknown section")
            raise UserError(f"{path}:{section.line}: [{section.name}]: {what} (bigbatch builds: "
                            f"{', '.join(sorted(set(SECTION_KINDS.values())))})")
        s = _Section(path, section, index)
        common = {"index": index, "section": section.name, "line": section.line, "lines": s.lines()}
        layers.append(PARSERS[kind](s, common))
        s.rest(kind, ignored)
    if not layers:
        raise UserError(f"{path}:{sections[0].line}: [net]: the cfg has no layers after [net]")
    return DarknetCfg(path, net, tuple(layers), tuple(dict.fromkeys(ignored)))


def with_classes(cfg: DarknetCfg, classes: int) -> DarknetCfg:
    """``cfg`` for ``classes`` classes: each ``[yolo]`` gets ``classes``, and the convolution before it
    ``filters = len(mask) * (classes + 5)``. Each ``[yolo]`` must follow a ``[convolutional]``."""
    if classes < 1:
        raise UserError(f"classes: expected an integer >= 1, not {classes}")
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
