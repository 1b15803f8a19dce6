"""A Darknet cfg's freezing keys (``bigbatch/darknet/freeze.py``), read as AlexeyAB's GPU build reads them: the
groups each key gives, off cfg text; and short trainings in which every tensor a key freezes stays bit-identical (and
its BatchNorm running statistics, where Darknet runs the layer as in inference) up to the step Darknet's source says,
and moves from that step on, while the others train; a run resumed across the end of a freeze ends bit-identical to
an uninterrupted one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bigbatch.config import load_config
from bigbatch.darknet import DarknetNetwork, ignored_keys, read_darknet_cfg
from bigbatch.darknet.freeze import darknet_groups
from bigbatch.darknet.models import DarknetClassifier
from bigbatch.engine.hooks import Hook
from bigbatch.engine.step import unwrap
from bigbatch.engine.trainer import train
from bigbatch.errors import UserError
from bigbatch.largebatch.freeze import FrozenGroup, frozen_groups
from bigbatch.registry import MODELS
from tests.helpers import net_header, run_main, write_shapes_set

# ----------------------------------------------------------------------------- the groups, off cfg text

CLASSIFIER = [  # layer: section text; {key} where a test puts its keys
    "[convolutional]\nbatch_normalize=1\nfilters=4\nsize=3\nstride=1\npad=1\nactivation=leaky\n",
    "[convolutional]\nbatch_normalize=1\nfilters=4\nsize=3\nstride=1\npad=1\nactivation=leaky\n",
    "[maxpool]\nsize=2\nstride=2\n",
    "[connected]\nbatch_normalize=1\noutput=6\nactivation=leaky\n",
    "[connected]\noutput=3\nactivation=linear\n",
    "[softmax]\n",
]
"""Two convolutions with BatchNorm, a maxpool (no parameters), a connected layer with BatchNorm, one without."""


def classifier(tmp_path: Path, keys: dict[int, str], net: str = "") -> DarknetClassifier:
    """The network of :data:`CLASSIFIER` in ``tmp_path/net.cfg``, ``keys[i]`` added to layer i and ``net`` to
    ``[net]``, as a run's model."""
    text = net_header(8, 8, 3) + net + "".join(
        f"\n{section}{keys.get(i, '')}\n" for i, section in enumerate(CLASSIFIER))
    path = tmp_path / "net.cfg"
    path.write_text(text)
    return DarknetClassifier(DarknetNetwork(read_darknet_cfg(path)))


def of_layers(model: DarknetClassifier, *layers: int) -> tuple[str, ...]:
    return tuple(name for name, _ in model.named_parameters() if int(name.split(".")[2]) in layers)


@pytest.mark.fast
def test_stopbackward_1_freezes_its_layer_and_those_before_it_the_convolutions_before_it_as_in_inference(tmp_path):
    """parser.c builds the layers before the last ``stopbackward=1`` with train=0 (no update; a convolution's forward
    as in inference), backward_network_gpu stops at the layer itself; a [connected] layer's BatchNorm does not look
    at l.train; an earlier stopbackward=1 changes nothing."""
    model = classifier(tmp_path, {1: "stopbackward=1", 3: "stopbackward=1"})
    assert darknet_groups(model, 0) == [FrozenGroup(
        ("network.layers.0.conv.weight", "network.layers.0.bn.weight", "network.layers.0.bn.bias",
         "network.layers.1.conv.weight", "network.layers.1.bn.weight", "network.layers.1.bn.bias",
         "network.layers.3.linear.weight", "network.layers.3.bn.weight", "network.layers.3.bn.bias"),
        ("network.layers.0", "network.layers.1"), None, "stopbackward=1 at layer 3: layers 0-3")]


