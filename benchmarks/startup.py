"""How long the CLI takes to answer what needs no model, against ``python -c "import torch"`` on the same machine.

    python benchmarks/startup.py [--rounds 7]

Each case is a fresh ``python -m bigbatch ...`` process, timed from its start to its exit (wall clock), in rounds
whose order is reversed every other round; the median per case is printed with its ratio to the median of ``python
-c "import torch"`` (the floor every command that builds a model pays). The cases: ``--help``, ``--version``,
``train --help``, an unknown command, a YAML syntax error, an override without ``=``, an unknown top-level key (all
answered before torch loads), and, for scale, ``show digits`` (which builds the model on the meta device) and a key
inside a section (``optim.lrr``: validation loads the registries, and so torch).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CASES = {
    "bigbatch --help": ["-m", "bigbatch", "--help"],
    "bigbatch --version": ["-m", "bigbatch", "--version"],
    "bigbatch train --help": ["-m", "bigbatch", "train", "--help"],
    "bigbatch nosuch (unknown command)": ["-m", "bigbatch", "nosuch"],
    "bigbatch show BROKEN.yaml (YAML syntax)": ["-m", "bigbatch", "show", "BROKEN"],
    "bigbatch train --set batch (no =)": ["-m", "bigbatch", "train", "--set", "batch"],
    "bigbatch show --set step=10 (unknown key)": ["-m", "bigbatch", "show", "--set", "step=10"],
    "bigbatch show --set optim.lrr=1 (a section's key)": ["-m", "bigbatch", "show", "--set", "optim.lrr=1"],
    "bigbatch show digits": ["-m", "bigbatch", "show", "digits"],
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
        cases = {name: [str(broken) if a == "BROKEN" else a for a in args] for name, args in CASES.items()}
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
