"""Bounds checked before any work: the largest batch a run may reach (a batch schedule's, a growing adaptive batch's
``batch.max``) passes every check a fixed batch passes: the data order's memory, the 64-bit image counts, whole
micro-batches.
"""

from __future__ import annotations

import pytest

from bigbatch.cli import main
from bigbatch.config import load_config


def one_error(capsys: pytest.CaptureFixture, *expected: str) -> str:
    """The one ``error:`` line on stderr (no warning before it), holding each of ``expected``."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for text in expected:
        assert text in err, err
    return err.rstrip("\n")


# --------------------------------------------------------------------------------------------- the largest batch

ADAPTIVE = "batch={{mode: adaptive, base: 8, max: {max}, grow: {grow}}}"


def test_the_batches_a_run_may_reach_name_their_keys():
    from bigbatch.batching import reachable_batches

    grow = load_config("digits", [ADAPTIVE.format(max=64, grow="true"), "subdivisions=2"])
    assert reachable_batches(grow) == [("batch", 8), ("batch.max", 64)]
    fixed = load_config("digits", [ADAPTIVE.format(max=64, grow="false"), "subdivisions=2"])
    assert reachable_batches(fixed) == [("batch", 64)]
    scheduled = load_config("digits", ["batch=32", "schedule.batch=[{at: 2, factor: 2}, {at: 4, batch: 256}]"])
    assert reachable_batches(scheduled) == [("batch", 32), ("schedule.batch[0]", 64), ("schedule.batch[1]", 256)]


@pytest.mark.parametrize("command", ["show", "train"])
def test_a_growing_batch_is_refused_as_the_same_fixed_batch_is(command, tmp_path, capsys, no_training):
    """``max: 1e12`` was refused with ``grow: false`` and planned as "doubling up to 1000000000000" with ``grow:
    true``: the same check now refuses both, in the same words, naming the key that sets the batch."""
    out = ["--out", str(tmp_path / "run")] if command == "train" else []
    said = {}
    for grow, key in (("false", "batch: "), ("true", "batch.max: ")):
        assert main([command, "digits", *out, "--set", ADAPTIVE.format(max=10**12, grow=grow), "subdivisions=2"]) == 2
        said[grow] = one_error(capsys, f"error: {key}1000000000000 images per step", "for the data order alone")
        said[grow] = said[grow].removeprefix(f"error: {key}")
    assert said["true"] == said["false"]
    assert not (tmp_path / "run").exists()


def test_a_growing_batch_counts_its_images_in_64_bits_at_its_largest(capsys):
    """10 steps of up to 2^62 images: the old plan counted them at the base batch (10 x 8) and named it."""
    assert main(["show", "digits", "--set", ADAPTIVE.format(max=2**62, grow="true"), "subdivisions=2",
                 "steps=10"]) == 2
    one_error(capsys, f"batch.max: 10 steps of up to {2**62} images", "more than a 64-bit count holds")


def test_a_growing_batch_must_be_whole_micro_batches_before_any_work(tmp_path, capsys, no_training):
    assert main(["train", "digits", "--out", str(tmp_path / "run"), "--set", ADAPTIVE.format(max=1002, grow="true"),
                 "subdivisions=2", "steps=10"]) == 2
    one_error(capsys, "batch.max: a batch of 1002 is not a whole number of micro-batches of 4")
