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

from tests.helpers import DARKNET_DATA, HANG_GUARD_S, ROOT

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


# --------------------------------------------------------------------------------- the docs' commands, verbatim

DOC_FILES = ("README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")))


def doc_commands() -> list[tuple[str, str, str | None]]:
    """Every ``bigbatch`` command in a fenced block of the README and docs/: (file, the command as written, the line
    after it when the command is shown with a ``$`` prompt, its output). Lines ending in ``\\`` are joined."""
    import re

    found = []
    for name in DOC_FILES:
        for block in re.findall(r"```[a-z]*\n(.*?)```", (ROOT / name).read_text(encoding="utf-8"), re.S):
            lines = block.replace("\\\n", " ").splitlines()
            for i, line in enumerate(lines):
                text = line.strip()
                prompt = text.startswith("$ ")
                words = text.removeprefix("$ ").split()
                if words and (words[0] == "bigbatch" or "bigbatch" in words[1:] and "-m" in words):
                    shown = lines[i + 1].strip() if prompt and i + 1 < len(lines) else None
                    found.append((name, " ".join(text.removeprefix("$ ").split()), shown))
    return found


SYNOPSIS = "a synopsis (placeholders, not a command)"
SKIPPED = {
    **{command: SYNOPSIS for command in (
        "bigbatch train [CONFIG] [--set KEY=VALUE ...] [--out DIR] [--resume DIR] # train; a run directory",
        "bigbatch eval CHECKPOINT_OR_RUN_DIR [--save-detections FILE.json] # evaluate a checkpoint",
        "bigbatch show [CONFIG] [--set KEY=VALUE ...] # the resolved config and batch plan",
        "bigbatch schedule [CONFIG] [--csv FILE] [--png FILE] # the learning rate (and batch), step by step",
        "bigbatch scale [CONFIG] --batch B [--out NEW.yaml] # the recipe for another batch",
        "bigbatch plan [CONFIG] [--memory-limit SIZE] # subdivisions that fit the memory",
        "bigbatch profile [CONFIG] [--steps N] [--out DIR] # time by operator kind",
        "bigbatch report RUN [RUN ...] [--out FILE.html] # one HTML page of runs",
        "bigbatch data shapes --out DIR | data bench [CONFIG] # a detection set; input speed",
        "bigbatch pack SRC --out DIR # an image folder as shards",
        "bigbatch export RUN_DIR|CHECKPOINT|NET.cfg [--darknet-weights OUT.weights] # Darknet .weights, checkpoints",
        "bigbatch export RUN_DIR|CHECKPOINT|NET.cfg --format onnx --out FILE # ONNX/TorchScript/OpenVINO, checked",
        "bigbatch train [CONFIG] [--set KEY=VALUE ...] [--out DIR] [--resume DIR]",
        "bigbatch eval CHECKPOINT_OR_RUN_DIR [--set KEY=VALUE ...] [--save-detections FILE.json]",
        "bigbatch data shapes --out DIR [--images N] [--seed S] [--format coco|yolo]",
        "bigbatch data bench [CONFIG] [--set KEY=VALUE ...] [--images N]",
        "bigbatch data convert SRC --to coco|yolo --out DIR [--layout darknet|ultralytics] [--copy]",
        "bigbatch data anchors DATA --num K [--size WxH] [--cfg IN.cfg --out OUT.cfg] [--seed S] [--tries N]",
        "bigbatch data convert SRC --to coco|yolo --out DIR # COCO <-> YOLO labels, ids kept",
        "bigbatch data anchors DATA --num K [--cfg IN.cfg --out OUT.cfg] # anchors fitted as Darknet's calc_anchors",
        "bigbatch pack SRC --out DIR [--shard-size 256MB] [--seed S]",
        "bigbatch export RUN_DIR|CHECKPOINT|NET.cfg [--darknet-weights OUT.weights] [--checkpoint OUT.pt] "
        "[--weights IN]",
        "bigbatch show [CONFIG] [--set KEY=VALUE ...]",
        "bigbatch schedule [CONFIG] [--set KEY=VALUE ...] [--csv FILE] [--png FILE]",
        "bigbatch scale [CONFIG] --batch B [--out NEW.yaml]",
        "bigbatch plan [CONFIG] [--set KEY=VALUE ...] [--memory-limit SIZE]",
        "bigbatch plan [CONFIG] --devices N,N,... [--batches B,...] [--link NAME|ALPHA_US,BETA_GBPS] "
        "[--measure-steps N] [--from RUN --target-loss L] [--out RUN] [--json] [--price X] [--no-pair]",
        "bigbatch profile [CONFIG] [--set KEY=VALUE ...] [--steps N] [--out DIR]",
        "bigbatch report RUN [RUN ...] [--out FILE.html]",
        "bigbatch predict IMAGES|FOLDER|LIST|VIDEO --from RUN|CHECKPOINT|NET.cfg # run a model on your own images",
        "bigbatch predict SOURCE... --from RUN|CHECKPOINT|NET.cfg [--out DIR] [--coco FILE.json] [--txt] "
        "[--save-images]",
        "bigbatch export RUN_DIR|CHECKPOINT|NET.cfg --format onnx|torchscript|openvino --out FILE [--check N] "
        "[--dynamic-batch] [--postprocess]")},
    "bigbatch export runs/digits --format onnx --out digits.onnx":
        "the optional export extra (onnx, onnxscript, onnxruntime); tests/inference/test_export.py exports runs and "
        "predicts from the files through the same commands",
    "bigbatch predict my_digit.png --from digits.onnx # onnxruntime: the same records as --from runs/digits":
        "the reader's own image and the ONNX file above; tests/inference/test_export.py predicts from exported files",
    "bigbatch predict my_digit.png photos/ 'more/**/*.jpg' list.txt clip.mp4 --from runs/digits --out predictions":
        "the reader's own images; tests/inference/test_predict.py predicts on each kind of source (an image, a "
        "folder, a list, a video) through the same command",
    "torchrun --nproc-per-node 8 -m bigbatch train megdet-r50-fpn --out runs/megdet --set subdivisions=2":
        "8 processes on COCO (tests/engine/test_distributed.py runs torchrun on 2 CPU processes)",
    "torchrun --nproc-per-node 8 -m bigbatch train megdet-r50-fpn --set subdivisions=2":
        "8 processes on COCO (tests/engine/test_distributed.py runs torchrun on 2 CPU processes)",
    "bigbatch train megdet-r50-fpn --set subdivisions=16 # one device": "Faster R-CNN on COCO, which is not here",
    "torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint host0:29400 --rdzv-id megdet -m "
    "bigbatch train megdet-r50-fpn --out /shared/runs/megdet --set subdivisions=1":
        "two machines of 8 GPUs each (tests/engine/test_multinode.py runs two agents on this one)",
    "torchrun --nnodes 2 --nproc-per-node 8 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint host0:29400 "
    "--rdzv-id megdet -m bigbatch train megdet-r50-fpn --out /shared/runs/megdet --set subdivisions=1":
        "two machines of 8 GPUs each (tests/engine/test_multinode.py runs two agents on this one)",
    "BIGBATCH_HOST_ALL_REDUCE=off torchrun --nproc-per-node 2 -m bigbatch train digits --set model.norm=batch "
    "norm.sync=bigbatch":
        "torchrun, which this test does not launch (tests/engine/test_multinode.py trains with the switch off)",
    "torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --rdzv-id two-agents "
    "-m bigbatch train digits --out runs/two-agents --set model.norm=batch norm.sync=bigbatch":
        "run twice at once (two agents); tests/engine/test_multinode.py runs this form, with a free port and the "
        "rendezvous timeouts of a loaded machine",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --nnodes 1:4 --nproc-per-node 8 --max-restarts 3 "
    "--rdzv-backend c10d --rdzv-endpoint host0:29400 --rdzv-id megdet -m bigbatch train megdet-r50-fpn "
    "--out /shared/runs/megdet --set subdivisions=1":
        "elastic machines on COCO; tests/engine/test_multinode.py runs this form with two agents of digits, one lost "
        "or one added mid-run",
    'srun torchrun --nnodes "$SLURM_NNODES" --nproc-per-node 8 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint '
    '"$head:29400" --rdzv-id "$SLURM_JOB_ID" -m bigbatch train megdet-r50-fpn --out /shared/runs/megdet '
    "--set subdivisions=1": "Slurm, which is not here",
    "- torchrun --nnodes 2 --nproc-per-node 8 --max-restarts 3 --rdzv-backend c10d --rdzv-endpoint "
    "megdet-0.megdet:29400 --rdzv-id megdet -m bigbatch train megdet-r50-fpn --out /runs/megdet --set subdivisions=1":
        "a Kubernetes Job's command, and Kubernetes is not here",
    "bigbatch export yolov3.cfg --weights yolov3.weights --checkpoint yolov3.pt # .weights -> checkpoint":
        "Darknet's released yolov3.weights (248 MB) is not fetched in a test; tests/darknet/test_darknet_cli.py "
        "converts a file of the same size both ways",
    "bigbatch export darknet19.cfg --weights darknet19.weights --darknet-weights darknet19.conv.23 --upto 23":
        "Darknet's released darknet19.weights is not fetched in a test; tests/darknet/test_darknet_classify.py "
        "writes and loads a .conv.23",
    "bigbatch train darknet19.cfg --set data.path=photos data.size=64 batch=16 subdivisions=1 steps=1000 "
    "model.weights=darknet19.conv.23":
        "needs darknet19.conv.23 (above); tests/darknet/test_darknet_classify.py trains it",
    "bigbatch train inception-v3-tpu --set data.path=/data/imagenet # Cloud TPU's Inception v3 recipe on ImageNet":
        "ImageNet, which is not here (tests/data/test_folder.py trains the recipe on a small folder)",
    "bigbatch train digits --set data.name=folder data.path=DIR data.size=224 model.name=timm/resnet50":
        "DIR is a placeholder for the reader's folder (tests/data/test_folder.py trains timm models on one)",
    "bigbatch pack /data/imagenet --out /data/imagenet-shards --shard-size 256MB": "ImageNet, which is not here",
    "bigbatch train digits --set data.name=folder data.path=photos model.weights=runs/digits model.mismatched=reinit":
        "photos is the reader's folder (tests/engine/test_start_weights.py starts a folder run from a digits run)",
    "bigbatch train digits --set data.name=folder data.path=photos model.name=timm/resnet18 model.weights=resnet18.pth "
    "model.mismatched=reinit":
        "a timm state dict the reader has (tests/engine/test_start_weights.py loads timm's and torchvision's own "
        "state dicts)",
    "bigbatch train yolov4-tiny-3l-shapes --set model.weights=yolov4-tiny.weights model.weights_cfg=yolov4-tiny.cfg "
    "model.mismatched=reinit":
        "Darknet's released yolov4-tiny.weights is not fetched in a test (tests/darknet/ reads .weights of other "
        "class counts with their cfg)",
    "bigbatch train inception-v3-tpu --set data.name=shards data.path=/data/imagenet-shards":
        "ImageNet, which is not here (tests/data/test_shards.py trains on packed shards)",
}
"""Commands of the docs that are not run here, with why."""

