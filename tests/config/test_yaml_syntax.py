"""The YAML bigbatch reads (``config/loading.py``'s loader, for recipe files, ``--set`` values and a run's
``config.yaml``): floats in exponent form as YAML 1.2 and Python write them (``1e-3``), a key given twice refused in
one line naming it and its line, and the run's ``name`` a plain folder name (``runs/<name>-<time>`` stays in
``runs/``)."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from bigbatch.config import config_to_yaml, load_config, load_yaml, parse_override, read_yaml
from bigbatch.errors import UserError
from tests.helpers import run_main

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(("text", "value"), [
    ("1e-3", 1e-3), ("5E-4", 5e-4), ("1.0e300", 1e300), ("-1e5", -1e5), ("+1e5", 1e5), ("1e+5", 1e5),
    (".5e3", 500.0), ("1.e5", 1e5), ("1.0e-3", 1e-3), (".5", 0.5), ("3.14", 3.14)])
def test_a_float_in_exponent_form_is_a_float(text, value):
    assert load_yaml(text) == value and type(load_yaml(text)) is float
    assert load_yaml(f"lr: {text}") == {"lr": value}


@pytest.mark.parametrize(("text", "value"), [
    ("1e", "1e"), ("e5", "e5"), ("1E5x", "1E5x"), ("1.2.3", "1.2.3"), ("v1.2", "v1.2"), ("nan", "nan"),
    ("inf", "inf"), ("12", 12), ("-7", -7), ("0x1f", 31), ("1_000", 1000), ("1:30", 90), ("010", 8)])
def test_ints_and_text_read_as_before(text, value):
    assert load_yaml(text) == value and type(load_yaml(text)) is type(value)


def test_non_finite_floats_are_refused_as_before():
    assert math.isinf(load_yaml("1e400")) and math.isinf(load_yaml(".inf")) and math.isnan(load_yaml(".nan"))
    for value in ("1e400", "1.0e+400", ".inf", "-.inf", ".nan"):
        with pytest.raises(UserError, match=r"^optim\.lr: input should be a finite number"):
            load_config("digits", [f"optim.lr={value}"])
    with pytest.raises(UserError, match=r"^epochs: input should be a finite number"):
        load_config("digits", ["epochs=1e400"])


def test_exponent_floats_from_the_command_line_and_a_file(tmp_path):
    cfg = load_config("digits", ["optim.lr=1e-3", "optim.weight_decay=5e-4", "schedule.min_lr=1e-5",
                                 "memory.interval=1e-2"])
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.schedule.min_lr, cfg.memory.interval) == (1e-3, 5e-4, 1e-5, 0.01)
    assert parse_override("optim.lr=1e-3") == (["optim", "lr"], 1e-3)
    path = tmp_path / "c1.yaml"
    path.write_text("optim: {lr: 5e-4, weight_decay: 1E-4}\n")
    cfg = load_config(str(path), ["data.name=digits", "model.name=small_cnn", "batch=64", "steps=1"])
    assert (cfg.optim.lr, cfg.optim.weight_decay) == (5e-4, 1e-4)
    result = run_main("show", "digits", "--set", "optim.lr=1e-3")
    assert result.returncode == 0, result.stderr
    assert "  lr: 0.001\n" in result.stdout


def test_the_written_config_reads_back_the_same(tmp_path):
    source = tmp_path / "r.yaml"
    source.write_text("name: '1e3'\noptim: {lr: 1e-3, weight_decay: 5e-5}\nschedule: {min_lr: 1e-300}\n")
    cfg = load_config(str(source), ["data.name=digits", "model.name=small_cnn", "batch=64", "steps=1"])
    text = config_to_yaml(cfg)
    assert "name: '1e3'" in text  # text that reads as a float is quoted
    written = tmp_path / "config.yaml"
    written.write_text(text)
    assert read_yaml(written) == cfg.model_dump(mode="json")
    assert load_config(str(written)).model_dump() == cfg.model_dump()


def test_a_key_given_twice_in_a_file_is_one_error_naming_it_and_its_line(tmp_path):
    dup = tmp_path / "dup.yaml"
    dup.write_text("batch: 64\noptim:\n  lr: 0.1\noptim:\n  momentum: 0.5\n")
    result = run_main("show", str(dup))
    assert result.returncode == 2
    assert result.stderr == f"error: config: {dup}:4: key 'optim' given twice (also line 2)\n"
    dup.write_text("batch: 64\noptim:\n  lr: 0.1\n  lr: 0.2\n")
    with pytest.raises(UserError, match=r"^config: .*dup\.yaml:4: key 'lr' given twice \(also line 3\)$"):
        read_yaml(dup)
    dup.write_text("optim: {lr: 0.1, lr: 0.2}\n")
    with pytest.raises(UserError, match=r"^config: .*dup\.yaml:1: key 'lr' given twice \(also line 1\)$"):
        read_yaml(dup)


def test_a_key_given_twice_in_a_set_value_is_refused():
    with pytest.raises(UserError, match=r"^--set: optim: key 'lr' given twice$"):
        parse_override("optim={lr: 1, lr: 2}")
    result = run_main("show", "digits", "--set", "optim={lr: 0.1, lr: 0.2}")
    assert (result.returncode, result.stderr) == (2, "error: --set: optim: key 'lr' given twice\n")


def test_a_run_config_given_a_key_twice_is_refused_on_resume(tmp_path):
    """A run directory's config.yaml with a key appended again is refused, not read last-wins."""
    config = tmp_path / "config.yaml"
    config.write_text(config_to_yaml(load_config("digits")) + "batch: 256\n")
    with pytest.raises(UserError, match=r"^config: .*config\.yaml:\d+: key 'batch' given twice \(also line \d+\)$"):
        read_yaml(config)