@pytest.mark.fast
@pytest.mark.parametrize("keys, burn_in, expected", [
    # stopbackward=N > 1: the layers up to it, its own included, before step N; BatchNorm trains
    ({1: "stopbackward=900"}, 0, [((0, 1), 900, "stopbackward=900 at layer 1: layers 0-1")]),
    ({1: "stopbackward=5", 3: "stopbackward=2"}, 0,
     [((0, 1), 5, "stopbackward=5 at layer 1: layers 0-1"), ((0, 1, 3), 2, "stopbackward=2 at layer 3: layers 0-3")]),
    # train_only_bn: every layer up to the last that has it, every parameter, for the whole run; BatchNorm trains
    ({0: "train_only_bn=1", 3: "train_only_bn=1"}, 0,
     [((0, 1, 3), None, "train_only_bn=1 at layer 3: layers 0-3; their BatchNorm running statistics still move")]),
    # dont_update=N: the layer alone, before step N (updated once N < iteration_num = step + 1)
    ({3: "dont_update=4"}, 0, [((3,), 4, "dont_update=4 at layer 3")]),
    # burnin_update=M: the layer alone while M * burn_in > step + 1
    ({1: "burnin_update=2"}, 3, [((1,), 5, "burnin_update=2 at layer 1 (x burn_in 3)")]),
    ({1: "burnin_update=1"}, 1, []),  # 1 * 1 > step + 1 never holds
    ({1: "burnin_update=3"}, 0, []),  # no burn-in
    # keys on a layer without parameters, and zeros, freeze nothing
    ({2: "dont_update=10\nburnin_update=2\nstopbackward=0\ntrain_only_bn=0"}, 100, []),
    ({0: "stopbackward=3", 1: "dont_update=3", 3: "stopbackward=1"}, 0,
     [((0, 1, 3), None, "stopbackward=1 at layer 3: layers 0-3"), ((0,), 3, "stopbackward=3 at layer 0: layers 0-0"),
      ((1,), 3, "dont_update=3 at layer 1")]),
])
def test_the_groups_of_each_key(tmp_path, keys, burn_in, expected):
    model = classifier(tmp_path, keys)
    groups = darknet_groups(model, burn_in)
    assert [(g.names, g.until, g.reason) for g in groups] == [
        (of_layers(model, *layers), until, reason) for layers, until, reason in expected]
    if not any("stopbackward=1 " in reason for *_, reason in expected):
        assert all(g.modules == () for g in groups)  # these keys leave BatchNorm in training mode


@pytest.mark.fast
@pytest.mark.parametrize("dialect", ["alexeyab", "pjreddie", "gradient"])
def test_both_darknet_families_freeze_with_the_runs_burn_in_in_every_dialect(tmp_path, dialect):
    """``largebatch.freeze.frozen_groups`` takes the family's groups (MODELS' ``frozen_groups``) beside
    ``model.freeze``; ``burnin_update`` counts the Darknet schedule's burn_in (``[net] burn_in`` for a .cfg run,
    as the LR burns in), or under another schedule the cfg's ``[net] burn_in``; the dialect changes nothing."""
    assert MODELS.get("darknet").info.frozen_groups is MODELS.get("darknet_classifier").info.frozen_groups
    model = classifier(tmp_path, {3: "burnin_update=2"}, net="burn_in=6\n")
    path = tmp_path / "net.cfg"
    common = [f"model.darknet_dialect={dialect}", "model.freeze=1"]
    for overrides, until in (([], 11), (["schedule.darknet.burn_in=4"], 7),
                             (["schedule.preset=none", "schedule.darknet.burn_in=4"], 11)):
        cfg = load_config(str(path), [*common, *overrides])
        assert cfg.model.name == "darknet_classifier"
        assert frozen_groups(model, cfg, None) == [
            FrozenGroup(of_layers(model, 0), ("network.layers.0",), None, "model.freeze: 1"),
            FrozenGroup(of_layers(model, 3), (), until, "burnin_update=2 at layer 3 (x burn_in "
                                                          f"{(until + 1) // 2})")]


