"""The package installs what it ships: the wheel built from this tree, installed into a fresh virtual environment,
runs ``bigbatch show`` on every built-in recipe from a working directory outside the source tree.

The wheel is built from a copy of the tree (setuptools writes ``build/`` and ``*.egg-info`` beside its sources:
nothing is left in the checkout) with ``pip wheel --no-deps --no-build-isolation`` (offline: the setuptools of the
running environment). The fresh environment (``python -m venv --without-pip``) gets the wheel with ``--no-deps``
through this environment's pip (``pip --python``, so that the console script runs the new interpreter), then a
``.pth`` file naming this environment's site-packages, for torch and the other dependencies; the ``.pth`` is written
after the install, so that pip does not take the editable ``bigbatch`` of this environment for an installed one.
Only a path is added: the editable install's own ``.pth`` there (its import hook) is not run, so ``import bigbatch``
can only find the wheel's copy; the test checks that every ``bigbatch`` module came from the new environment.

Before ``pyproject.toml`` packaged ``configs/*.cfg`` the wheel lacked ``yolov3-coco.cfg`` and
``yolov3-tiny-shapes.cfg``: the file-list test failed, and ``show`` of the two YOLO recipes stopped with
``model.cfg: yolov3-coco.cfg does not exist``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.helpers import HANG_GUARD_S, ROOT

BUILD_INPUTS = ("pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", "README.md", "LICENSE", "bigbatch", "csrc")
"""What setuptools reads to build the wheel (those present are copied; ``bigbatch`` without ``__pycache__``)."""

SHOW_ALL = """
import contextlib, io, json, sys
import bigbatch, bigbatch.cli, bigbatch.config
from bigbatch.cli import main
from bigbatch.config import RECIPES_DIR, builtin_recipes

shown = {}
names = sorted(set(builtin_recipes())) + [str(p) for p in sorted(RECIPES_DIR.glob("*.cfg"))]
for name in names:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(["show", name])
        except SystemExit as e:
            code = e.code
    shown[name] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}
modules = {n: getattr(m, "__file__", None) for n, m in sys.modules.items() if n.split(".")[0] == "bigbatch"}
json.dump({"file": bigbatch.__file__, "recipes": builtin_recipes(), "configs": str(RECIPES_DIR), "modules": modules,
           "shown": shown}, sys.stdout)
"""


def package_files(root: Path) -> set[str]:
    """The files of the package in the source tree at ``root``, as the wheel names them (``bigbatch/...``)."""
    return {p.relative_to(root).as_posix() for p in (root / "bigbatch").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def copy_build_inputs(root: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in BUILD_INPUTS:
        source = root / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        elif source.is_file():
            shutil.copy2(source, dest / name)
    return dest


def offline_env() -> dict[str, str]:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
           "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("WORLD_SIZE", None)
    env.pop("RANK", None)
    return env


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=cwd, env=offline_env(), capture_output=True, text=True,
                            timeout=HANG_GUARD_S)
    assert result.returncode == 0, f"{command}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


def build_wheel(source: Path, out: Path) -> Path:
    """The wheel of the tree at ``source`` (a copy: the build writes beside it), written into ``out``."""
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(out),
         str(source)], cwd=source)
    wheels = list(out.glob("bigbatch-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def install_in_fresh_venv(wheel: Path, venv: Path) -> Path:
    """A new virtual environment holding ``wheel``, and this environment's packages through a ``.pth``;
    -> its python."""
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=venv.parent)
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--quiet", str(wheel)],
        cwd=venv.parent)
    site = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    cwd=venv.parent).stdout.strip())
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))  # torch, numpy, ...
    (site / "outer-environment.pth").write_text("".join(f"{path}\n" for path in ours))
    return python


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the wheel, the new environment's python, an empty working directory outside the source tree)."""
    if os.name != "posix":
        pytest.skip("the virtual environment's layout (bin/python) is POSIX's")
    top = tmp_path_factory.mktemp("wheel")
    wheel = build_wheel(copy_build_inputs(ROOT, top / "src"), top / "dist")
    python = install_in_fresh_venv(wheel, top / "venv")
    cwd = top / "cwd"
    cwd.mkdir()
    return wheel, python, cwd


def test_the_wheel_holds_every_file_of_the_package(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    configs = {name for name in package_files(ROOT) if name.startswith("bigbatch/configs/")}
    assert {"bigbatch/configs/yolov3-coco.cfg", "bigbatch/configs/yolov3-tiny-shapes.cfg"} <= configs
    assert configs - names == set(), "built-in recipe files missing from the wheel"
    assert package_files(ROOT) - names == set(), "package files missing from the wheel"


def test_every_builtin_recipe_shows_from_the_installed_package(installed):
    wheel, python, cwd = installed
    venv = python.parent.parent
    result = run([str(python), "-c", SHOW_ALL], cwd=cwd)
    report = json.loads(result.stdout)
    assert Path(report["file"]).is_relative_to(venv), f"bigbatch imported from {report['file']}, not the wheel"
    outside = {name: file for name, file in report["modules"].items()
               if file is not None and not Path(file).is_relative_to(venv)}
    assert outside == {}, "bigbatch modules imported from outside the new environment"
    assert Path(report["configs"]).is_relative_to(venv)
    source_recipes = {p.stem for p in (ROOT / "bigbatch" / "configs").iterdir() if p.suffix in (".yaml", ".cfg")}
    assert set(report["recipes"]) == source_recipes
    failed = {name: shown["stderr"] for name, shown in report["shown"].items() if shown["code"] not in (0, None)}
    assert failed == {}, "bigbatch show failed from the installed package"
    for name, shown in report["shown"].items():
        assert "error:" not in shown["stderr"] and "Traceback" not in shown["stderr"], (name, shown["stderr"])
        assert shown["stdout"].strip(), name
    for name in ("yolov3-coco", "yolov3-tiny-shapes"):  # the recipes whose model.cfg is a file beside them
        assert "parameters" in report["shown"][name]["stdout"] and "layers;" in report["shown"][name]["stdout"]
    assert list(cwd.iterdir()) == [], "show wrote into the working directory"


def test_the_console_script_runs_the_installed_package(installed):
    _, python, cwd = installed
    script = python.parent / "bigbatch"
    assert script.read_text().splitlines()[0] == f"#!{python}"  # the new environment's interpreter
    result = run([str(script), "show", "yolov3-tiny-shapes"], cwd=cwd)
    assert result.stderr == "" and "24 layers;" in result.stdout
    where = run([str(python), "-c", "import bigbatch; print(bigbatch.__file__)"], cwd=cwd).stdout.strip()
    assert Path(where).is_relative_to(python.parent.parent), where
