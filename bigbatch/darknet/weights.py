"""Darknet ``.weights`` files: read into a :class:`DarknetNetwork`, and written byte-compatible.

The layout (``load_weights_upto``/``save_weights_upto`` in src/parser.c, pjreddie and AlexeyAB), little-endian:

    int32 major, minor, revision
    seen (images trained on): uint64 if major * 10 + minor >= 2, else uint32          (AlexeyAB, the default)
                              uint64 if that and major < 1000 and minor < 1000, else int32    (pjreddie)
    then float32 values, for each layer with weights in order, as its kind saves them (its module's
    ``darknet_tensors``, in ``layers/``); a [convolutional] layer:
        biases[n]                                   (the BN shift when batch_normalize)
        scales[n], rolling_mean[n], rolling_variance[n]     (only when batch_normalize)
        weights[n * c / groups * size * size]       (OIHW, torch's Conv2d layout)

A file's size is therefore fixed by the cfg: ``20 + 4 * values`` bytes (16 with a 32-bit ``seen``); any other size
is refused with both sizes, before anything is read, so that memory never exceeds the network's own size whatever
the file holds. Only a regular file is read (not a FIFO, which would block, nor a device such as ``/dev/zero``).

The header is read by the rule of one fork's ``load_weights_upto``, the ``dialect`` of :func:`read_weights`
(``alexeyab`` by default, bigbatch's default dialect, which its commands read every file with; ``gradient`` reads as
``alexeyab``): AlexeyAB's reads a 64-bit
``seen`` whenever ``major * 10 + minor >= 2`` and a 32-bit one as a ``uint32_t``; pjreddie's adds ``major < 1000 &&
minor < 1000`` to the test and reads a 32-bit one as an ``int`` stored into its ``size_t`` (a negative value wraps
modulo 2**64). ``major * 10 + minor`` is computed in C ``int``s, wrapping at 32 bits as they do on the machines Darknet
runs on. The values themselves are taken as they are, NaN and infinity included, as Darknet takes them. Written files
carry major 0, minor 2, revision 5 (Darknet's own) and a 64-bit ``seen``.
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from shlex import quote
from typing import BinaryIO

import numpy as np
import torch

from bigbatch.darknet.network import DarknetNetwork
from bigbatch.darknet.spec import DarknetCfg
from bigbatch.errors import UserError
from bigbatch.floor.files import atomic_write

VERSION = (0, 2, 5)
"""(major, minor, revision) written, as Darknet writes them."""
HEADER_BYTES = 20
"""Three int32 and a uint64 ``seen``."""


def named_weight_tensors(network: DarknetNetwork) -> list[tuple[int, str, torch.Tensor]]:
    """(layer index, Darknet's name, tensor) of every tensor a ``.weights`` file holds, in the file's order: each
    layer module's ``darknet_tensors()``, layer by layer."""
    return [(index, name, tensor) for index, layer in enumerate(network.layers)
            if hasattr(layer, "darknet_tensors") for name, tensor in layer.darknet_tensors()]


def weight_tensors(network: DarknetNetwork) -> list[torch.Tensor]:
    """The tensors a ``.weights`` file holds, in the file's order."""
    return [tensor for _, _, tensor in named_weight_tensors(network)]


def weights_size(network: DarknetNetwork) -> int:
    """The size in bytes of ``network``'s ``.weights`` file (20-byte header)."""
    return HEADER_BYTES + 4 * sum(t.numel() for t in weight_tensors(network))


def _wrong_size(path: Path, network: DarknetNetwork, header: int, size: int,
                boundaries: dict[int, int] | None = None) -> UserError:
    """The size mismatch, with what would fit: a file of the first layers only (``boundaries``: a ``.conv.N``, as
    ``export --upto N`` and ``darknet partial`` write it), and, for a file larger than the network, how to keep the
    layers that do not depend on the classes of the network it was trained as."""
    values = sum(t.numel() for t in weight_tensors(network))
    expected = header + 4 * values
    text = (f"{path}: {size:,} bytes, but the network of {network.cfg.path} takes {expected:,} ({header}-byte "
            f"header + {values:,} float32 values)")
    if boundaries and size < expected:
        sizes = sorted(header + 4 * n for n in boundaries if 0 < n < values)  # the whole network's is said above
        near = [b for b in sizes if b < size][-1:] + [b for b in sizes if b > size][:1]
        if near:
            text += ("; a file of its first N layers only (what export --upto N and Darknet's partial write) would "
                     "be " + " or ".join(f"{b:,} bytes (--upto {boundaries[(b - header) // 4]})" for b in near))
    upto = class_free_layers(network.cfg)
    if size > expected and upto:
        beside = path.with_suffix(".cfg")  # the cfg export writes beside its .weights, or the user's of that name
        its = str(beside) if beside.is_file() else "ITS.cfg"
        backbone = path.with_name(f"{path.stem}.conv.{upto}")
        text += (f"; larger than the whole network: the weights of another network, or of this one for another "
                 f"number of classes: keep the first {upto} layers, which do not depend on the classes, with "
                 f"`bigbatch export {quote(its)} --weights {quote(str(path))} --upto {upto} --darknet-weights "
                 f"{quote(str(backbone))}`")
    return UserError(text)


def class_free_layers(cfg: DarknetCfg) -> int:
    """How many layers come before the first whose weights depend on the class count (the convolution before the
    first ``[yolo]``; a classifier's last layer with weights before its ``[softmax]``): 0 when none does."""
    from bigbatch.darknet.cfg import classifier_head

    if cfg.yolo_layers:
        return min(yolo.index for yolo in cfg.yolo_layers) - 1
    head = classifier_head(cfg)
    if head is None:
        return 0
    last = next((layer for layer in reversed(cfg.layers[:head.index]) if layer.kind in ("convolutional", "connected")),
                None)
    return 0 if last is None else last.index


DIALECTS = ("alexeyab", "pjreddie", "gradient")
"""The ``model.darknet_dialect`` values a header is read under; ``gradient`` is AlexeyAB's Darknet's."""


def _c_int(value: int) -> int:
    """``value`` as a 32-bit C ``int`` holds it (two's complement: wrapping modulo 2**32)."""
    return (value + 2**31) % 2**32 - 2**31


def header_bytes(major: int, minor: int, dialect: str = "alexeyab") -> int:
    """The header's size for a file of version ``major.minor`` under ``dialect``: 20 bytes (a uint64 ``seen``) when
    ``major * 10 + minor >= 2`` (AlexeyAB's ``load_weights_upto``, src/parser.c), and also ``major < 1000 and
    minor < 1000`` (pjreddie's), else 16 (a 32-bit ``seen``). ``major * 10 + minor`` wraps as a C ``int``."""
    if dialect not in DIALECTS:
        raise ValueError(f"dialect: expected one of {', '.join(DIALECTS)}, got {dialect!r}")
    wide = _c_int(_c_int(major * 10) + minor) >= 2
    if dialect == "pjreddie":
        wide = wide and major < 1000 and minor < 1000
    return HEADER_BYTES if wide else 16


def layer_boundaries(network: DarknetNetwork) -> dict[int, int]:
    """Values in a file of the first ``n`` layers -> the largest such ``n`` (``darknet partial``'s cutoff; layers
    without weights add nothing, so several cutoffs share a count)."""
    per_layer = [0] * len(network.layers)
    for index, _, tensor in named_weight_tensors(network):
        per_layer[index] += tensor.numel()
    boundaries, total = {0: 0}, 0
    for index, values in enumerate(per_layer):
        total += values
        boundaries[total] = index + 1
    return boundaries


def read_weights(network: DarknetNetwork, path: str | Path, dialect: str = "alexeyab") -> int:
    """Load the ``.weights`` file at ``path`` into ``network`` (parameters and BN running statistics, bit for bit);
    -> ``seen``, the number of images it was trained on, its header read as the Darknet of ``dialect`` reads it (the
    module docstring). A file that is not a regular file, or whose size does not fit ``network``, is one
    ``UserError`` and ``network`` is left as it was."""
    return read_weights_upto(network, path, partial=False, dialect=dialect)[0]


def read_weights_upto(network: DarknetNetwork, path: str | Path, partial: bool = True,
                      first_layers: int | None = None, dialect: str = "alexeyab") -> tuple[int, int]:
    """:func:`read_weights`, also from a file of the first layers only (``partial``), as Darknet's
    ``load_weights_upto`` reads a ``.conv.N`` backbone file that ``darknet partial`` wrote: its size must be the
    header plus the values of the first ``n`` layers, and those layers are loaded, the others left as they are.
    ``first_layers``: load only the first ``first_layers`` layers from a file that holds at least their values (and
    more: another network's, whose first layers are these). -> (``seen``, ``n``: the layers loaded, all of them for a
    whole file). ``dialect``: whose rule reads the header (:func:`header_bytes`)."""
    header_bytes(0, 2, dialect)  # validates the dialect
    path = Path(path)
    tensors = weight_tensors(network)
    count = sum(t.numel() for t in tensors)
    boundaries = layer_boundaries(network) if partial else {count: len(network.layers)}
    if first_layers is not None:
        count = sum(t.numel() for index, _, t in named_weight_tensors(network) if index < first_layers)
    try:
        # O_NONBLOCK: opening a FIFO does not wait for a writer; it is then refused as not a regular file
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
    except ValueError:  # a NUL character in the path
        raise UserError(f"{str(path)!r}: not a valid file name (a NUL character)") from None
    try:
        info = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(info.st_mode):  # a folder, FIFO, socket or device: never read
        os.close(fd)
        raise UserError(f"{path}: not a regular file (expected a Darknet .weights file)")
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            size = info.st_size
            if size < 12:
                raise _wrong_size(path, network, HEADER_BYTES, size)
            major, minor, _revision = struct.unpack("<3i", _read_exactly(f, 12, path))
            header = header_bytes(major, minor, dialect)
            if (major > 1000 or minor > 1000) and any(layer.kind == "connected" for layer in network.cfg.layers):
                raise UserError(f"{path}: version {major}.{minor}: an old file whose [connected] weights Darknet "
                                "transposes on load; not supported by bigbatch")
            values_in_file, remainder = divmod(size - header, 4)
            if first_layers is not None:
                if values_in_file < count:
                    raise _wrong_size(path, network, header, size, boundaries if partial else None)
                layers = first_layers
            elif remainder or values_in_file not in boundaries or (values_in_file == 0 and count):
                raise _wrong_size(path, network, header, size, boundaries if partial else None)
            else:
                count, layers = values_in_file, boundaries[values_in_file]
            # a 32-bit seen: AlexeyAB's is a uint32_t; pjreddie's an int stored into its size_t (-1 is 2**64 - 1)
            narrow = "<i" if dialect == "pjreddie" else "<I"
            (seen,) = struct.unpack("<Q" if header == HEADER_BYTES else narrow, _read_exactly(f, header - 12, path))
            values = np.empty(count, dtype="<f4")
            _read_exactly(f, 4 * count, path, into=memoryview(values).cast("B"))
            if first_layers is None and f.read(1):
                raise UserError(f"{path}: changed while it was read (longer than its {size:,} bytes)")
        except OSError as e:
            raise UserError(f"{path}: cannot read: {e.strerror or e}") from None
    offset = 0
    with torch.no_grad():
        for tensor in tensors:
            n = tensor.numel()
            if offset + n > count:
                break
            tensor.copy_(torch.from_numpy(values[offset:offset + n]).view(tensor.shape))
            offset += n
    return int(seen) % 2**64, layers


def _read_exactly(f: BinaryIO, n: int, path: Path, into: memoryview | None = None) -> bytes | None:
    """``n`` bytes of ``f`` (into the buffer ``into`` when given: ``n`` is its size), read in as many calls as the
    system needs (one ``read`` returns at most about 2 GiB on Linux); fewer (the file shrank since its size was read)
    is a ``UserError``."""
    buffer = memoryview(bytearray(n)) if into is None else into
    done = 0
    while done < n:
        got = f.readinto(buffer[done:])
        if not got:
            raise UserError(f"{path}: changed while it was read (ended {n - done:,} bytes early)")
        done += got
    return bytes(buffer) if into is None else None


def write_weights(network: DarknetNetwork, path: str | Path, seen: int = 0, overwrite: bool = False,
                  upto: int | None = None) -> None:
    """Write ``network`` as a Darknet ``.weights`` file at ``path``, atomically (a temporary file in the same folder,
    then renamed); an existing ``path`` is refused unless ``overwrite``. ``seen``: images trained on. ``upto``: only
    the layers before it, as ``darknet partial cfg weights out upto`` writes a backbone."""
    path = Path(path)
    if not 0 <= seen < 2**64:
        raise ValueError(f"seen: expected an integer in [0, 2**64), got {seen}")
    if path.exists() and not overwrite:
        raise UserError(f"{path}: exists; not overwritten (ask for overwrite to replace it)")
    if not path.parent.is_dir():
        raise UserError(f"{path}: the folder {path.parent} does not exist")
    if upto is not None and not 0 <= upto <= len(network.layers):
        raise UserError(f"--upto: expected a layer count in [0, {len(network.layers)}], not {upto}")
    tensors = [t for index, _, t in named_weight_tensors(network) if upto is None or index < upto]

    def write(f) -> None:
        f.write(struct.pack("<3iQ", *VERSION, seen))
        for tensor in tensors:
            f.write(tensor.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
                    .tobytes())

    atomic_write(path, write)
