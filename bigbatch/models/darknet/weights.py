"""Darknet ``.weights`` files: read into a :class:`DarknetNetwork`, and written byte-compatible.

The layout (``load_weights_upto``/``save_weights_upto`` in src/parser.c, pjreddie and AlexeyAB), little-endian:

    int32 major, minor, revision
    seen: uint64 if major * 10 + minor >= 2 and major < 1000 and minor < 1000, else int32   (images trained on)
    then float32 values, for each [convolutional] layer in order:
        biases[n]                                   (the BN shift when batch_normalize)
        scales[n], rolling_mean[n], rolling_variance[n]     (only when batch_normalize)
        weights[n * c / groups * size * size]       (OIHW, torch's Conv2d layout)

A file's size is therefore fixed by the cfg: ``20 + 4 * values`` bytes (16 with a 32-bit ``seen``); any other size
is refused with both sizes. Written files carry major 0, minor 2, revision 5 (Darknet's own) and a 64-bit ``seen``.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import torch

from bigbatch.engine.checkpoint import atomic_write
from bigbatch.errors import UserError
from bigbatch.models.darknet.network import DarknetNetwork

VERSION = (0, 2, 5)
"""(major, minor, revision) written, as Darknet writes them."""
HEADER_BYTES = 20
"""Three int32 and a uint64 ``seen``."""


def weight_tensors(network: DarknetNetwork) -> list[torch.Tensor]:
    """The tensors a ``.weights`` file holds, in the file's order."""
    tensors: list[torch.Tensor] = []
    for block in network.conv_blocks():
        if block.bn is not None:
            tensors += [block.bn.bias, block.bn.weight, block.bn.running_mean, block.bn.running_var]
        else:
            assert block.conv.bias is not None
            tensors.append(block.conv.bias)
        tensors.append(block.conv.weight)
    return tensors


def weights_size(network: DarknetNetwork) -> int:
    """The size in bytes of ``network``'s ``.weights`` file (20-byte header)."""
    return HEADER_BYTES + 4 * sum(t.numel() for t in weight_tensors(network))


def _wrong_size(path: Path, network: DarknetNetwork, header: int, size: int) -> UserError:
    values = sum(t.numel() for t in weight_tensors(network))
    expected = header + 4 * values
    return UserError(f"{path}: expected {expected:,} bytes for {network.cfg.path} ({header}-byte header + "
                     f"{values:,} float32 values), got {size:,} bytes")


def read_weights(network: DarknetNetwork, path: str | Path) -> int:
    """Load the ``.weights`` file at ``path`` into ``network`` (parameters and BN running statistics, bit for bit);
    -> ``seen``, the number of images it was trained on."""
    path = Path(path)
    tensors = weight_tensors(network)
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            if size < 12:
                raise _wrong_size(path, network, HEADER_BYTES, size)
            major, minor, _revision = struct.unpack("<3i", f.read(12))
            wide = major * 10 + minor >= 2 and major < 1000 and minor < 1000
            header = HEADER_BYTES if wide else 16
            if size != header + 4 * sum(t.numel() for t in tensors):
                raise _wrong_size(path, network, header, size)
            (seen,) = struct.unpack("<Q" if wide else "<i", f.read(header - 12))
            values = np.fromfile(f, dtype="<f4")
    except OSError as e:
        raise UserError(f"{path}: cannot read: {e.strerror}") from None
    offset = 0
    with torch.no_grad():
        for tensor in tensors:
            count = tensor.numel()
            tensor.copy_(torch.from_numpy(values[offset:offset + count]).view(tensor.shape))
            offset += count
    return int(seen)


def write_weights(network: DarknetNetwork, path: str | Path, seen: int = 0, overwrite: bool = False) -> None:
    """Write ``network`` as a Darknet ``.weights`` file at ``path``, atomically (a temporary file in the same folder,
    then renamed); an existing ``path`` is refused unless ``overwrite``. ``seen``: images trained on."""
    path = Path(path)
    if not 0 <= seen < 2**64:
        raise ValueError(f"seen: expected an integer in [0, 2**64), got {seen}")
    if path.exists() and not overwrite:
        raise UserError(f"{path}: exists; not overwritten (ask for overwrite to replace it)")
    if not path.parent.is_dir():
        raise UserError(f"{path}: the folder {path.parent} does not exist")
    tensors = weight_tensors(network)

    def write(f) -> None:
        f.write(struct.pack("<3iQ", *VERSION, seen))
        for tensor in tensors:
            f.write(tensor.detach().to("cpu", torch.float32).contiguous().numpy().astype("<f4", copy=False)
                    .tobytes())

    atomic_write(path, write)
