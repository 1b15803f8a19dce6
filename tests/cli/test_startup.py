"""The CLI answers what needs no model before torch loads: ``--help`` of every command, ``--version``, an unknown
command or option, and the config mistakes that need no registry (checked in one ``python -X importtime`` process
that gives them all: no ``torch`` line)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import ROOT, clean_env

ANSWERS = [["--help"], ["--version"], ["nosuch"], ["train", "--nosuch"],
           *([command, "--help"] for command in ("train", "eval", "predict", "show", "schedule", "scale", "plan",
                                                "data", "pack", "export", "profile", "report"))]
MISTAKES = [["show", "no-such-recipe"], ["train", "no-such.yaml"], ["show", "tests/fixtures/broken.yaml"],
            ["train", "digits", "--set", "batch"], ["train", "--set", "batch"], ["show", "digits", "--set", "step=10"],
            ["plan", "digits", "--set", "zzz=1"]]
"""Config mistakes said before torch loads: an unknown recipe or file, a YAML syntax error, an override without
``=``, an unknown top-level key (a key inside a section is checked by validation, which loads the registries)."""

EACH = """
import contextlib, io, json, sys
from bigbatch.cli import main

codes = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            codes.append(main(argv))
        except SystemExit as e:
            codes.append(e.code)
print(json.dumps(codes))
"""


def imported_modules(code: str, *args: str) -> tuple[list[str], subprocess.CompletedProcess]:
    result = subprocess.run([sys.executable, "-X", "importtime", "-c", code, *args], cwd=ROOT, env=clean_env(),
                            capture_output=True, text=True)
    lines = [line for line in result.stderr.splitlines() if line.startswith("import time:")]
    return [line.rsplit("|", 1)[-1].strip() for line in lines], result


def test_the_answers_that_need_no_model_come_without_torch(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("batch: 64\nsubdivisions: [1, 2\n")
    mistakes = [[str(broken) if a == "tests/fixtures/broken.yaml" else a for a in argv] for argv in MISTAKES]
    modules, result = imported_modules(EACH, json.dumps(ANSWERS + mistakes))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout) == [0, 0, 2, 2, *[0] * 12, *[2] * len(MISTAKES)]
    assert "bigbatch.cli" in modules and "torch" not in modules


def test_the_check_can_fail():
    """The oracle of the test above: a command that reads a checkpoint imports torch (before it finds there is none
    to read), and the check sees it."""
    modules, result = imported_modules(EACH, json.dumps([["eval", "no-such-run"]]))
    assert result.returncode == 0 and json.loads(result.stdout) == [2] and "torch" in modules
