"""User mistakes in configs stop before any work: exit code 2, one ``error:`` line naming the key."""

from __future__ import annotations

import pytest

from bigbatch.config import load_config
from bigbatch.errors import UserError
from tests.helpers import run_cli, run_main

BAD = [
    (["--set", "optim.lrr=0.1"], "optim.lrr", "unknown key"),
    (["--set", "batch=abc"], "batch", "integer"),
    (["--set", "batch=100", "subdivisions=3"], "batch", "multiple of 3"),
    (["--set", "steps=-5"], "steps", "greater than 0"),
    (["--set", "model.norm=layer"], "model.norm", "'batch', 'group' or 'none'"),
    (["--set", "model.name=resnet1000"], "model.name", "unknown model"),
    (["--set", "subdivisions=0"], "subdivisions", "greater than 0"),
    (["--set", "seed=-1"], "seed", "greater than or equal to 0"),
    (["--set", "schedule.decay.kind=step", "schedule.decay.every=0"], "schedule.decay.every", "length > 0"),
    (["--set", "eval.every=.inf"], "eval.every", "finite length"),
    (["--set", "data.size=4"], "data.size", "at least 8 px"),
    (["--set", "precision.loss_scale=foo"], "precision.loss_scale", "'dynamic'"),
    (["--set", "clip.max_norm=1", "clip.agc=0.1"], "clip.agc", "not several"),
    (["--set", "data.path=off"], "data.path", "got False (YAML reads yes, no, on and off as true or false: quote"),
    (["--set", "data.path=2020-01-01"], "data.path", "(YAML reads 2020-01-01 as a date: quote the text"),
]


CASES = [("show", *case) for case in BAD] + [("train", *case) for case in BAD[:4]]


PROCESS = {0, len(BAD)}
"""The cases run as a real process (the first of ``show`` and of ``train``: exit status, stderr as the shell sees it);
the others run ``main`` in this process (``run_main``), the same code without a Python start and torch's import."""


@pytest.mark.parametrize(("command", "overrides", "key", "expected", "process"),
                         [(*case, number in PROCESS) for number, case in enumerate(CASES)])
def test_bad_config_fails_with_one_error_line(tmp_path, command, overrides, key, expected, process):
    out = tmp_path / "run"
    extra = ["--out", str(out)] if command == "train" else []
    result = (run_cli if process else run_main)(command, "digits", *overrides, *extra)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {key}:"), lines[0]
    assert expected in lines[0]
    assert "Traceback" not in result.stderr
    assert not out.exists(), "a bad config must stop before any work"


def test_unknown_key_lists_the_accepted_keys():
    with pytest.raises(UserError, match=r"^batchsize: unknown key, did you mean 'batch'\? \(expected one of: "
                                        r".*\bsubdivisions\b"):
        load_config("digits", ["batchsize=64"])


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("batch: 64\nsubdivisions: [1, 2\nseed: 0\n")
    result = run_cli("show", str(path))
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: config: {path}:")
    assert len(result.stderr.strip().splitlines()) == 1


def test_unknown_recipe_names_the_builtins():
    with pytest.raises(UserError, match="neither a YAML file, a Darknet .cfg nor a built-in recipe.*digits") as e:
        load_config("no-such-recipe")
    assert "did you mean" not in str(e.value)
    recipes = str(e.value).split("(built-in: ")[1].rstrip(")").split(", ")
    assert len(recipes) == len(set(recipes)) and "yolov3-tiny-shapes" in recipes  # a .yaml and a .cfg: listed once


@pytest.mark.parametrize(("source", "overrides", "expected"), [
    ("digitz", [], "config: 'digitz' is neither a YAML file, a Darknet .cfg nor a built-in recipe, did you mean "
                   "'digits'?"),
    ("digits", ["step=10"], "step: unknown key, did you mean 'steps'?"),
    ("digits", ["optim.nme=sgd"], "optim.nme: unknown key, did you mean 'name'?"),
    ("digits", ["data.name=digitz"], "data.name: unknown dataset 'digitz', did you mean 'digits'?"),
    ("digits", ["schedule.decay.kind=cosin"], "schedule.decay.kind: unknown decay 'cosin', did you mean 'cosine'?"),
    ("digits", ["zzz=1"], "zzz: unknown key (expected one of: "),
])
def test_a_misspelt_name_gets_the_nearest_one(source, overrides, expected):
    with pytest.raises(UserError) as e:
        load_config(source, overrides)
    assert str(e.value).startswith(expected), str(e.value)


