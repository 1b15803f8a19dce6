"""Property-based tests (hypothesis) of what a user types: the YAML config loader, ``--set KEY=VALUE`` and the
Darknet ``.cfg`` reader, driven through the real CLI (``bigbatch show``, in-process).

The property: whatever the input, ``bigbatch show`` either succeeds (exit code 0, nothing on stderr, a resolved
config that is finite and reads back to the same output) or stops with exit code 2 and exactly one
``error: ...`` line on stderr; never a traceback.

``show`` does no training. Two things are kept cheap here without changing what is checked: the digits set is
loaded at 8 px whatever ``data.size`` says (``show`` only counts its images), and ``subdivisions: auto`` (which
measures memory in subprocesses) is never run (such an example is discarded). Every example runs in an empty
working directory, so the detection recipes' data paths point at nothing and must give a clean error.

``test_absurd_numbers_give_one_error_line`` lists what the properties found that is for the config section classes
to refuse (integers too large for a float); the properties themselves find those too until it is.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, assume, example, given, reject, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from bigbatch.cli import main
from bigbatch.config import RunConfig, parse_override
from bigbatch.darknet.recipe import net_recipe
from bigbatch.darknet.text import read_cfg
from bigbatch.errors import UserError
from tests.helpers import DARKNET_DATA, ROOT

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")  # a failure's strategy, printed

PROPERTY = settings(
    deadline=None,  # no test depends on wall-clock speed
    # CI (CI=true) tries the same examples on every run, so that a landing is never held up by a new random draw;
    # elsewhere each run draws new ones, and a case it finds is added below as an @example.
    derandomize=bool(os.environ.get("CI")),
    database=None,  # no example database in the checkout; a failure prints its example
    report_multiple_bugs=False,  # shrink the first failure only, and
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],  # skip "explain": quicker
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


def examples(n: int) -> settings:
    """Hypothesis settings for a property tried on ``n`` generated examples (besides the explicit ones)."""
    return settings(PROPERTY, max_examples=n)


# ----------------------------------------------------------------------------- running `bigbatch show`


@pytest.fixture(autouse=True)
def _cheap_show(tmp_path_factory, monkeypatch):
    """An empty working directory; digits loaded at 8 px (``show`` only counts them); no ``subdivisions: auto``."""
    import bigbatch.data.formats.digits as digits
    import bigbatch.engine.planner as planner

    real_load, real_resolve = digits.load_digits_split, planner.resolve_auto_subdivisions
    small = functools.lru_cache(maxsize=1)(lambda: real_load(8))

    def resolve(cfg, world):
        if cfg.subdivisions == "auto":
            reject()  # measuring memory in subprocesses is slow, and not what is tested here
        return real_resolve(cfg, world)

    monkeypatch.setattr(digits, "load_digits_split", lambda size: small())
    monkeypatch.setattr(planner, "resolve_auto_subdivisions", resolve)
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


def show(*args: str) -> tuple[int, str, str]:
    """``bigbatch show ARGS`` in this process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["show", *args])
        except SystemExit:  # argparse; the arguments built here are always well formed
            raise AssertionError(f"argparse refused {args!r}: {err.getvalue()}") from None
    return rc, out.getvalue(), err.getvalue()


