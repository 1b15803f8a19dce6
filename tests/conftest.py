from __future__ import annotations

import contextlib
import io
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_DATA = ROOT.parent / "shared" / "data"

# One intra-op thread per process (a developer's own OMP_NUM_THREADS wins). ``make test`` already runs two tests at a
# time on a 2-core machine, and torch's OpenMP threads spin-wait for one another: with more threads than free cores a
# run is several times slower (the 60-step digits run of test_train_cli, beside other work: 25 s with one thread,
# 109 s with torch's default of two). Set before torch is imported: for the test process itself (its CLI runs in
# process, ``run_main``) and for every subprocess.
os.environ.setdefault("OMP_NUM_THREADS", "1")

HANG_GUARD_S = 900
"""How long a test's subprocess, group of spawned workers or Gloo collective may take before it is taken to hang.

A hang guard, not a speed expectation: no test may fail because the machine is slow or busy. The slowest single
process of the suite, the 150-step detection run of test_detection_train, took 59 s on the project's 2-core machine
beside other work (2026-12-01); 15 minutes is fifteen times that. A whole test is guarded by pytest-timeout's
``timeout`` in pyproject.toml: 30 minutes, as a test may run several such processes one after the other."""


def bigbatch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "bigbatch", *args]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = HANG_GUARD_S) -> subprocess.CompletedProcess:
    """Run the real ``bigbatch`` CLI in a fresh process (``timeout``: a hang guard, see ``HANG_GUARD_S``)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(bigbatch_command(*args), cwd=cwd or ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def run_main(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``run_cli`` in this process: ``bigbatch.cli.main(args)`` with its stdout and stderr captured, in ``cwd``
    (default: the project's root) and without ``WORLD_SIZE`` or ``RANK`` in the environment, all restored after.

    For tests of what a command does, where the process itself is not what is tested: it saves a Python start and
    torch's import (seconds each on the 2-core machine). A test keeps ``run_cli`` where the real process matters: a
    signal, torchrun, the ``python -m bigbatch`` entry point and its exit status, an environment variable read
    before torch is imported, or a fresh interpreter (global torch state, a DataLoader worker's own stderr).
    Only what Python writes to ``sys.stdout``/``sys.stderr`` is captured (tqdm draws only on a terminal); an
    exception that ``main`` lets through is raised here, with its traceback, rather than turned into exit status 1.
    """
    from bigbatch.cli import main

    stdout, stderr = io.StringIO(), io.StringIO()
    removed = {key: os.environ.pop(key) for key in ("WORLD_SIZE", "RANK") if key in os.environ}
    previous = os.getcwd()
    os.chdir(cwd or ROOT)
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                returncode = main(list(args))
            except SystemExit as e:  # argparse's usage errors, as the process would exit
                if e.code is None or isinstance(e.code, int):
                    returncode = e.code
                else:
                    print(e.code, file=sys.stderr)
                    returncode = 1
    finally:
        os.chdir(previous)
        os.environ.update(removed)
    return subprocess.CompletedProcess(bigbatch_command(*args), returncode or 0, stdout.getvalue(), stderr.getvalue())


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent (it only exists beside the project's own checkout)")
    return SHARED_DATA


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_spawned(worker: Callable[[int, int, str], None], world: int, out_dir: Path,
                timeout_s: float = HANG_GUARD_S) -> list:
    """Run ``worker(rank, port, out_dir)`` in ``world`` spawned processes (they join a Gloo group on ``port``) and
    return what each wrote to ``out_dir/rank<r>.pt``; fail the test if they do not finish within ``timeout_s`` (a
    hang guard). Workers still running when this returns or raises (a failed rank, pytest-timeout) are killed."""
    import torch
    import torch.multiprocessing as mp

    ctx = mp.start_processes(worker, args=(free_port(), str(out_dir)), nprocs=world, join=False,
                             start_method="spawn")
    try:
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail(f"distributed workers did not finish within {timeout_s} s (hung?)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
            p.join()
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]


def count_host_transfers(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the Python-level ways a tensor's value reaches the host (each one a device sync on CUDA)."""
    import torch

    calls = {"n": 0}
    for method in ("item", "tolist", "__float__", "__int__", "__bool__", "cpu", "numpy"):
        original = getattr(torch.Tensor, method)

        def counted(self, *args, _original=original, **kwargs):
            calls["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counted)
    return calls
