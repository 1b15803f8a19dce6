"""Under torchrun every rank meets a config mistake: it is said once a machine (by local rank 0), not once a rank
(``torchrun --nproc-per-node 8`` printed the same ``error:`` line 8 times before torchrun's own report)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers import HANG_GUARD_S, ROOT, bigbatch_command

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("local_rank, said", [("0", True), ("3", False), (None, True)])
def test_a_config_mistake_is_said_by_local_rank_0_only(local_rank, said):
    env = {key: value for key, value in os.environ.items() if key not in ("LOCAL_RANK", "RANK", "WORLD_SIZE")}
    if local_rank is not None:
        env.update(LOCAL_RANK=local_rank, RANK=local_rank, WORLD_SIZE="8")
    result = subprocess.run(bigbatch_command("show", "digits", "--set", "batch=0"), cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert result.returncode == 2
    assert result.stderr == ("error: batch: input should be greater than 0, got 0\n" if said else ""), result.stderr