def _floats(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    if isinstance(value, dict):
        return [f for v in value.values() for f in _floats(v)]
    if isinstance(value, list):
        return [f for v in value for f in _floats(v)]
    return []


def _without_filled_in(out: str) -> str:
    """``show``'s output without its last block, the keys validation filled in ("eval.metric  top1  (unset in the
    config: ...)")."""
    kept = "".join(line for line in out.splitlines(keepends=True) if "  (unset in the config: " not in line)
    return kept[:-1] if kept != out and kept.endswith("\n\n") else kept


def check_show(*args: str) -> tuple[int, str]:
    """Run ``show`` and check the property; -> (exit code, the error line or the printed config)."""
    rc, out, err = show(*args)
    assert rc in (0, 2), (rc, err)
    if rc == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and err.endswith("\n"), f"not one line: {err!r}"
        assert re.match(r"error: [^:\s][^\n]*?: \S", lines[0]), f"not 'error: KEY: what is wrong': {err!r}"
        assert out == "", f"printed before failing: {out!r}"
        return rc, lines[0]
    assert err == "", f"exit code 0 with stderr {err!r}"
    config_text, sep, plan = out.rstrip("\n").partition("\n\nglobal batch")  # the config, a blank line, the plan
    assert sep, out
    resolved = yaml.safe_load(config_text)
    bad = [f for f in _floats(resolved) if not math.isfinite(f)]
    assert not bad, f"a non-finite number was accepted: {bad} in\n{config_text}"
    saved = Path("resolved.yaml")  # the printed config is itself a config, which resolves to the same
    saved.write_text(config_text + "\n", encoding="utf-8")
    again = show(str(saved))  # what validation filled in (show's last lines) is given there
    assert again == (0, _without_filled_in(out), ""), f"the printed config does not read back: {again[2]!r}"
    return rc, config_text


# ----------------------------------------------------------------------------- keys and values


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The config section an annotation holds (itself, ``X | None``, ``list[X]``), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _known_keys(cls: type[BaseModel] = RunConfig, prefix: str = "") -> dict[str, Any]:
    """Every dotted key of the config (sections too) -> its annotation."""
    keys: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        if name not in cls.keys():  # kept inside another key (RunConfig.adaptive is written in batch)
            continue
        keys[prefix + name] = field.annotation
        section = _model_of(field.annotation)
        if section is not None and typing.get_origin(field.annotation) is not list:
            keys.update(_known_keys(section, f"{prefix}{name}."))
    return keys


KNOWN_KEYS = _known_keys()

SPECIAL_NUMBERS = [0.0, -0.0, 1e-300, 5e-324, 1e300, 1.7976931348623157e308, math.inf, -math.inf, math.nan]
HUGE_INTS = [2**31, 2**63, 10**30, -(2**63), 10**400]
WORDS = ["", " ", "auto", "none", "null", "true", "digits", "shapes", "coco", "yolo", "small_cnn", "resnet18",
         "small_detector", "fasterrcnn_resnet50_fpn", "linear", "cosine", "darknet", "steps", "5 epochs",
         "1.2e6 images", "1e400 steps", "-3 epochs", "inf steps", "2GiB", "1e30 TiB", "0 MiB", "top1", "mAP", "AP/x",
         "missing/train.json", "missing", ".", "resolved.yaml", "é\u2028x", "a\nb", "\x00", "[", "{"]
"""Strings worth trying: names the config knows, lengths and sizes, paths (relative to the empty working
directory, or this very run's files), and characters that break lines."""


def _values(annotation: Any, depth: int = 0) -> st.SearchStrategy[Any]:
    """Python values shaped like ``annotation`` (and a little beyond: ranges and finiteness are not respected)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _values(args[0], depth)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_values(a, depth) for a in args])
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is list:
        return st.lists(_values(args[0], depth + 1), max_size=4)
    if origin is tuple:
        return st.tuples(*[_values(a, depth + 1) for a in args]) | st.lists(_values(args[0], depth + 1), max_size=3)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.integers(-3, 600) | st.sampled_from(HUGE_INTS)
    if annotation is float:
        return st.floats() | st.sampled_from(SPECIAL_NUMBERS)
    if annotation is str:
        return st.sampled_from(WORDS) | st.text(max_size=12)
    if annotation is type(None):
        return st.none()
    section = _model_of(annotation)
    if section is not None and depth < 2:
        fields = {name: _values(f.annotation, depth + 1) for name, f in section.model_fields.items()}
        return st.fixed_dictionaries({}, optional=fields)
    return JUNK


_scalars = (st.none() | st.booleans() | st.integers() | st.sampled_from(HUGE_INTS) | st.floats()
            | st.sampled_from(SPECIAL_NUMBERS + WORDS) | st.text(max_size=10))
JUNK = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=5) | st.integers() | st.none(), inner, max_size=3),
                    max_leaves=8)
"""Any YAML-representable value."""


def to_yaml(value: Any) -> str:
    """One value as the YAML text of a ``--set`` value (flow style: ``[1, 2]``, ``{a: 1}``, ``.inf``)."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True, width=math.inf)
    return text.removesuffix("\n").removesuffix("\n...")


RAW_VALUES = [".inf", "-.inf", ".nan", ".NaN", "1e400", "1.0e+400", "-1.0e+400", "1.0e+308", "1e-400", "1.0e-400",
              "-1", "0", "0x10", "0o17", "1_000", "1:30", "2020-13-45", "2020-02-30", "2001-12-14t21:59:43.10-05:00",
              "!!int x", "!!float", "!!bool x", "!!binary ?", "!!timestamp x", "!!set {a}", "!!omap [a]", "!foo x",
              "&a 1", "*a", "[", "]", "{", "}", "{a: [1, {b: }", "'", '"', ": ", "- a", "a: b", "#", "|", ">", "? a",
              "---", "...", "%YAML 1.1", "\t1", "1\x00", "[" * 600, "{a: " * 300, "~", "", " ", "auto", "[auto]"]
"""``--set`` value texts that are not what a YAML dumper writes: tags, dates, broken flow collections,
non-finite and out-of-range numbers in YAML 1.1's spellings, deep nesting."""


@st.composite
def overrides(draw: st.DrawFn) -> str:
    """One ``KEY=VALUE``: a known key with a value of about its type, or junk on either side."""
    if draw(st.integers(0, 9)) < 8:
        key = draw(st.sampled_from(sorted(KNOWN_KEYS)))
        values = _values(KNOWN_KEYS[key])
        if key == "subdivisions":
            values = values.filter(lambda v: v != "auto")
    else:
        parts = st.sampled_from(["model", "data", "optim", "x", "a-b", "float", "int", "list[int]", "literal['a']",
                                 "none", "0", " ", "é", "\n"]) | st.text(min_size=1, max_size=6).filter(
                                     lambda s: "." not in s and "=" not in s and s.strip())
        key = ".".join(draw(st.lists(parts, min_size=1, max_size=4)))
        values = JUNK
    if draw(st.integers(0, 4)) == 0:
        return f"{key}={draw(st.sampled_from(RAW_VALUES))}"
    return f"{key}={to_yaml(draw(values))}"


# ----------------------------------------------------------------------------- the base configs

COCO_YAML = """\
task: detection
batch: 16
steps: 10
model: {name: small_detector}
data:
  name: coco
  train: {images: missing/train, annotations: missing/train.json}
  val: {images: missing/val, annotations: missing/val.json}
"""

YOLO_YAML = """\
task: detection
batch: 16
steps: 10
model: {name: small_detector}
data: {name: yolo, path: missing/coco.data, resize: letterbox, size: 128}
"""

SMALL_CFG = """\
[net]
# Training
batch=64
subdivisions=16
width=416
height=416
channels=3
momentum=0.9
decay=0.0005
angle=0
saturation = 1.5
hue=.1

learning_rate=0.001
burn_in=1000
max_batches = 500200
policy=steps
steps=400000,450000
scales=.1,.1

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
size=1
stride=1
pad=1
filters=255
activation=linear

[yolo]
mask = 3,4,5
anchors = 10,14,  23,27,  37,58,  81,82,  135,169,  344,319
classes=80
num=6
random=1
"""
"""A Darknet cfg in yolov3-tiny's shape with a training header (tests/fixtures/darknet/yolov3-tiny.cfg has a testing
one)."""


@pytest.fixture(scope="module")
def bases(tmp_path_factory) -> list[str]:
    """CONFIG arguments to start from: built-in recipes, YAML files, a Darknet .cfg."""
    root = tmp_path_factory.mktemp("bases")
    files = {"coco.yaml": COCO_YAML, "yolo.yaml": YOLO_YAML, "small.cfg": SMALL_CFG}
    for name, text in files.items():
        (root / name).write_text(text, encoding="utf-8")
    return ["digits", "shapes-detect", "megdet-r50-fpn", "inception-v3-tpu", *(str(root / n) for n in files)]


@pytest.mark.parametrize("base", range(7))
def test_every_base_config_shows(bases, base):
    """The starting points all show: the COCO and YOLO files, whose data is not at hand, plan their steps with the
    epochs unknown (the Inception recipe plans from its data.train_images)."""
    rc, shown = check_show(bases[base])
    assert rc == 0, shown
    if bases[base].endswith(("coco.yaml", "yolo.yaml")):
        assert "epochs          unknown" in show(bases[base])[1]


# ----------------------------------------------------------------------------- --set


@examples(300)
@given(base=st.sampled_from(range(7)), sets=st.lists(overrides(), min_size=1, max_size=4))
@example(base=0, sets=["optim.lr=0.05", "steps=3"])  # valid: exit code 0
@example(base=0, sets=["a\nb=1"])  # was two lines: the key is quoted now
@example(base=0, sets=["name=2020-13-45"])  # was a ValueError from PyYAML's date constructor
@example(base=0, sets=["seed=!!int x"])  # was an IndexError/ValueError from PyYAML's int constructor
@example(base=0, sets=["seed=" + "[" * 3000])  # was a RecursionError in PyYAML
def test_set_overrides_give_a_config_or_one_error_line(bases, base, sets):
    check_show(bases[base], *[f"--set={s}" for s in sets])


HUGE = "1" + "0" * 400
ABSURD_NUMBERS = [
    ["steps=" + HUGE], ["batch=8", "subdivisions=1", "steps=" + HUGE], ["batch=" + HUGE, "subdivisions=1"],
    ["checkpoint.every=" + HUGE], ["schedule.decay.end=" + HUGE], ["memory.limit=" + HUGE], ["data.size=" + HUGE],
    ["epochs=1.0e+308"],
]
"""Numbers past what the code can take, found by the property above (its ``HUGE_INTS``, ``SPECIAL_NUMBERS``): an
integer too large for a float was an OverflowError in ``parse_length``, ``parse_size``, the capacity check or the
batch plan, and 1.0e+308 epochs overflowed the steps. Whole numbers beyond 64 bits are now refused while the config
is read, and a run's image count beyond 64 bits by the capacity check and the batch plan."""


@pytest.mark.parametrize("sets", ABSURD_NUMBERS, ids=lambda sets: " ".join(s.replace(HUGE, "1e400") for s in sets))
def test_absurd_numbers_give_one_error_line(sets):
    check_show("digits", *[f"--set={s}" for s in sets])


def _shown(key: str) -> str:
    """A key as an error message names it: quoted when it is empty, holds a line break or a colon, or has
    surrounding space."""
    return key if key and key.isprintable() and key == key.strip() and ":" not in key else repr(key)


SECTIONS = ["", *sorted(k + "." for k, a in KNOWN_KEYS.items() if _model_of(a) is not None
                        and typing.get_origin(a) is not list)]


@examples(150)
@given(section=st.sampled_from(SECTIONS),
       name=st.sampled_from(["a-b", "float", "int", "str", "none", "list[int]", "literal['x']", "0", "widht", "é",
                             "a\u2028b", "a\x85b", " x", "x\t"]) | st.text(min_size=1, max_size=8))
@example(section="", name="a-b")  # was "error: : unknown key": a key that looks like a pydantic union tag vanished
@example(section="model.", name="float")  # was "error: model: unknown key (expected the top-level keys)"
@example(section="", name="a\nb")  # was two lines
@example(section="", name=":")  # was "error: :: unknown key"
def test_an_unknown_key_is_named_as_given(section, name):
    """``--set SECTION.NAME=1`` with an unknown NAME names exactly that key and lists the section's keys."""
    key = (section + name).strip()
    parent = _model_of(KNOWN_KEYS[section[:-1]]) if section else RunConfig
    assume("." not in name and "=" not in name and key and not key.endswith(".") and name not in parent.keys())
    rc, line = check_show("digits", f"--set={key}=1")
    assert rc == 2
    expected = re.compile(rf"{re.escape(_shown(key))}: unknown key(, did you mean '[\w.]+'\?)? "
                          rf"\(expected one of: {re.escape(', '.join(parent.keys()))}\)")  # parts' keys too
    parts = line.removeprefix("error: ").split("; ")  # (data.train.x: images, annotations missing)
    assert any(expected.fullmatch(part) for part in parts), line


def test_an_unknown_key_in_a_list_of_sections_is_named():
    """Was "schedule.warmup.0: unknown key (expected one of: a known key)"."""
    rc, line = check_show("digits", "--set=schedule.warmup=[{kind: linear, length: 1, a-b: 2}]")
    assert rc == 2 and "schedule.warmup.0.a-b: unknown key (expected one of: kind, length, " in line, line


@examples(150)
@given(sets=st.lists(st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from("=.=.[]{}:,- "), max_size=20),
                     min_size=1, max_size=3))