@pytest.mark.fast
def test_the_keys_are_read_strictly_and_no_longer_listed_as_ignored(tmp_path):
    text = net_header(8, 8, 3) + "".join(f"\n{section}\n" for section in CLASSIFIER)
    keys = "stopbackward=1\ntrain_only_bn=1\ndont_update=3\nburnin_update=2\nstream=1\n"
    path = tmp_path / "net.cfg"
    path.write_text(text.replace("[maxpool]\n", "[maxpool]\n" + keys))
    cfg = read_darknet_cfg(path)
    assert ignored_keys(cfg) == ["maxpool:stream"] and not cfg.warnings
    pool = cfg.layers[2]
    assert (pool.stopbackward, pool.train_only_bn, pool.dont_update, pool.burnin_update) == (1, True, 3, 2)
    line = text.split("\n").index("[maxpool]") + 2
    for key, value, expected in (("stopbackward", "-1", "an integer >= 0"), ("dont_update", "2.5", "an integer"),
                                 ("burnin_update", "x", "an integer >= 0"),
                                 ("train_only_bn", "2", "an integer between 0 and 1")):
        path.write_text(text.replace("[maxpool]\n", f"[maxpool]\n{key}={value}\n"))
        with pytest.raises(UserError) as error:
            read_darknet_cfg(path)
        assert str(error.value).startswith(f"{path}:{line}: [maxpool] {key}: expected {expected}"), str(error.value)


# ----------------------------------------------------------------------------- trained: what moves, from when

CONV = "\n[convolutional]\nbatch_normalize=1\nfilters={filters}\nsize=3\nstride={stride}\npad=1\nactivation=leaky\n"
HEAD = ("\n[convolutional]\nsize=1\nstride=1\npad=1\nfilters=30\nactivation=linear\n"
        "\n[yolo]\nmask=0,1,2\nanchors=4,4, 8,8, 16,16\nclasses=5\nnum=3\n")
RUN = ["data.workers=0", "log.tensorboard=false", "eval.every=100", "eval.batch=50", "checkpoint.every=100"]


def detector_cfg(path: Path, keys: dict[int, str], burn_in: int = 0) -> Path:
    """Four convolutions with BatchNorm (layers 0..3) and a YOLO head (4, 5) at 32 px, batch 4, SGD at a constant
    0.01 after ``burn_in``; ``keys[i]``: lines added to layer i."""
    text = net_header(32, 32, 3).replace("batch=1", "batch=4\nsubdivisions=1") + (
        f"learning_rate=0.01\nmomentum=0.9\ndecay=0.0005\nburn_in={burn_in}\npolicy=constant\n")
    for i, (filters, stride) in enumerate(((4, 2), (8, 2), (8, 1), (8, 1))):
        text += CONV.format(filters=filters, stride=stride) + keys.get(i, "")
    path.write_text(text + HEAD)
    return path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    return write_shapes_set(tmp_path_factory.mktemp("shapes") / "set", 20)


class Snapshots(Hook):
    """The model's state dict (parameters and BatchNorm buffers) before the first step and after each step:
    ``states[k]`` is after k steps."""

    stage = "write"

    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []

    def _take(self, run) -> None:
        self.states.append({k: v.detach().clone() for k, v in unwrap(run.model).state_dict().items()})

    def before_train(self, run) -> None:
        self._take(run)

    def after_step(self, run) -> None:
        self._take(run)


def trained(shapes: Path, tmp_path: Path, keys: dict[int, str], steps: int, burn_in: int = 0) -> Snapshots:
    cfg = load_config(str(detector_cfg(tmp_path / "net.cfg", keys, burn_in)),
                      [f"data.path={shapes}", *RUN, f"steps={steps}"])
    snapshots = Snapshots()
    train(cfg, tmp_path / "run", hooks=[snapshots])
    assert len(snapshots.states) == steps + 1
    return snapshots


PARAMETERS = ("conv.weight", "bn.weight", "bn.bias")
STATISTICS = ("bn.running_mean", "bn.running_var")


