from __future__ import annotations

import os
import subprocess
import sys
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