def test_raw_set_strings_give_a_config_or_one_error_line(sets):
    check_show("digits", *[f"--set={s}" for s in sets])


@examples(500)
@given(text=st.text(max_size=30) | overrides())
def test_parse_override_splits_the_key_or_says_why_not(text):
    try:
        keys, _ = parse_override(text)
    except UserError as e:
        assert str(e).startswith("--set: expected KEY=VALUE") and "\n" not in str(e)
        return
    assert keys == text.partition("=")[0].strip().split(".")
    assert all(keys)


@examples(100)
@given(source=st.sampled_from(["", ".", "..", "/", "digits", "digits.yaml", "configs/digits", "../digits", "x.cfg",
                               ".cfg", "resolved.yaml", "a\x00b", "\n", "/dev/null", "é"])
       | st.text(max_size=20).filter(lambda s: not s.startswith("-")))
def test_any_config_argument_gives_a_config_or_one_error_line(source):
    check_show(source)


# ----------------------------------------------------------------------------- whole YAML documents


def _lines_mutated(text: str) -> st.SearchStrategy[str]:
    """``text`` with some lines dropped, duplicated, swapped with junk, cut short or re-indented."""
    lines = text.splitlines()

    @st.composite
    def mutate(draw: st.DrawFn) -> str:
        out = list(lines)
        for _ in range(draw(st.integers(1, 4))):
            if not out:
                break
            i = draw(st.integers(0, len(out) - 1))
            how = draw(st.sampled_from(["drop", "dup", "junk", "cut", "indent", "value"]))
            if how == "drop":
                del out[i]
            elif how == "dup":
                out.insert(i, out[i])
            elif how == "junk":
                out[i] = draw(st.text(max_size=15))
            elif how == "cut":
                out[i] = out[i][: draw(st.integers(0, len(out[i])))]
            elif how == "indent":
                out[i] = draw(st.sampled_from([" ", "  ", "\t", "- "])) + out[i]
            else:
                head, sep, _ = out[i].partition(draw(st.sampled_from([":", "="])))
                out[i] = head + sep + draw(st.sampled_from(RAW_VALUES) | st.text(max_size=6))
        return "\n".join(out) + draw(st.sampled_from(["\n", "", "\r\n"]))

    return mutate()


