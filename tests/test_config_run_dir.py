"""A run directory written before the config became a package (``tests/data/run-digits-before-config-package``:
digits, 4 steps of batch 32, a checkpoint every 2, EMA on) still reads and resumes: its ``config.yaml`` validates and
is written back byte for byte, and training goes on from its last checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from bigbatch.cli import main
from bigbatch.config import config_to_yaml, read_yaml, validate_config

BEFORE_PACKAGE_RUN = Path(__file__).parent / "data" / "run-digits-before-config-package"


def test_its_config_is_written_back_byte_for_byte():
    text = (BEFORE_PACKAGE_RUN / "config.yaml").read_text(encoding="utf-8")
    assert config_to_yaml(validate_config(read_yaml(BEFORE_PACKAGE_RUN / "config.yaml"))) == text


def test_it_resumes_from_its_last_checkpoint(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(BEFORE_PACKAGE_RUN, run)  # never write into tests/data
    before = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert before["step"] == 4
    assert main(["train", "--resume", str(run), "--set", "steps=6"]) == 0
    after = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert after["step"] == 6 and after["ema"]["updates"] == 6
    assert not torch.equal(after["model"][next(iter(after["model"]))], before["model"][next(iter(before["model"]))])
