"""How long the CLI takes to answer what needs no model, against ``python -c "import torch"`` on the same machine.

    python benchmarks/startup.py [--rounds 7]

Each case is a fresh ``python -m bigbatch ...`` process, timed from its start to its exit (wall clock), in rounds
whose order is reversed every other round; the median per case is printed with its ratio to the median of ``python
-c "import torch"`` (the floor every command that builds a model pays). The cases answered before torch loads:
``--help`` and the ``--help`` of every command, ``--version``, an unknown command, option, recipe or file, a YAML
syntax error, an override without ``=``, an unknown key at the top level, inside a section (``optim.lrr``), among
the keys the model families add (``model.widht``) and in a YAML file (``model: {widht: 8}``). For scale, two that
load torch: a mistake only a registry's parts can see (``optim.name=nosuch``: the optimizers are imported to list
them) and ``show digits`` (which builds the model on the meta device).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = ("train", "eval", "predict", "show", "schedule", "scale", "plan", "data", "pack", "export", "profile",
            "report")
CASES = {
    "bigbatch --help": ["-m", "bigbatch", "--help"],
    "bigbatch --version": ["-m", "bigbatch", "--version"],
    **{f"bigbatch {command} --help": ["-m", "bigbatch", command, "--help"] for command in COMMANDS},
    "bigbatch nosuch (unknown command)": ["-m", "bigbatch", "nosuch"],
    "bigbatch train --nosuch (unknown option)": ["-m", "bigbatch", "train", "--nosuch"],
    "bigbatch show no-such-recipe (unknown recipe)": ["-m", "bigbatch", "show", "no-such-recipe"],
    "bigbatch train no-such.yaml (unknown file)": ["-m", "bigbatch", "train", "no-such.yaml"],
    "bigbatch show BROKEN.yaml (YAML syntax)": ["-m", "bigbatch", "show", "BROKEN"],
    "bigbatch train --set batch (no =)": ["-m", "bigbatch", "train", "--set", "batch"],
    "bigbatch show --set step=10 (unknown top-level key)": ["-m", "bigbatch", "show", "--set", "step=10"],
    "bigbatch show --set optim.lrr=1 (unknown key in a section)": ["-m", "bigbatch", "show", "--set", "optim.lrr=1"],
    "bigbatch show --set model.widht=8 (among the model families' keys)": ["-m", "bigbatch", "show", "--set",
                                                                           "model.widht=8"],
    "bigbatch show WIDHT.yaml (model: {widht: 8} in a file)": ["-m", "bigbatch", "show", "WIDHT"],
    "bigbatch show --set optim.name=nosuch (loads torch: the optimizers listed)": ["-m", "bigbatch", "show", "--set",
                                                                                   "optim.name=nosuch"],
    "bigbatch show digits (loads torch: the model on the meta device)": ["-m", "bigbatch", "show", "digits"],
    'python -c "import torch"': ["-c", "import torch"],
}


def timed(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], capture_output=True, check=False)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    rounds = parser.parse_args().rounds
    with tempfile.TemporaryDirectory() as folder:
        broken = Path(folder) / "broken.yaml"
        broken.write_text("batch: 64\nsubdivisions: [1, 2\n")
        widht = Path(folder) / "widht.yaml"
        widht.write_text("batch: 64\nsteps: 2\nmodel:\n  widht: 8\n")
        files = {"BROKEN": str(broken), "WIDHT": str(widht)}
        cases = {name: [files.get(a, a) for a in args] for name, args in CASES.items()}
        times: dict[str, list[float]] = {name: [] for name in cases}
        for args in cases.values():  # warm the file cache once
            timed(args)
        for r in range(rounds):
            order = list(cases) if r % 2 == 0 else list(reversed(cases))
            for name in order:
                times[name].append(timed(cases[name]))
    torch_median = statistics.median(times['python -c "import torch"'])
    print(f"{rounds} rounds, order reversed every other round; median wall time per fresh process")
    print("| case | median s | x import torch |\n|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.2f} | {median / torch_median:.2f} |")


if __name__ == "__main__":
    main()