DIGITS_YAML = (ROOT / "bigbatch" / "configs" / "digits.yaml").read_text()

yaml_documents = st.one_of(
    JUNK.map(lambda v: yaml.safe_dump(v, allow_unicode=True)),  # any value at the top level
    st.fixed_dictionaries({"batch": st.sampled_from([8, 16, 256]), "steps": st.integers(1, 50)},
                          optional={k: _values(a) for k, a in KNOWN_KEYS.items()
                                    if "." not in k and k not in ("batch", "steps", "subdivisions")},
                          ).map(lambda d: yaml.safe_dump(d, allow_unicode=True)),  # a config of any shape
    _lines_mutated(DIGITS_YAML),
    _lines_mutated(COCO_YAML),
    st.text(max_size=60),
    st.sampled_from(RAW_VALUES),
)


@examples(250)
@given(document=yaml_documents | st.binary(max_size=60))
@example(document=DIGITS_YAML)  # valid
@example(document=b"\xff\xfe\x00batch: 1")  # was a UnicodeDecodeError
@example(document="batch: 8\nsteps: 1\n\x00\n")  # was a yaml ReaderError (no line mark)
@example(document="[" * 3000)  # was a RecursionError
@example(document="batch: !!int x\n")  # was a ValueError from PyYAML's int constructor
@example(document="a: &x 1\nb: &x 2\n")  # said "invalid YAML: second occurrence", without what occurred twice
def test_yaml_files_give_a_config_or_one_error_line(document):
    path = Path("config.yaml")
    if isinstance(document, bytes):
        path.write_bytes(document)
    else:
        path.write_text(document, encoding="utf-8")
    check_show(str(path))