def frozen_steps(states: list[dict[str, torch.Tensor]], layer: int, what: tuple[str, ...]) -> int:
    """The first steps in which none of the tensors ``what`` of ``layer`` moved (bit for bit), the same for each;
    checked: from then on every step moves each of them."""
    found = {}
    for suffix in what:
        key = f"network.layers.{layer}.{suffix}"
        moved = [not torch.equal(a[key], b[key]) for a, b in zip(states[:-1], states[1:], strict=True)]  # by step k
        found[key] = moved.index(True) if True in moved else len(moved)
        assert all(moved[found[key]:]), (key, "stopped moving", moved)
    assert len(set(found.values())) == 1, found
    return found[key]


def test_stopbackward_1_and_dont_update_train_from_the_step_darknets_source_says(shapes, tmp_path):
    """stopbackward=1 at layer 1: layers 0 and 1 never move, and layer 0's BatchNorm statistics neither (a
    convolution before it runs as in inference), layer 1's do (train=1); dont_update=3 at layer 2: its parameters
    move from step 3 on (the fourth step), its statistics from the first; layers 3 and 4 train from the first step."""
    states = trained(shapes, tmp_path, {1: "stopbackward=1\n", 2: "dont_update=3\n"}, steps=5).states
    assert frozen_steps(states, 0, PARAMETERS + STATISTICS) == 5
    assert frozen_steps(states, 1, PARAMETERS) == 5
    assert frozen_steps(states, 1, STATISTICS) == 0
    assert frozen_steps(states, 2, PARAMETERS) == 3
    assert frozen_steps(states, 2, STATISTICS) == 0
    assert frozen_steps(states, 3, PARAMETERS + STATISTICS) == 0
    assert frozen_steps(states, 4, ("conv.weight", "conv.bias")) == 0


def test_stopbackward_n_and_burnin_update_freeze_until_their_iteration(shapes, tmp_path):
    """stopbackward=2 at layer 1: layers 0 and 1 (the key's own included) get no gradient in steps 0 and 1
    (``l.stopbackward > get_current_iteration``), their BatchNorm statistics move all along; burnin_update=2 with
    burn_in=3 at layer 3: frozen while 2 * 3 > step + 1, so its first update is step 5."""
    states = trained(shapes, tmp_path, {1: "stopbackward=2\n", 3: "burnin_update=2\n"}, steps=7, burn_in=3).states
    for layer in (0, 1):
        assert frozen_steps(states, layer, PARAMETERS) == 2
        assert frozen_steps(states, layer, STATISTICS) == 0
    assert frozen_steps(states, 2, PARAMETERS) == 0
    assert frozen_steps(states, 3, PARAMETERS) == 5
    assert frozen_steps(states, 3, STATISTICS) == 0


def test_train_only_bn_updates_no_parameter_of_its_layers_only_their_batchnorm_statistics(shapes, tmp_path):
    """update_network_gpu skips a train_only_bn layer altogether (``if (l.train_only_bn) continue;``), every layer
    up to the last with the key (set_train_only_bn): its convolution weights, BatchNorm scales and biases stay as they
    were; the running statistics follow the data."""
    states = trained(shapes, tmp_path, {1: "train_only_bn=1\n"}, steps=3).states
    for layer in (0, 1):
        assert frozen_steps(states, layer, PARAMETERS) == 3
        assert frozen_steps(states, layer, STATISTICS) == 0
    assert frozen_steps(states, 2, PARAMETERS) == 0


