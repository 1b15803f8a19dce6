from __future__ import annotations

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


def bigbatch_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "bigbatch", *args]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    """Run the real ``bigbatch`` CLI in a fresh process."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run(bigbatch_command(*args), cwd=cwd or ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent (it only exists beside the project's own checkout)")
    return SHARED_DATA


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_spawned(worker: Callable[[int, int, str], None], world: int, out_dir: Path, timeout_s: float) -> list:
    """Run ``worker(rank, port, out_dir)`` in ``world`` spawned processes (they join a Gloo group on ``port``) and
    return what each wrote to ``out_dir/rank<r>.pt``; fail the test if they do not finish within ``timeout_s``."""
    import torch
    import torch.multiprocessing as mp

    ctx = mp.start_processes(worker, args=(free_port(), str(out_dir)), nprocs=world, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                p.join(5)
            pytest.fail(f"distributed workers did not finish within {timeout_s} s")
    return [torch.load(out_dir / f"rank{r}.pt") for r in range(world)]
