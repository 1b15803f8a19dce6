"""Memory: recovery from out-of-memory by cutting micro-batches finer (doubling subdivisions where even), the
memory limit, sizes and batch splitting."""

from __future__ import annotations

import json

import pytest
import torch

from bigbatch.config import load_config, parse_size
from bigbatch.data.pipeline.loader import split_batch
from bigbatch.engine import checkpoint
from bigbatch.engine.trainer import train
from tests.helpers import run_main

SMALL = ["batch=64", "subdivisions=4", "data.size=16", "model.width=8", "log.tensorboard=false", "log.every=1",
         "norm.momentum=0.2"]  # BatchNorm, with a momentum that depends on the number of micro-batches


def test_out_of_memory_doubles_subdivisions_and_loses_nothing(tmp_path):
    train(load_config("digits", [*SMALL, "steps=6", "debug.oom_at_step=3"]), tmp_path / "recovered")
    # The reference: 3 steps with 4 subdivisions, then resumed with 8 from step 3 on.
    train(load_config("digits", [*SMALL, "steps=3"]), tmp_path / "reference")
    train(load_config("digits", [*SMALL, "steps=6", "subdivisions=8"]), tmp_path / "reference", resume=True)
    recovered = checkpoint.load(tmp_path / "recovered" / "checkpoints" / "last.pt")
    reference = checkpoint.load(tmp_path / "reference" / "checkpoints" / "last.pt")
    assert recovered["step"] == reference["step"] == 6
    assert recovered["data"]["subdivisions"] == 8
    for key, value in reference["model"].items():
        torch.testing.assert_close(recovered["model"][key], value, rtol=1e-6, atol=1e-6, msg=key)
    events = [json.loads(line) for line in (tmp_path / "recovered" / "metrics.jsonl").open()]
    oom = [e for e in events if e.get("event") == "out_of_memory"]
    assert len(oom) == 1 and oom[0]["step"] == 4 and oom[0]["subdivisions"] == 8 and oom[0]["micro_batch"] == 8
    assert [e["step"] for e in events if "lr" in e] == [1, 2, 3, 4, 5, 6]


def test_out_of_memory_at_an_odd_micro_batch_cuts_it_by_its_smallest_prime_factor(tmp_path):
    """A micro-batch of 3 images (48 = 16 x 3) was refused as one "which cannot be halved"; it is cut into 3 of one
    image, the same global batch, as a run resumed with subdivisions 48 trains it."""
    odd = [*SMALL, "batch=48", "subdivisions=16"]
    train(load_config("digits", [*odd, "steps=3", "debug.oom_at_step=1"]), tmp_path / "recovered")
    train(load_config("digits", [*odd, "steps=1"]), tmp_path / "reference")
    train(load_config("digits", [*odd, "steps=3", "subdivisions=48"]), tmp_path / "reference", resume=True)
    recovered = checkpoint.load(tmp_path / "recovered" / "checkpoints" / "last.pt")
    reference = checkpoint.load(tmp_path / "reference" / "checkpoints" / "last.pt")
    assert recovered["step"] == reference["step"] == 3 and recovered["data"]["subdivisions"] == 48
    for key, value in reference["model"].items():
        torch.testing.assert_close(recovered["model"][key], value, rtol=1e-6, atol=1e-6, msg=key)
    events = [json.loads(line) for line in (tmp_path / "recovered" / "metrics.jsonl").open()]
    oom = [e for e in events if e.get("event") == "out_of_memory"]
    assert len(oom) == 1 and oom[0]["subdivisions"] == 48 and oom[0]["micro_batch"] == 1


def test_a_run_that_cannot_fit_stops_with_one_error_line(tmp_path, monkeypatch, capsys):
    """Every micro-batch over the limit (the RSS the limit reads made larger than it): subdivisions double until a
    micro-batch of one image, then one error line."""
    from bigbatch.cli import main
    from bigbatch.engine.hooks import memory

    monkeypatch.setattr(memory, "rss_bytes", lambda: 2 * 2**40)
    assert main(["train", "digits", "--out", str(tmp_path / "r"), "--set", *SMALL, "steps=2", "memory.limit=1TiB"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: out of memory at step 1 with micro-batches of 1 image")
    assert "memory.limit" in lines[0]


def test_a_limit_the_process_passes_before_any_work_is_refused_at_once(tmp_path):
    """A limit under what the process uses before its data and model (torch alone is hundreds of MiB) could never be
    met: one line naming the key, exit 2, nothing built or written (the run once built both, then failed as above)."""
    result = run_main("train", "digits", "--out", str(tmp_path / "r"), "--set", *SMALL, "steps=2", "memory.limit=1MiB")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: memory.limit: 1.0 MiB is less than this process uses already")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("text", "size"), [("2GiB", 2 * 2**30), ("512 MiB", 512 * 2**20), ("1.5GB", 1_500_000_000),
                                            (4096, 4096), ("100", 100)])
