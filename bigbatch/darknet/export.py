"""``bigbatch export``: a Darknet network's weights, out of a run, a checkpoint or a ``.cfg``, as a Darknet
``.weights`` file and/or a checkpoint that ``model.weights`` reads.

    SOURCE = a run directory (its ``checkpoints/last.pt``) or a checkpoint: the network of the run's ``model.cfg``
             for the classes it was trained on, with the weights the run evaluates (the EMA's when the run keeps one
             and evaluates it, as ``bigbatch eval``); ``seen`` = steps x batch.
    SOURCE = a ``.cfg``: the network as written, freshly initialised as Darknet does (seeded, ``--seed``), or with
             ``--weights IN.weights`` (or a state dict) loaded: a conversion; ``seen`` from that file.

With ``--upto N`` the ``.weights`` file holds the first N layers (a ``.conv.N`` backbone) and ``seen`` 0, as
``darknet partial`` writes one, so that training from it starts at iteration 0.

Beside ``--darknet-weights OUT.weights`` goes ``OUT.cfg``, the network the weights are of (a run's cfg for the classes
it trained), so that Darknet loads the two together.

Nothing existing is overwritten: each output must be a new file. ``OUT.cfg`` may replace a cfg ``export`` wrote and
recorded as it wrote it (``floor/written.py``), unchanged since: its first line alone proves nothing (a cfg copied from
one bigbatch wrote and tuned by hand keeps it), so a cfg edited since, copied there or written by anything else is the
user's and is refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from bigbatch.errors import UserError


@dataclass
class Exported:
    network: torch.nn.Module
    seen: int
    """Images the weights were trained on (Darknet's ``seen``)."""
    origin: str
    """What the weights are, for the printed line."""


def classes_in(state: dict[str, torch.Tensor], cfg_path: str) -> int:
    """The classes a network's state dict was trained on: the filters of the convolution before its first ``[yolo]``
    are ``len(mask) * (classes + 5)``; a classifier's, the outputs of its last layer with weights before the
    ``[softmax]``."""
    from bigbatch.darknet import read_darknet_cfg
    from bigbatch.darknet.cfg import classifier_head
    from bigbatch.darknet.models import find_cfg

    cfg = read_darknet_cfg(find_cfg(cfg_path))
    head = classifier_head(cfg)
    if not cfg.yolo_layers and head is not None:
        last = next(layer for layer in reversed(cfg.layers[:head.index])
                    if layer.kind in ("convolutional", "connected"))
        key = f"layers.{last.index}.{'conv' if last.kind == 'convolutional' else 'linear'}.weight"
        if key not in state:
            raise UserError(f"SOURCE: the saved network has no {key}: it is not the network of {cfg_path}")
        return state[key].shape[0]
    yolo = cfg.yolo_layers[0]
    key = f"layers.{yolo.index - 1}.conv.weight"
    if key not in state:
        raise UserError(f"SOURCE: the saved network has no {key}: it is not the network of {cfg_path}")
    return state[key].shape[0] // len(yolo.mask) - 5


def from_checkpoint(path: Path) -> Exported:
    """The network of a bigbatch checkpoint (or a run directory's ``last.pt``) with the weights it evaluates."""
    from bigbatch.config import apply_overrides, validate_config
    from bigbatch.darknet.models import darknet_network, network_state
    from bigbatch.engine import checkpoint
    from bigbatch.engine.run_dir import kept_overrides, last_checkpoint, run_checkpoint, run_dir_of
    from bigbatch.largebatch.ema import counted_weights

    if path.is_dir():
        run_checkpoint(path, "export")  # a run's checkpoint is read only from inside it
        path = last_checkpoint(path)
    state = checkpoint.load(path, checkpoint.EVAL_KEYS)
    run_dir = run_dir_of(path)
    kept = kept_overrides(run_dir, state["config"]) if run_dir is not None else []  # the run's cfg, kept in it
    cfg = validate_config(apply_overrides(state["config"], kept))
    if cfg.model.name not in ("darknet", "darknet_classifier"):
        raise UserError(f"SOURCE: {path} holds a {cfg.model.name} model; export writes Darknet networks "
                        "(model.name: darknet or darknet_classifier) only")
    counted, use_ema = counted_weights(state, cfg)
    weights = network_state(counted)
    network = darknet_network(cfg.model.cfg, classes_in(weights, cfg.model.cfg), cfg.data.size)
    network.load_state_dict(weights)
    data = state.get("data")
    images = data.get("images") if isinstance(data, dict) else None  # images seen (a batch schedule's too)
    seen = images if isinstance(images, int) and not isinstance(images, bool) and images >= 0 else (
        int(state["step"]) * cfg.batch)
    return Exported(network, seen,
                    f"{'EMA' if use_ema else 'raw'} weights of {path} (step {state['step']})")


def from_cfg(path: Path, weights: Path | None, seed: int) -> Exported:
    """The network of a ``.cfg``: initialised as Darknet does under ``seed``, or loaded from ``weights``."""
    from bigbatch.darknet.models import darknet_network, load_darknet_weights

    torch.manual_seed(seed)
    network = darknet_network(str(path), key="SOURCE")
    if weights is None:
        return Exported(network, 0, f"{path}, freshly initialised (seed {seed})")
    seen = load_darknet_weights(network, weights, key="--weights")
    return Exported(network, seen, f"{path} with {weights}")


def is_exported_cfg(path: Path) -> bool:
    """Whether ``path`` is a cfg bigbatch wrote and recorded as it wrote it (``floor/written.py``: its path, inode,
    size, time and SHA-256), unchanged since, starting with the ``# kept by bigbatch:`` line. That line alone proves
    nothing: every cfg bigbatch writes starts with it, and so does a copy of one tuned by hand."""
    from bigbatch.darknet.cfg_edit import KEPT_CFG_MARK
    from bigbatch.floor import written
    from bigbatch.floor.user_files import open_regular

    if not written.is_ours(path):
        return False
    try:
        with open_regular(path, limit=2**63 - 1, what="a cfg") as f:  # its first bytes only: the size is no matter
            return f.read(len(KEPT_CFG_MARK)) == KEPT_CFG_MARK.encode()
    except OSError:
        return False


def export(source: Path, darknet_weights: Path | None, checkpoint_out: Path | None, weights: Path | None = None,
           seed: int = 0, upto: int | None = None) -> list[str]:
    """Write the outputs asked for; -> the lines to print. Every output is checked before anything is written."""
    from bigbatch.darknet import write_weights
    from bigbatch.darknet.cfg_edit import KEPT_CFG_MARK, cfg_text_of
    from bigbatch.floor.files import atomic_write
    from bigbatch.floor.outputs import check_output_file

    if darknet_weights is None and checkpoint_out is None:
        raise UserError("export: nothing to write; give --darknet-weights OUT.weights and/or --checkpoint OUT.pt")
    for key, out in (("--darknet-weights", darknet_weights), ("--checkpoint", checkpoint_out)):
        if out is not None:
            check_output_file(out, key)  # new, in a folder that exists and can be written
    # a whole network's .weights: its cfg beside (a backbone's .conv.N is loaded with the cfg of another network)
    cfg_out = None if darknet_weights is None or upto is not None else darknet_weights.with_suffix(".cfg")
    if cfg_out is not None:
        check_output_file(cfg_out, "--darknet-weights", ours=is_exported_cfg,
                          what=f"the network's cfg goes beside {darknet_weights.name}; it is not a cfg bigbatch "
                               "export wrote, unchanged since (a cfg edited since, copied, or written by anything "
                               "else is yours): not overwritten (choose another name, or move the file away)")
    if upto is not None and darknet_weights is None:
        raise UserError("--upto: writes the first layers of --darknet-weights; give --darknet-weights OUT")
    def same(a: Path | None, b: Path | None) -> bool:  # by absolute path: ./x and /abs/x are one file
        return a is not None and b is not None and os.path.abspath(a) == os.path.abspath(b)

    if same(darknet_weights, cfg_out):
        raise UserError(f"--darknet-weights: {darknet_weights} ends in .cfg, the name of the network's cfg written "
                        "beside the weights; give the weights a name of their own (NAME.weights)")
    if same(checkpoint_out, darknet_weights) or same(checkpoint_out, cfg_out):
        which = "--darknet-weights" if same(checkpoint_out, darknet_weights) else "the cfg written beside the weights"
        raise UserError(f"--checkpoint: {checkpoint_out} is also {which}; give each output a file of its own")
    if not source.exists():
        raise UserError(f"SOURCE: {source} does not exist (expected a run directory, a checkpoint or a .cfg)")
    if source.suffix == ".cfg":
        exported = from_cfg(source, weights, seed)
    elif weights is not None:
        raise UserError("--weights: loads weights into a .cfg SOURCE; a run or checkpoint has its own")
    else:
        exported = from_checkpoint(source)
    lines = [f"network: {exported.origin}"]
    if darknet_weights is not None:
        # a backbone's seen is 0, as Darknet's partial() sets *net.seen = 0 (src/darknet.c): training from it starts
        # at iteration 0, burn-in included
        seen = exported.seen if upto is None else 0
        write_weights(exported.network, darknet_weights, seen, upto=upto)
        part = f", as Darknet's partial writes it; the first {upto} layers" if upto is not None else ""
        lines.append(f"Darknet weights written to {darknet_weights} ({darknet_weights.stat().st_size:,} bytes, "
                     f"seen {seen:,}{part})")
    if cfg_out is not None:
        header = (f"{KEPT_CFG_MARK} the network of {darknet_weights.name}, written by bigbatch export from "
                  f"{exported.network.cfg.path}")
        text = cfg_text_of(exported.network.cfg, header)
        atomic_write(cfg_out, lambda f: f.write(text), mode="w", record=True)  # the proof a later export may replace
        lines.append(f"its network written to {cfg_out} (Darknet: darknet detector test DATA {cfg_out.name} "
                     f"{darknet_weights.name})" if exported.network.cfg.yolo_layers else
                     f"its network written to {cfg_out}")
    if checkpoint_out is not None:
        state = {"model": exported.network.state_dict(), "darknet_cfg": str(exported.network.cfg.path),
                 "seen": exported.seen}
        atomic_write(checkpoint_out, lambda f: torch.save(state, f))
        lines.append(f"checkpoint written to {checkpoint_out} (for model.weights)")
    return lines