# ----------------------------------------------------------------------------- Darknet .cfg


def _cfg_mutated(text: str) -> st.SearchStrategy[str]:
    """A cfg with lines dropped, duplicated, corrupted, or with odd values in its ``key=value`` lines."""
    values = st.sampled_from(["", "1e999", "1.0e999", "-1e999", "nan", "inf", "-inf", "1e3", "1.5", "-1", "0",
                              "2147483648", "9" * 40, "1,2", ",", "0x10", "step", "steps", "sig", "poly", "exp",
                              "random", " 1 ", "1 2", "١٢"]) | st.text(max_size=8)
    keys = st.sampled_from(["batch", "subdivisions", "learning_rate", "momentum", "decay", "burn_in", "power",
                            "policy", "steps", "scales", "step", "scale", "gamma", "max_batches"])

    @st.composite
    def mutate(draw: st.DrawFn) -> str:
        lines = text.splitlines()
        for _ in range(draw(st.integers(1, 5))):
            i = draw(st.integers(0, max(len(lines) - 1, 0)))
            how = draw(st.sampled_from(["drop", "dup", "value", "value", "add", "junk", "bracket", "lead"]))
            if not lines or how == "add":
                lines.insert(min(i + 1, len(lines)), f"{draw(keys)}={draw(values)}")
            elif how == "drop":
                del lines[i]
            elif how == "dup":
                lines.insert(i, lines[i])
            elif how == "value":
                lines[i] = lines[i].partition("=")[0] + "=" + draw(values)
            elif how == "junk":
                lines[i] = draw(st.text(max_size=12))
            elif how == "bracket":
                lines[i] = draw(st.sampled_from(["[net", "[", "]", "[]", "[net]]", "[ network ]", "[conv"]))
            else:  # an option before any section
                lines.insert(0, f"{draw(keys)}={draw(values)}")
        return "\n".join(lines) + "\n"

    return mutate()