def test_merge_keys_may_be_given_again():
    """A mapping's own key replaces one a merge (``<<: *base``) brings in: not a key given twice."""
    data = load_yaml("base: &b {lr: 0.1, momentum: 0.9}\noptim: {<<: *b, lr: 0.2}\n")
    assert data["optim"] == {"lr": 0.2, "momentum": 0.9}
    data = load_yaml("a: &a {p: 1}\nb: &b {q: 2}\nc: {<<: [*a, *b], p: 3}\n")
    assert data["c"] == {"p": 3, "q": 2}
    with pytest.raises(yaml.YAMLError, match="given twice"):
        load_yaml("base: &b {lr: 0.1}\noptim: {<<: *b, lr: 0.2, lr: 0.3}\n")


@pytest.mark.parametrize("name", ["../../x", "/tmp/absname", ".", "..", "a/b", "a\\b", "", "a\tb", "a\nb", "x" * 201,
                                  "é" * 101])
def test_a_name_that_is_not_a_plain_folder_name_is_refused(name):
    with pytest.raises(UserError, match=r"^name: expected a plain name for the run folder") as caught:
        load_config("digits", [f"name={json.dumps(name)}"])
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["digits", "yolov4-tiny-3l-slim-shapes", "run_1.v2+x", ".hidden", "x" * 200,
                                  "é" * 100, "my run"])
def test_a_plain_name_is_taken(name):
    assert load_config("digits", [f"name={json.dumps(name)}"]).name == name


def test_a_name_given_by_cli_is_one_error_line():
    result = run_main("show", "digits", "--set", "name=../../escape")
    assert result.returncode == 2
    assert result.stderr.startswith("error: name: expected a plain name") and result.stderr.count("\n") == 1


@pytest.mark.parametrize("text", ["runs/x", "spaced dir ü/shards", "off", "123", "1e9", "a #b", "a: b", "it's",
                                  "$HOME/x", "-x", "[a]", "{a: 1}", "null", "~", "'quoted'", "",
                                  "sh\x7fdel/x", "a\x85b", "bad\udcffbyte", "off ü"])
def test_override_word_reads_back_as_the_same_text(text):
    """``override_word`` (the ``--set`` words ``pack``, ``data convert`` and ``data shapes`` print) pastes into a
    shell as one word that ``parse_override`` reads back as exactly the text, whatever YAML or the shell would make
    of it unquoted."""
    import shlex

    from bigbatch.config.loading import override_word, parse_override

    words = shlex.split(override_word("data.path", text))
    assert len(words) == 1 and parse_override(words[0]) == (["data", "path"], text)