SHORTER = ["log.tensorboard=false", "eval.batch=16", "memory.interval=60"]
SHORTENED = {
    "bigbatch data shapes --out shapes --format yolo # a Darknet-layout set to try it on: shapes/shapes.data":
        ["--images", "30"],
    "bigbatch train yolov3-tiny.cfg --out runs/yolo --set data.name=yolo data.path=shapes/shapes.data data.size=128":
        ["--set", "steps=1", "batch=4", "subdivisions=1", "data.size=64", "data.multiscale.sizes=null", *SHORTER],
    "bigbatch train yolov3-tiny-shapes --out runs/yolo-shapes --set data.name=yolo data.path=shapes/shapes.data":
        ["--set", "steps=1", "batch=4", "subdivisions=1", "data.size=64", *SHORTER],
    "bigbatch train shapes-detect --out runs/shapes # the demo: generates data/shapes on first use, then trains":
        ["--set", "data.shapes_images=40", "steps=1", "batch=4", "subdivisions=1", "data.size=64", *SHORTER],
    "bigbatch eval runs/shapes --set data.name=yolo data.path=shapes-yolo/shapes.data # the mAP of `bigbatch eval "
    "runs/shapes`": ["--set", "data.shapes_images=2000"],  # the run above set the shapes format's key, which yolo lacks
    "bigbatch data shapes --out myshapes --images 500 --seed 1 # write a generated set yourself": ["--images", "20"],
    "bigbatch train digits --out batch256 --set log.tensorboard=false": ["--set", "steps=2", *SHORTER],
    "bigbatch train digits --out runs/tuned --set model.weights=runs/digits model.freeze=backbone model.unfreeze_at=20 "
    "optim.backbone_lr_scale=0.1": ["--set", "steps=2", *SHORTER],
    "bigbatch train digits --out runs/digits": ["--set", "steps=2", *SHORTER],
    "bigbatch train digits --out batch1024 --set batch=1024 log.tensorboard=false": ["--set", "steps=2", *SHORTER],
    "bigbatch train digits --out r1 --set steps=60 eval.every=20 log.tensorboard=false subdivisions=4":
        ["--set", "steps=3", "eval.every=2", *SHORTER],
    "bigbatch train digits --out r2 --set batch=512 subdivisions=4 steps=30 log.tensorboard=false":
        ["--set", "steps=2", *SHORTER],
    "bigbatch plan digits --devices 1,2,4,8 --link ib100": ["--measure-steps", "2", "--set", "batch=64",
                                                           "subdivisions=2"],
    "bigbatch train shapes-detect": ["--out", "runs/demo", "--set", "data.shapes_images=40", "steps=1", "batch=4",
                                     "subdivisions=1", "data.size=64", *SHORTER],
}
"""Commands run with these arguments added (a shorter run, a smaller set): the command as written, checked to start."""