def test_sizes(text, size):
    assert parse_size(text) == size


def test_a_size_in_exponent_form_is_a_number_of_bytes():
    """YAML 1.2 reads ``1e9`` as a float: a whole number of bytes is a size; a fraction of a byte is refused in the
    size wording (it once met pydantic's "should be a valid integer ... or a valid string")."""
    from bigbatch.config.monitoring import MemoryConfig

    assert parse_size(MemoryConfig(limit=1e9).limit) == 10**9
    assert parse_size(MemoryConfig(limit=2.5e8).limit) == 250_000_000
    result = run_main("show", "digits", "--set", "memory.limit=1.5")
    assert result.returncode == 2
    assert result.stderr.startswith("error: memory.limit: expected a size such as 2GiB, 512MiB or a whole number")


def test_bad_size_is_a_config_error():
    result = run_main("show", "digits", "--set", "memory.limit=lots")
    assert result.returncode == 2 and result.stderr.startswith("error: memory.limit: expected a size")


def test_split_batch_keeps_the_images_in_order():
    images, labels = torch.arange(8.0)[:, None], torch.arange(8)
    halves = split_batch((images, labels), 2)
    assert [h[1].tolist() for h in halves] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert isinstance(halves[0], tuple)
    mixed = split_batch((images, [{"id": i} for i in range(8)]), 4)
    assert [m[1] for m in mixed][1] == [{"id": 2}, {"id": 3}]
    as_dict = split_batch({"x": images, "y": labels}, 2)
    assert as_dict[1]["y"].tolist() == [4, 5, 6, 7]
    # detection: a list of images of different sizes is cut into groups of whole images, like its targets
    pictures = [torch.zeros(3, 4 + i, 5) for i in range(4)]
    detection = split_batch((pictures, [{"image_id": i} for i in range(4)]), 2)
    assert [[p.shape[1] for p in piece[0]] for piece in detection] == [[4, 5], [6, 7]]
    assert [[t["image_id"] for t in piece[1]] for piece in detection] == [[0, 1], [2, 3]]
    listed = split_batch([images, labels], 2)  # default_collate's [images, labels]
    assert listed[1][1].tolist() == [4, 5, 6, 7]


def test_no_second_copy_of_the_data_on_the_cpu():
    from bigbatch.data.formats.digits import load_digits_split
    from bigbatch.data.pipeline.loader import batches_by_step
    from bigbatch.data.pipeline.order import GlobalBatchOrder
    from bigbatch.engine.transfer import to_device

    train_set, _ = load_digits_split(8)
    steps = batches_by_step(train_set, GlobalBatchOrder(len(train_set), 16, 0), 0, 1, 0, 1, 2)
    micro_batches = next(steps)
    assert to_device(micro_batches, torch.device("cpu")) is micro_batches
    assert not micro_batches[0][0].is_pinned()


def test_a_resume_with_other_subdivisions_takes_them_in_place_of_an_out_of_memory_re_cut(tmp_path):
    """A run re-cut from 4 to 8 micro-batches by an out-of-memory error resumes at 8 (its checkpoint keeps the cut).
    Resumed with ``--set subdivisions=8``, the layout the re-cut reached, it trains 8 micro-batches of 8, as its
    printed plan says: the re-cut applied on top of the new subdivisions made it 16 of 4, BatchNorm normalising over
    half the images asked for."""
    def resumed(out) -> dict:
        lines = [json.loads(line) for line in (out / "metrics.jsonl").open()]
        return [e for e in lines if e.get("event") == "resumed"][-1]

    for name, extra in (("kept", []), ("asked", ["subdivisions=8"]), ("other", ["subdivisions=2"])):
        out = tmp_path / name
        train(load_config("digits", [*SMALL, "steps=2", "checkpoint.every=2", "debug.oom_at_step=1"]), out)
        assert checkpoint.load(out / "checkpoints" / "last.pt")["data"]["subdivisions"] == 8
        train(load_config("digits", [*SMALL, "steps=3", *extra]), out, resume=True)
        got = resumed(out)
        assert (got["subdivisions"], got["micro_batch"]) == {"kept": (8, 8), "asked": (8, 8), "other": (2, 32)}[name]