LINE_ERROR = re.compile(r"^error: config: (?P<path>.+?):(?P<line>\d+): .*got (?P<got>'.*'|\".*\")$")


def check_cfg(text: str | bytes, *sets: str) -> None:
    path = Path("net.cfg")
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    rc, shown = check_show(str(path), *[f"--set={s}" for s in sets])
    match = LINE_ERROR.match(shown) if rc == 2 else None
    if match and "[net]" not in shown:  # a reading error names the line it quotes
        lines = path.read_text(encoding="utf-8", errors="replace").split("\n")  # \r\n and \r end a line too
        number = int(match["line"])
        assert 1 <= number <= len(lines), shown
        assert repr(lines[number - 1].strip()) == match["got"], (shown, lines[number - 1])
    try:  # and the reader itself raises nothing but a UserError
        net_recipe(path)
    except UserError as e:
        assert "\n" not in str(e)
    else:
        assert all(name == name.strip() for name, _, _ in read_cfg(path))


@examples(250)
@given(text=_cfg_mutated(SMALL_CFG) | st.text(max_size=80) | st.binary(max_size=80),
       sets=st.lists(st.sampled_from(["steps=5", "subdivisions=1", "batch=64", "epochs=1"]), max_size=1))
@example(text=SMALL_CFG, sets=[])  # valid
@example(text="[net]\nbatch=8\nmax_batches=1.5e999\n", sets=[])  # was an OverflowError (inf to int)
@example(text="[net]\nbatch=8\nmax_batches=" + "9" * 400 + "\n", sets=[])  # was an OverflowError in the plan
@example(text="[net]\nbatch=8\nlearning_rate=inf\nmax_batches=10\n", sets=[])  # was accepted
@example(text="[net]\nbatch=8\nmax_batches=10\n\x0c\nx\n", sets=[])  # was a line number off by one
def test_cfg_files_give_a_config_or_one_error_line(text, sets):
    check_cfg(text, *sets)


@examples(60)
@given(data=st.data())
def test_reference_darknet_cfgs_mutated(data):
    name = data.draw(st.sampled_from(["yolov3.cfg", "yolov3-tiny.cfg"]), label="file")
    text = (DARKNET_DATA / name).read_text(encoding="utf-8")
    check_cfg(data.draw(_cfg_mutated(text) | st.just(text), label="cfg"),
              *data.draw(st.lists(st.sampled_from(["steps=5", "subdivisions=1"]), max_size=2), label="sets"))


@pytest.mark.parametrize("name", ["yolov3.cfg", "yolov3-tiny.cfg"])
def test_reference_darknet_cfgs_show(name):
    """The real cfgs show as they are (yolov3-tiny's testing header has batch=1, subdivisions=1)."""
    assert check_show(str(DARKNET_DATA / name))[0] == 0
