"""A worker of a 2-process ``torchrun --max-restarts 1`` run is killed; torchrun restarts the workers, which
run the same command again; ``train`` finds its own checkpoint in ``--out`` and resumes from it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import COMMON, HANG_GUARD_S, ROOT, assert_same_weights, clean_env, free_port, weights

STEPS = 20
SETTINGS = [*COMMON, f"steps={STEPS}", "checkpoint.every=5", "eval.every=1000", "model.norm=group"]
PAUSE_AT = 7  # steps rank 1 does before it pauses: rank 0 has written the checkpoint of step 5, not yet step 10

# The workers of the run to be killed: rank 1 of the first attempt, before its step PAUSE_AT + 1, writes its pid to
# the file named by ``{marker}`` and waits to be killed (rank 0 waits for it in that step's all-reduce). The test
# kills it there, rather than at whatever step a polling loop happens to see, so that the run is cut at the same
# point however fast or busy the machine; the restarted workers (attempt 1) train on without a pause.
PAUSING_WORKER = """
import os, sys, time
from bigbatch.cli import main
from bigbatch.engine.hooks import Hook
from bigbatch.registry import HOOKS

if os.environ["RANK"] == "1" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    class PauseBeforeStep(Hook):
        stage = "write"

        def before_step(self, run):
            if run.step == {pause_at}:
                with open({marker!r} + ".tmp", "w") as f:
                    f.write(str(os.getpid()))
                os.replace({marker!r} + ".tmp", {marker!r})
                while True:
                    time.sleep(60)

    HOOKS.register("pause", lambda run: PauseBeforeStep())
sys.exit(main())
"""


def torchrun_command(out, max_restarts: int, rendezvous: str = "c10d", pause_marker=None) -> list[str]:
    """A 2-process launch with the c10d rendezvous (torchrun's fault-tolerant setup) or the static one
    (``--master-addr/--master-port``). Both keep one store across restarts; ``train`` keys its process group
    by attempt so the restarted workers do not meet the dead ones' addresses. With ``pause_marker``, the
    workers run ``PAUSING_WORKER``."""
    port = free_port()
    if rendezvous == "c10d":
        launch = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    else:
        launch = ["--master-addr", "127.0.0.1", "--master-port", str(port)]
    program = ["-m", "bigbatch"]
    if pause_marker is not None:
        program = ["--no-python", sys.executable, "-c",
                   PAUSING_WORKER.format(pause_at=PAUSE_AT, marker=str(pause_marker))]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts",
            str(max_restarts), *launch, *program, "train", "digits", "--out", str(out), "--set", *SETTINGS]


@pytest.mark.slow  # make test-slow: torchrun's own start and restart, ~45 s on 2 cores. The default suite keeps a
# worker restarted from its checkpoint by its agent in tests/engine/test_multinode.py (a node lost mid-run)
@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_killed_worker_restarts_from_the_last_checkpoint(tmp_path, rendezvous):
    out, marker = tmp_path / "restarted", tmp_path / "rank1-paused"
    with open(tmp_path / "stdout", "w") as stdout, open(tmp_path / "stderr", "w") as stderr:
        launcher = subprocess.Popen(torchrun_command(out, max_restarts=1, rendezvous=rendezvous, pause_marker=marker),
                                    cwd=ROOT, env=clean_env(), stdout=stdout, stderr=stderr, text=True)
    paused = None  # rank 1's pid while it waits to be killed
    try:
        # Rank 1 stays paused until killed: waiting for it is no race (the hang guard is pytest-timeout's).
        while not marker.exists() and launcher.poll() is None:
            time.sleep(0.05)
        assert marker.exists(), "the run ended before rank 1 paused: " + (tmp_path / "stderr").read_text()[-3000:]
        paused = int(marker.read_text())
        # rank 0 waits on rank 1 in step PAUSE_AT's all-reduce: its writer finishes the checkpoint of step 5 meanwhile
        last = out / "checkpoints" / "last.pt"
        while not last.exists():
            time.sleep(0.05)
        killed_at = torch.load(last, weights_only=True)["step"]
        os.kill(paused, signal.SIGKILL)
        paused = None
        launcher.wait(timeout=HANG_GUARD_S)
    finally:
        if paused is not None:
            os.kill(paused, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.terminate()  # torchrun stops its workers
            launcher.wait()
    stdout, stderr = (tmp_path / "stdout").read_text(), (tmp_path / "stderr").read_text()
    assert killed_at == 5, "killed after the first checkpoint, long before the end"
    assert launcher.returncode == 0, stderr[-3000:]
    assert "resumed from step " in stdout, "the restarted workers resumed from the run's checkpoint"
    state = torch.load(out / "checkpoints" / "last.pt", weights_only=True)
    assert state["step"] == STEPS
    logged = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()
              if "lr" in json.loads(line)]
    assert logged == sorted(set(logged)), "records of steps past the checkpoint were dropped, not duplicated"

    # The interrupted run ends where one that was never interrupted does.
    reference = tmp_path / "uninterrupted"
    plain = subprocess.run(torchrun_command(reference, max_restarts=0), cwd=ROOT, env=clean_env(),
                           capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert_same_weights(weights(reference), weights(out), atol=1e-6)