def test_overrides_are_typed_and_steps_replaces_epochs():
    cfg = load_config("digits", ["steps=7", "optim.lr=0.05", "optim.nesterov=true", "model.norm=group"])
    assert cfg.steps == 7 and cfg.epochs is None
    assert cfg.optim.lr == 0.05 and cfg.optim.nesterov is True
    assert cfg.model.norm == "group"
    with pytest.raises(UserError, match="^steps: give either steps or epochs, not both"):  # both on one line
        load_config("digits", ["steps=7", "epochs=2"])


def test_steps_and_epochs_together_in_a_file_is_an_error(tmp_path):
    path = tmp_path / "both.yaml"
    path.write_text("batch: 64\nsteps: 10\nepochs: 2\n")
    with pytest.raises(UserError, match="^steps: give either steps or epochs"):
        load_config(str(path))


def test_float_for_an_integer_is_rejected():
    with pytest.raises(UserError, match="^batch: "):
        load_config("digits", ["batch=64.5"])


def test_a_floor_above_the_peak_lr_is_an_error():
    result = run_cli("schedule", "digits", "--set", "schedule.min_lr=1")
    assert result.returncode == 2
    assert result.stderr.startswith("error: schedule.min_lr: 1.0 is above the LR for the global batch (0.1)")


def test_best_checkpoint_by_loss_keeps_the_lowest():
    cfg = load_config("digits", ["eval.metric=loss"])
    assert cfg.eval.better == "min"
    assert load_config("digits", ["eval.metric=loss", "eval.mode=max"]).eval.better == "max"


def test_each_optimizer_declares_its_own_keys():
    """momentum, betas, eps, ... are the optimizers' own keys (``largebatch/optim.py``): another optimizer's key is
    accepted at its default only, and config.yaml still holds every key in the order it always had."""
    from bigbatch.config import config_to_yaml
    from bigbatch.registry import OPTIMIZERS

    assert set(OPTIMIZERS.get("adamw").fields) == {"eps", "betas", "fused"}
    assert "momentum" in OPTIMIZERS.get("sgd").fields and "betas" not in OPTIMIZERS.get("sgd").fields
    with pytest.raises(UserError, match=r"^optim.momentum: used by optimizer sgd, momentum, rmsprop_tf or lars only, "
                                        r"not by 'adamw' \(optim.name\)"):
        load_config("digits", ["optim.name=adamw", "optim.momentum=0.5"])
    cfg = load_config("digits", ["optim.name=adamw", "optim.momentum=0.9", "optim.betas=[0.8, 0.99]"])
    assert cfg.optim.betas == (0.8, 0.99)
    optim = config_to_yaml(cfg).split("\noptim:\n")[1].split("\n")
    keys = [line.split(":")[0].strip() for line in optim if line.startswith("  ") and not line.startswith("  - ")]
    assert keys[:13] == ["name", "lr", "ref_batch", "scaling", "momentum", "nesterov", "weight_decay",
                         "no_decay_norm_bias", "eps", "betas", "rmsprop_decay", "trust_coefficient",
                         "momentum_correction"]


@pytest.mark.parametrize("name, extra", [("digits", []), ("folder", ["data.path=/data/photos"]),
                                         ("shards", ["data.path=/data/shards"])])
def test_a_class_subset_is_refused_by_a_classification_format(name, extra):
    """``data.classes`` is the detection formats' (a subset of a set's classes, by name); a classification format
    never read it, so a run trained every class without a word."""
    with pytest.raises(UserError, match=rf"^data\.classes: used by the detection formats only, not by '{name}'"):
        load_config("digits", [f"data.name={name}", *extra, "data.classes=[a, b]"])
    assert load_config("shapes-detect", ["data.classes=[circle, star]"]).data.classes == ["circle", "star"]


