"""A worker of a 2-process ``torchrun --max-restarts 1`` run is killed; torchrun restarts the workers, which
run the same command again; ``train`` finds its own checkpoint in ``--out`` and resumes from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

from tests.conftest import ROOT, free_port
from tests.test_distributed import COMMON, assert_same_weights, weights

STEPS = 120
SETTINGS = [*COMMON, f"steps={STEPS}", "checkpoint.every=5", "eval.every=1000", "model.norm=group"]


def torchrun_command(out, max_restarts: int, rendezvous: str = "c10d") -> list[str]:
    """A 2-process launch with the c10d rendezvous (torchrun's fault-tolerant setup) or the static one
    (``--master-addr/--master-port``). Both keep one store across restarts; ``train`` keys its process group
    by attempt so the restarted workers do not meet the dead ones' addresses."""
    port = free_port()
    if rendezvous == "c10d":
        launch = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    else:
        launch = ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts",
            str(max_restarts), *launch, "-m", "bigbatch", "train", "digits", "--out", str(out), "--set",
            *SETTINGS]


def clean_env() -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env


def worker_of_rank(launcher: psutil.Process, rank: int) -> psutil.Process | None:
    for child in launcher.children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank) and "bigbatch" in " ".join(child.cmdline()):
                return child
        except psutil.Error:
            continue
    return None


def checkpoint_step(out) -> int:
    """The step of ``last.pt`` from the metrics written beside it (reading the file itself could race a write)."""
    path = out / "metrics.jsonl"
    if not (out / "checkpoints" / "last.pt").exists() or not path.exists():
        return 0
    steps = [json.loads(line).get("step", 0) for line in path.read_text().splitlines() if line.strip()]
    return max(steps, default=0)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_killed_worker_restarts_from_the_last_checkpoint(tmp_path, rendezvous):
    out = tmp_path / "restarted"
    launcher = subprocess.Popen(torchrun_command(out, max_restarts=1, rendezvous=rendezvous), cwd=ROOT,
                                env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killed_at = None
    try:
        deadline = time.monotonic() + 200
        while killed_at is None and time.monotonic() < deadline and launcher.poll() is None:
            if (out / "checkpoints" / "last.pt").exists():
                victim = worker_of_rank(psutil.Process(launcher.pid), rank=1)
                if victim is not None:
                    killed_at = checkpoint_step(out)
                    victim.send_signal(signal.SIGKILL)
            time.sleep(0.05)
        stdout, stderr = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert killed_at is not None, "rank 1 was never seen running after the first checkpoint"
    assert killed_at < STEPS, "the run must still have been going when its worker was killed"
    assert launcher.returncode == 0, stderr[-3000:]
    assert "resuming the run in" in stdout, "the restarted workers resumed from the run's checkpoint"
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == STEPS
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if "lr" in json.loads(line)]
    assert logged == sorted(set(logged)), "records of steps past the checkpoint were dropped, not duplicated"

    # The interrupted run ends where one that was never interrupted does.
    reference = tmp_path / "uninterrupted"
    plain = subprocess.run(torchrun_command(reference, max_restarts=0), cwd=ROOT, env=clean_env(),
                           capture_output=True, text=True, timeout=240)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert_same_weights(weights(reference), weights(out), atol=1e-6)
