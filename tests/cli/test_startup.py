"""The CLI answers what needs no model before torch loads: ``--help`` of every command, ``--version``, an unknown
command or option, and the config mistakes that need no registry's part (checked in one ``python -X importtime``
process that gives them all: no ``torch`` line)."""

from __future__ import annotations

import json
import subprocess
import sys

from bigbatch.cli import build_parser
from bigbatch.config import load_config
from bigbatch.errors import UserError
from tests.helpers import ROOT, clean_env

ANSWERS = [["--help"], ["--version"], ["nosuch"], ["train", "--nosuch"],
           *([command, "--help"] for command in ("train", "eval", "predict", "show", "schedule", "scale", "plan",
                                                "data", "pack", "export", "profile", "report"))]
MISTAKES = [["show", "no-such-recipe"], ["train", "no-such.yaml"], ["show", "tests/fixtures/broken.yaml"],
            ["train", "digits", "--set", "batch"], ["train", "--set", "batch"], ["show", "digits", "--set", "step=10"],
            ["plan", "digits", "--set", "zzz=1"]]
"""Config mistakes said before torch loads: an unknown recipe or file, a YAML syntax error, an override without
``=``, an unknown top-level key."""
UNKNOWN_KEYS = [["show", "digits", "--set", "optim.lrr=9"], ["train", "--set", "model.widht=8"],
                ["schedule", "shapes-detect", "--set", "schedule.decay.evry=3", "data.standard.foo=1", "zzz=1"],
                ["plan", "tests/fixtures/widht.yaml"],
                ["scale", "digits", "--batch", "64", "--set", "adaptive={base: 1}"],
                ["show", "inception-v3-tpu", "--set", "schedule.warmup=[{kind: linear, length: 1, a-b: 2}]"]]
"""Unknown keys inside sections, said before torch loads, each line as validation (which loads the registries'
parts) gives it: a section's own key, a key some parts add (``optim``, ``model``, ``data``), a section in a section,
an item of a list of sections, a YAML file's, an adaptive batch's."""

EACH = """
import contextlib, io, json, sys
from bigbatch.cli import main

answers = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    answers.append([code, err.getvalue()])
print(json.dumps(answers))
"""


def imported_modules(code: str, *args: str) -> tuple[list[str], subprocess.CompletedProcess]:
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args], cwd=ROOT, env=clean_env(),
                            capture_output=True, text=True)
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    return [line.rsplit("|", 1)[-1].strip() for line in lines], result


def test_the_answers_that_need_no_model_come_without_torch(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("batch: 64\nsubdivisions: [1, 2\n")
    widht = tmp_path / "widht.yaml"
    widht.write_text("batch: 64\nsteps: 2\nmodel:\n  widht: 8\n")
    files = {"tests/fixtures/broken.yaml": str(broken), "tests/fixtures/widht.yaml": str(widht)}
    mistakes, unknown = ([[files.get(a, a) for a in argv] for argv in argvs] for argvs in (MISTAKES, UNKNOWN_KEYS))
    modules, result = imported_modules(EACH, json.dumps(ANSWERS + mistakes + unknown))
    assert result.returncode == 0, result.stderr[-2000:]
    answers = json.loads(result.stdout)
    assert [code for code, _ in answers] == [0, 0, 2, 2, *[0] * 12, *[2] * len(MISTAKES + UNKNOWN_KEYS)]
    assert "bigbatch.cli" in modules and "torch" not in modules
    for argv, (_, err) in zip(unknown, answers[-len(unknown):], strict=True):
        assert err == f"error: {validation_line(argv)}\n", argv


def validation_line(argv: list[str]) -> str:
    """The line validation gives the config ``argv`` names (in this process, where the registries' parts load)."""
    args = build_parser().parse_args(argv)
    try:
        load_config(args.config or "digits", args.overrides)
    except UserError as e:
        return str(e)
    raise AssertionError(f"{argv}: no mistake")


def test_the_check_can_fail():
    """The oracle of the test above: a command that reads a checkpoint imports torch (before it finds there is none
    to read), and the check sees it."""
    modules, result = imported_modules(EACH, json.dumps([["eval", "no-such-run"]]))
    assert result.returncode == 0 and [code for code, _ in json.loads(result.stdout)] == [2] and "torch" in modules