@pytest.mark.parametrize("name, extra", [("digits", []), ("folder", ["data.path=/data/photos"]),
                                         ("shards", ["data.path=/data/shards"])])
def test_multiscale_sizes_are_refused_by_a_classification_format(name, extra):
    """``data.multiscale`` is read by detection only: a classifier given sizes trained at ``data.size`` without a
    word (and ``plan`` measured at it)."""
    with pytest.raises(UserError, match=rf"^data\.multiscale\.sizes: used by the detection formats only, not by "
                                        rf"'{name}'"):
        load_config("digits", [f"data.name={name}", *extra, "data.multiscale.sizes=[32, 64]"])
    assert load_config("shapes-detect", ["data.multiscale.sizes=[64, 96]"]).data.multiscale.sizes == [64, 96]


NINES = "9" * 400
"""A number with more digits than a float holds: it reads as infinity."""


@pytest.mark.parametrize("args, key", [(["show", "digits", "--set", f"memory.limit={NINES}MiB"], "memory.limit"),
                                       (["plan", "digits", "--memory-limit", f"{NINES}GiB"], "--memory-limit"),
                                       (["plan", "digits", "--memory-limit", f"1{'0' * 400}"], "--memory-limit")])
def test_a_size_past_a_floats_range_is_one_error_line_naming_its_key(args, key):
    result = run_main(*args)
    assert result.returncode == 2 and "measuring" not in result.stdout
    assert result.stderr.strip().splitlines() == [f"error: {key}: expected a size of at most 8 EiB, got "
                                                  f"'{args[-1].split('=')[-1]}'"]


def test_the_largest_size_is_8_eib_exactly():
    from bigbatch.config import parse_size

    assert parse_size("8388608TiB") == 2**63 == parse_size(2**63)  # 2^23 x 2^40
    for bigger in ("8388609TiB", 2**63 + 1):
        with pytest.raises(ValueError, match="at most 8 EiB"):
            parse_size(bigger)


def test_a_dotted_key_under_an_unset_section_begins_it(tmp_path):
    """A run's config.yaml writes ``data.val: null`` when no COCO split is set; ``--set data.val.images=DIR`` (the
    words ``data convert`` prints) then said "data.val: is a value, not a section". An unset section is begun, and
    what it still lacks is named; a key under a plain value is still refused."""
    from bigbatch.config import config_to_yaml

    written = tmp_path / "config.yaml"
    written.write_text(config_to_yaml(load_config("shapes-detect")))
    assert "  val: null\n" in written.read_text()
    split = ["data.val.images=/sets/val", "data.val.annotations=/sets/val.json"]
    cfg = load_config(str(written), ["data.name=coco", "data.train.images=/sets/train",
                                     "data.train.annotations=/sets/train.json", *split])
    assert str(cfg.data.val.images) == "/sets/val" and str(cfg.data.train.annotations) == "/sets/train.json"
    with pytest.raises(UserError, match=r"^data\.val\.annotations: missing"):
        load_config(str(written), ["data.name=coco", "data.val.images=/sets/val"])
    with pytest.raises(UserError, match=r"^data\.size: is a value, not a section; cannot set data\.size\.x"):
        load_config(str(written), ["data.size.x=1"])


def test_the_memory_sampling_interval_has_a_floor():
    """``memory.interval=1e-300`` was taken: the sampler's thread spun, ``memory.csv`` growing 800 rows a second."""
    with pytest.raises(UserError, match=r"^memory\.interval: input should be greater than or equal to 0\.001"):
        load_config("digits", ["memory.interval=1e-300"])
    assert load_config("digits", ["memory.interval=0.001"]).memory.interval == 0.001


def test_a_config_argument_that_is_a_folder_or_a_fifo_says_so(tmp_path):
    """They were "neither a YAML file, a Darknet .cfg nor a built-in recipe", as if the path were not there."""
    import os

    os.mkfifo(tmp_path / "c.yaml")
    with pytest.raises(UserError, match=rf"^config: {tmp_path} is a folder; expected a YAML file"):
        load_config(str(tmp_path))
    with pytest.raises(UserError, match=r"^config: .*c\.yaml is not a regular file; expected a YAML file"):
        load_config(str(tmp_path / "c.yaml"))