def test_a_run_resumed_across_the_end_of_a_freeze_ends_as_an_uninterrupted_one(shapes, tmp_path):
    """Two steps, then resumed to five, with layer 2 frozen until step 3 (dont_update) and layers 0-1 for the whole
    run with layer 0's BatchNorm in eval mode (stopbackward=1): the same weights and statistics, bit for bit, as five
    steps in one go."""
    path = detector_cfg(tmp_path / "net.cfg", {1: "stopbackward=1\n", 2: "dont_update=3\n"})
    run, reference = tmp_path / "run", tmp_path / "reference"
    settings = [f"data.path={shapes}", *RUN]
    first = run_main("train", str(path), "--out", str(run), "--set", *settings, "steps=2")
    assert first.returncode == 0, first.stderr[-2000:]
    at_two = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    resumed = run_main("train", "--resume", str(run), "--set", "steps=5")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    whole = run_main("train", str(path), "--out", str(reference), "--set", *settings, "steps=5")
    assert whole.returncode == 0, whole.stderr[-2000:]
    expected = torch.load(reference / "checkpoints" / "last.pt", weights_only=True)["model"]
    actual = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert expected.keys() == actual.keys()
    for key, value in expected.items():
        assert torch.equal(value, actual[key]), key
    # the freeze of layer 2 ended in the resumed part; layers 0 and 1 and layer 0's statistics never moved
    assert not torch.equal(at_two["network.layers.2.conv.weight"], actual["network.layers.2.conv.weight"])
    for key in ("0.conv.weight", "0.bn.running_mean", "1.conv.weight", "1.bn.bias"):
        assert torch.equal(at_two[f"network.layers.{key}"], actual[f"network.layers.{key}"]), key


def test_gradient_clipping_covers_a_layer_once_its_freeze_ends(shapes, tmp_path):
    """clip.max_norm clips the gradients of every trainable parameter, those of the layers a freeze kept out of the
    first steps too: their first update (step 2, no momentum yet, no weight decay) is at most lr x max_norm."""
    max_norm, lr = 1e-3, 0.01
    cfg = load_config(str(detector_cfg(tmp_path / "net.cfg", {1: "stopbackward=2\n"})),
                      [f"data.path={shapes}", *RUN, "steps=3", f"clip.max_norm={max_norm}", "optim.weight_decay=0"])
    snapshots = Snapshots()
    train(cfg, tmp_path / "run", hooks=[snapshots])
    before, after = snapshots.states[2], snapshots.states[3]
    update = torch.cat([(after[key] - before[key]).flatten() for key in before
                        if key.startswith(("network.layers.0.", "network.layers.1.")) and "running" not in key
                        and "num_batches" not in key])
    assert 0 < update.norm() <= lr * max_norm * (1 + 1e-4)


@pytest.mark.fast
def test_an_ignored_key_that_changes_training_is_a_warning_naming_its_line(tmp_path):
    """``learning_rate`` (Darknet's per-layer ``learning_rate_scale``), ``onlyforward`` and ``clip`` set to other than
    their defaults make Darknet train otherwise (``network.c``, ``update_convolutional_layer``); bigbatch does not
    use them, and says so once each, naming the line. At their defaults, and ``stream``, they are only listed."""
    text = net_header(8, 8, 3) + "".join(f"\n{section}\n" for section in CLASSIFIER)
    path = tmp_path / "net.cfg"
    line = text.split("\n").index("[maxpool]") + 2
    path.write_text(text.replace("[maxpool]\n", "[maxpool]\nlearning_rate=1\nonlyforward=0\nclip=0\nstream=1\n"))
    cfg = read_darknet_cfg(path)
    assert len(ignored_keys(cfg)) == 4 and not cfg.warnings
    path.write_text(text.replace("[maxpool]\n", "[maxpool]\nlearning_rate=0.1\nonlyforward=1\nclip=2.5\n"))
    cfg = read_darknet_cfg(path)
    assert [w.split(": ", 1)[0] for w in cfg.warnings] == [f"{path}:{line + i}" for i in range(3)]
    assert [w.split("] ", 1)[1].split(" is not used")[0] for w in cfg.warnings] == [
        "learning_rate: 0.1", "onlyforward: 1", "clip: 2.5"]
    assert "learning_rate_scale" in cfg.warnings[0] and "bigbatch trains it" in cfg.warnings[1]