SETUP = [["train", "digits", "--out", name, "--set", "steps=2", "batch=64", "subdivisions=2", *SHORTER]
         for name in ("runs/digits-b256", "runs/digits-b1024", "runs/a", "runs/b")]
"""What the report docs' commands read: the reader's runs, here short ones."""

RUN_DOC_COMMANDS = """
import contextlib, io, json, shlex, sys, time
from bigbatch.cli import main

done = []
for argv in json.load(open(sys.argv[1])):
    out, err, start = io.StringIO(), io.StringIO(), time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:
            code = e.code
    done.append({"argv": argv, "code": code, "stdout": out.getvalue()[-3000:], "stderr": err.getvalue()[-3000:],
                 "seconds": round(time.perf_counter() - start, 2)})
json.dump(done, sys.stdout)
"""


def test_every_command_of_the_docs_runs_from_the_installed_package_or_is_skipped_with_its_reason(installed):
    """Each fenced ``bigbatch`` command of the README and docs/ runs as written (``bigbatch`` is the installed
    package's; a shortening added where ``SHORTENED`` says), in doc order from an empty folder outside the source
    tree with the reader's files (Darknet's yolov3.cfg and yolov3-tiny.cfg) beside it; or is in ``SKIPPED`` with its
    reason. A ``$`` example's shown output must be what the command prints (the machine's memory aside)."""
    import re
    import shlex

    _, python, cwd = installed
    work = cwd.parent / "docs-commands"
    work.mkdir()
    for name in ("yolov3.cfg", "yolov3-tiny.cfg"):
        shutil.copy(DARKNET_DATA / name, work / name)
    commands = doc_commands()
    unknown = [(name, command) for name, command, _ in commands if command not in SKIPPED and command.split()[0]
               != "bigbatch"]
    assert unknown == [], f"commands neither run (bigbatch ...) nor in SKIPPED: {unknown}"
    to_run = [(name, command, shown) for name, command, shown in commands if command not in SKIPPED]
    argvs = [*SETUP, *[shlex.split(command, comments=True)[1:] + SHORTENED.get(command, [])
                       for _, command, _ in to_run]]
    (work / "commands.json").write_text(json.dumps(argvs))
    result = run([str(python), "-c", RUN_DOC_COMMANDS, str(work / "commands.json")], cwd=work)
    done = json.loads(result.stdout)
    slowest = sorted(done, key=lambda ran: -ran["seconds"])[:8]  # shown with -s: where the test's time goes
    print("slowest doc commands:", *(f"{ran['seconds']:6.2f} s  {' '.join(ran['argv'])[:150]}" for ran in slowest),
          sep="\n  ")
    for setup in done[:len(SETUP)]:
        assert setup["code"] == 0, setup
    machine = re.compile(r"this machine's [\d.]+ \wiB")
    for (name, command, shown), ran in zip(to_run, done[len(SETUP):], strict=True):
        expected_code = 2 if shown is not None and shown.startswith("error:") else 0
        assert ran["code"] in (expected_code, None), f"{name}: `{command}` exited {ran['code']}:\n{ran['stderr']}"
        if shown is not None:
            first = (ran["stderr"] or ran["stdout"]).splitlines()[0]
            assert machine.sub("MEMORY", first) == machine.sub("MEMORY", shown), (name, command, first)
    assert {command for command in SKIPPED} <= {command for _, command, _ in commands}, "SKIPPED names a command "\
        "the docs no longer hold"
