"""A resume with changed optimizer settings (``--resume RUN --set optim.weight_decay=...``) trains with them: torch's
``Optimizer.load_state_dict`` brings back the checkpoint's weight decay, momentum and ``lr_scale`` with its buffers,
while the run's ``config.yaml`` and later checkpoints recorded the new values, so the record said one thing and
training did another."""

from __future__ import annotations

import shutil

import torch

from tests.helpers import TINY, run_main


def groups(path) -> list[dict]:
    return torch.load(path, map_location="cpu", weights_only=False)["optimizer"]["param_groups"]


def test_a_resume_with_changed_optimizer_settings_trains_with_them(tmp_path):
    run = tmp_path / "run"
    result = run_main("train", "digits", "--out", str(run), "--set", *TINY, "steps=3", "checkpoint.every=3",
                      "optim.weight_decay=0.0005", "optim.momentum=0.9")
    assert result.returncode == 0, result.stderr
    same = tmp_path / "same"
    shutil.copytree(run, same)

    result = run_main("train", "--resume", str(run), "--set", "steps=5", "optim.weight_decay=0.05",
                      "optim.momentum=0.5")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("resumed from step 3 of 5"))
    assert lines[first + 1] == ("optim: this config's settings replace the checkpoint's: weight_decay 0.0005 -> 0.05, "
                                "momentum 0.9 -> 0.5")  # said right after the resume's first line
    assert {(g["weight_decay"], g["momentum"]) for g in groups(run / "checkpoints" / "last.pt")} == {(0.05, 0.5)}

    result = run_main("train", "--resume", str(same), "--set", "steps=5")
    assert result.returncode == 0, result.stderr
    assert "settings replace" not in result.stdout
    assert {(g["weight_decay"], g["momentum"]) for g in groups(same / "checkpoints" / "last.pt")} == {(0.0005, 0.9)}
    changed, kept = (torch.load(r / "checkpoints" / "last.pt", map_location="cpu", weights_only=False)["model"]
                     for r in (run, same))
    assert any(not torch.equal(changed[k], kept[k]) for k in kept)  # the new settings moved the weights


def test_a_resume_with_another_backbone_lr_scale_gives_the_backbone_that_share_of_the_lr(tmp_path):
    run = tmp_path / "run"
    result = run_main("train", "digits", "--out", str(run), "--set", *TINY, "steps=2", "checkpoint.every=2",
                      "optim.backbone_lr_scale=0.1")
    assert result.returncode == 0, result.stderr
    result = run_main("train", "--resume", str(run), "--set", "steps=3", "optim.backbone_lr_scale=0.5")
    assert result.returncode == 0, result.stderr
    assert "lr_scale 0.1 -> 0.5" in result.stdout
    saved = groups(run / "checkpoints" / "last.pt")
    scales = sorted(g.get("lr_scale", 1.0) for g in saved)
    assert scales[0] == 0.5 and scales[-1] == 1.0
    head = max(g["lr"] for g in saved)
    assert all(g["lr"] == head * g.get("lr_scale", 1.0) for g in saved)


def test_a_resume_whose_groups_split_the_parameters_otherwise_says_why(tmp_path):
    """Switching a split on or off (here the backbone's share of the LR) changes the optimizer's groups, which no
    checkpoint's state fits: one line that names the keys that split them and what to do, not torch's words alone."""
    run = tmp_path / "run"
    result = run_main("train", "digits", "--out", str(run), "--set", *TINY, "steps=2", "checkpoint.every=2",
                      "optim.backbone_lr_scale=0.1")
    assert result.returncode == 0, result.stderr
    result = run_main("train", "--resume", str(run), "--set", "steps=3", "optim.backbone_lr_scale=1")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith("error: optim: the checkpoint's optimizer state does not fit this config")
    assert "optim.backbone_lr_scale 1 or not" in result.stderr and "resume with the run's own settings" in result.stderr
