"""The run's instruments as a run uses them: the gradient noise scale in the training records and the run's
summary, per-layer update sizes in updates.csv and the records, both switched off by their keys."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from bigbatch.cli import main

SETTINGS = ["batch=64", "data.size=8", "model.width=4", "log.tensorboard=false", "eval.every=100",
            "checkpoint.every=4", "log.every=2", "steps=6"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_noise_scale_and_update_sizes_in_the_records(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "digits", "--out", str(out), "--set", *SETTINGS, "subdivisions=4"]) == 0
    train = [r for r in records(out) if "lr" in r]
    assert [r["step"] for r in train] == [1, 2, 4, 6]
    assert all(r["noise_scale"] > 0 for r in train[1:])  # defined once the smoothed estimates are positive
    for r in train:
        top = r["top_updates"]
        known = [u["relative"] for u in top if u["relative"] is not None]  # None: a tensor that was all zeros
        assert 1 <= len(top) <= 10 and known == sorted(known, reverse=True) and known
        assert all(u["relative"] is None for u in top[len(known):])
    summary = [r for r in records(out) if r.get("event") == "noise_scale"]
    assert len(summary) == 1 and summary[0]["batch"] == 64
    assert "gradient noise scale: ~" in capsys.readouterr().out
    with open(out / "updates.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {int(r["step"]) for r in rows} == {1, 2, 4, 6}
    names = {r["name"] for r in rows}
    assert "head.weight" in names and all(float(r["max_abs"]) >= 0 for r in rows)
    # a resume appends to the run's own file
    assert main(["train", "--resume", str(out), "--set", "steps=8"]) == 0
    with open(out / "updates.csv", newline="") as f:
        assert {int(r["step"]) for r in csv.DictReader(f)} == {1, 2, 4, 6, 7, 8}  # 7: the first after the resume


def test_one_micro_batch_has_no_noise_scale_and_the_keys_switch_them_off(tmp_path):
    single = tmp_path / "single"
    assert main(["train", "digits", "--out", str(single), "--set", *SETTINGS, "subdivisions=1"]) == 0
    assert not any("noise_scale" in r for r in records(single))
    off = tmp_path / "off"
    assert main(["train", "digits", "--out", str(off), "--set", *SETTINGS, "subdivisions=4",
                 "log.noise_scale=false", "log.updates=false"]) == 0
    assert not any("noise_scale" in r or "top_updates" in r for r in records(off))
    assert not (off / "updates.csv").exists()


def test_phase_times_add_up_to_the_step_and_the_run_prints_the_table(tmp_path, capsys):
    out = tmp_path / "phases"
    assert main(["train", "digits", "--out", str(out), "--set", *SETTINGS, "subdivisions=2"]) == 0
    train = [r for r in records(out) if "lr" in r]
    phases = ("t_data", "t_forward", "t_backward", "t_sync", "t_update", "t_other")
    for r in train:
        assert all(r[p] >= 0 for p in phases)
        assert sum(r[p] for p in phases) == pytest.approx(r["t_step"], rel=0.05, abs=1e-5)
        assert r["t_forward"] > 0 and r["t_backward"] > 0 and r["t_sync"] == 0  # one process: nothing to wait for
    table = [r for r in records(out) if r.get("event") == "phases"]
    assert len(table) == 1 and table[0]["steps"] == len(train) - 1  # the first step warms up: not in the table
    printed = capsys.readouterr().out
    assert "where the step time went:" in printed and "forward" in printed and "100.0 %" in printed
    off = tmp_path / "off"
    assert main(["train", "digits", "--out", str(off), "--set", *SETTINGS, "log.timing=off"]) == 0
    assert not any("t_forward" in r or r.get("event") == "phases" for r in records(off))


def test_a_sub_phase_is_timed_inside_the_phases_only_at_the_steps_that_are_read():
    import copy

    from bigbatch.engine.phases import PhaseClock

    clock = PhaseClock("events")
    timer = clock.sub_phase("bn_sync")
    assert clock.sub_phase("bn_sync") is timer and copy.deepcopy(timer) is timer  # a copied model times alike
    calls = []

    def one_step(measure: bool) -> dict | None:
        clock.measure_next = measure
        clock.begin("data")
        clock.switch("forward")
        assert timer(lambda x: calls.append(x) or x + 1, 1) == 2
        clock.switch("backward")
        timer(calls.append, 2)
        clock.switch("update")
        return clock.end(measure)

    times = one_step(True)
    assert times is not None and calls == [1, 2]
    assert 0 <= times["t_bn_sync"] <= times["t_forward"] + times["t_backward"]
    assert sum(times[f"t_{p}"] for p in ("data", "forward", "backward", "sync", "update", "other")) == \
        pytest.approx(times["t_step"], abs=1e-5)  # a sub-phase is not added (each time is rounded to 1 µs)
    assert one_step(False) is None and calls == [1, 2, 1, 2] and timer.spans == []  # run, not timed
    clock.measure_next = True
    clock.begin("data")
    clock.switch("forward")
    assert "t_bn_sync" not in clock.end(True)  # a step without the work has no sub-phase


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_profile_writes_a_trace_and_the_table_by_operator_kind(tmp_path, capsys, dtype):
    out = tmp_path / dtype
    assert main(["profile", "digits", "--steps", "1", "--out", str(out), "--set", "batch=64", "subdivisions=2",
                 "data.size=16", "model.width=8", f"precision.dtype={dtype}"]) == 0
    trace = json.loads((out / "trace.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any("conv" in name for name in names)
    printed = capsys.readouterr().out
    table = printed.split("kind")[1]
    for kind in ("convolution", "normalisation", "elementwise"):
        assert kind in table
    assert f"trace written to {out / 'trace.json'}" in printed


def test_profile_refuses_a_folder_with_files(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep")
    assert main(["profile", "digits", "--steps", "1", "--out", str(tmp_path)]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep"


def test_operator_kinds():
    from bigbatch.engine.profile import kind_of

    assert kind_of("aten::convolution_backward") == "convolution"
    assert kind_of("aten::addmm") == "matmul" and kind_of("aten::mm") == "matmul"
    assert kind_of("aten::native_batch_norm") == "normalisation"
    assert kind_of("aten::copy_") == "copies"
    assert kind_of("aten::leaky_relu") == "elementwise"
    assert kind_of("c10d::allreduce_") == "communication"
    assert kind_of("aten::empty") == "other"


def test_memory_growth_per_1000_steps_and_a_steady_rise(tmp_path):
    from bigbatch.telemetry.memory import COLUMNS, memory_growth

    def write(rows):
        path = tmp_path / "memory.csv"
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            for step, rss in rows:
                writer.writerow([0, 0, step, rss, *[0] * (len(COLUMNS) - 4)])
        return path

    rising = write([(s, 1000 + 0.5 * s) for s in range(0, 2000, 100)])  # 0.5 MiB per step
    per_1000, r2, samples, steps = memory_growth(rising, after_step=400)
    assert per_1000 == pytest.approx(500) and r2 == pytest.approx(1) and samples == 15 and steps == 1400
    assert not memory_growth(rising, after_step=400).steady  # 15 samples: too few to call it a leak
    assert memory_growth(write([(s, 1000 + 0.5 * s) for s in range(0, 2100, 100)]), after_step=0).steady  # 21
    assert not memory_growth(write([(s, 1000 + 0.5 * s) for s in range(100, 140)]), after_step=0).steady  # 39 steps
    flat = write([(s, 1000 + (7 if s % 200 else -7)) for s in range(0, 2000, 100)])  # noise around a level
    per_1000, r2, _, _ = memory_growth(flat, after_step=0)
    assert abs(per_1000) < 10 and r2 < 0.1
    assert memory_growth(write([(1, 5), (2, 6)]), after_step=0) is None  # too few samples


def test_a_resumed_runs_memory_trend_is_its_own_process_and_not_the_step_between_the_two(tmp_path):
    """The run before sampled a flat 1,000 MiB over steps 0-300; the resumed process, its own flat 1,400 MiB from
    step 300 on. Over both, a line through the step-up reads as a rise of 1 GiB per 1,000 steps (the false alarm);
    over this process's samples (``since``: where its rows begin), flat."""
    import torch

    from bigbatch.telemetry.memory import MemorySampler, memory_growth

    path = tmp_path / "memory.csv"
    first = MemorySampler(path, 60, torch.device("cpu"))
    for step in range(0, 300, 10):
        first._csv.writerow([0, 0, step, 1000, *[""] * (len(first.columns) - 4)])
    first._file.close()
    again = MemorySampler(path, 60, torch.device("cpu"))
    for step in range(300, 600, 10):
        again._csv.writerow([0, 0, step, 1400 + (step % 20) / 10, *[""] * (len(again.columns) - 4)])
    again._file.close()
    both = memory_growth(path, after_step=0)
    assert both.per_1000 > 1000  # what was reported before: over 1 GiB more per 1,000 steps, from one step-up
    own = memory_growth(path, after_step=0, since=again.first_row)
    assert own.samples == 30 and abs(own.per_1000) < 10 and not own.steady


def test_the_run_reports_memory_growth_after_the_first_evaluation(tmp_path, capsys, monkeypatch):
    from bigbatch.telemetry import memory

    monkeypatch.setattr(memory, "MEMINFO", tmp_path / "absent")  # not a unified-memory device, even on a Jetson
    out = tmp_path / "mem"
    assert main(["train", "digits", "--out", str(out), "--set", *SETTINGS, "eval.every=2", "memory.interval=0.001",
                 "steps=8"]) == 0
    growth = [r for r in records(out) if r.get("event") == "memory_growth"]
    assert len(growth) == 1 and growth[0]["samples"] >= 3 and isinstance(growth[0]["steady"], bool)
    said = capsys.readouterr().out
    assert "MiB of RSS per 1,000 steps" in said
    assert "steps: too short to tell a trend (that takes 20 samples over 200 steps)" in said  # 8 steps: not a trend


JETSON_MEMINFO = """MemTotal:        7859256 kB
MemFree:          362496 kB
MemAvailable:    2403420 kB
Buffers:           97212 kB
Cached:          2141300 kB
SwapCached:         1824 kB
AnonHugePages:    172032 kB
NvMapMemFree:      94784 kB
NvMapMemUsed:     {used} kB
CmaTotal:         753664 kB
CmaFree:          719864 kB
Hugepagesize:       2048 kB
"""
"""The lines of a Jetson's /proc/meminfo around the one that counts (the L4T kernel's NvMap lines)."""


def test_the_memory_log_has_the_gpus_share_of_ram_on_a_unified_memory_device(tmp_path):
    import torch

    from bigbatch.telemetry.memory import COLUMNS, MemorySampler, unified_gpu_mib

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(JETSON_MEMINFO.format(used=805068))
    assert unified_gpu_mib(meminfo) == pytest.approx(805068 / 1024)
    assert unified_gpu_mib(Path("/proc/meminfo")) is None or Path("/sys/module/nvmap").exists()  # not a Jetson
    sampler = MemorySampler(tmp_path / "memory.csv", 60.0, torch.device("cpu"), meminfo=meminfo)
    sampler.sample()
    meminfo.write_text(JETSON_MEMINFO.format(used=1048576))  # the GPU took 1 GiB
    sampler.sample()
    peaks = sampler.stop()
    with open(tmp_path / "memory.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == COLUMNS
    assert [float(r["unified_gpu_mib"]) for r in rows] == [pytest.approx(786.2), 1024.0, 1024.0]
    assert peaks["peak_unified_gpu_mib"] == 1024.0
    elsewhere = MemorySampler(tmp_path / "other.csv", 60.0, torch.device("cpu"), meminfo=tmp_path / "absent")
    assert elsewhere.meminfo is None and elsewhere.sample()["unified_gpu_mib"] == 0.0
    elsewhere.stop()


def test_a_resumed_run_appends_under_the_header_its_memory_log_has(tmp_path):
    import torch

    from bigbatch.telemetry.memory import MemorySampler

    older = ["time", "elapsed_s", "step", "rss_mib", "system_used_mib", "swap_used_mib", "cuda_allocated_mib",
             "cuda_reserved_mib", "cuda_peak_mib"]  # a run made before the unified-memory column
    path = tmp_path / "memory.csv"
    path.write_text(",".join(older) + "\n" + ",".join(["1.0", "0.0", "0", "100.0", *["0.0"] * 5]) + "\n")
    sampler = MemorySampler(path, 60.0, torch.device("cpu"))
    sampler.sample()
    sampler.stop()
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == older and all(len(row) == len(older) for row in rows) and len(rows) == 4


@pytest.mark.parametrize("content", [b"", b"\x00" * 4096, b"\xff\xfe not utf-8\n", b"name,size\ncat.jpg,3\n"],
                         ids=["empty", "nul-bytes", "not-utf8", "another-csv"])
def test_a_memory_log_that_is_not_one_is_kept_aside_and_a_new_one_begun(tmp_path, content):
    import torch

    from bigbatch.telemetry.memory import COLUMNS, MemorySampler

    path = tmp_path / "memory.csv"
    path.write_bytes(content)
    sampler = MemorySampler(path, 60.0, torch.device("cpu"))
    sampler.sample()
    sampler.stop()
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == COLUMNS and len(rows) == 3 and all(len(row) == len(COLUMNS) for row in rows)
    if content:  # set aside, byte for byte; an empty file just gets its header
        assert sampler.set_aside == tmp_path / "memory.csv.unreadable"
        assert sampler.set_aside.read_bytes() == content
    else:
        assert sampler.set_aside is None and sorted(p.name for p in tmp_path.iterdir()) == ["memory.csv"]


def test_a_sample_not_read_is_an_empty_cell_and_the_trend_skips_it(tmp_path):
    import torch

    from bigbatch.telemetry.memory import MemorySampler, memory_growth

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(JETSON_MEMINFO.format(used=102400))
    sampler = MemorySampler(tmp_path / "memory.csv", 60.0, torch.device("cpu"), meminfo=meminfo)
    for step, used in enumerate((102400, None, 122880, 133120, 143360), start=1):
        sampler.step = step * 100
        if used is None:
            meminfo.write_text("NvMapMemUsed: gone\n")  # a read that fails
        else:
            meminfo.write_text(JETSON_MEMINFO.format(used=used))
        sampler.sample()
    sampler._file.close()
    with open(tmp_path / "memory.csv", newline="") as f:
        assert [r["unified_gpu_mib"] for r in csv.DictReader(f)] == ["100.0", "", "120.0", "130.0", "140.0"]
    per_1000, r2, samples, _ = memory_growth(tmp_path / "memory.csv", 0, "unified_gpu_mib")
    assert per_1000 == pytest.approx(100.0) and r2 == pytest.approx(1.0) and samples == 4  # 10 MiB per 100 steps


def test_a_unified_memory_run_reports_the_trend_of_the_gpus_share(tmp_path, capsys, monkeypatch):
    from bigbatch.telemetry import memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text(JETSON_MEMINFO.format(used=524288))
    monkeypatch.setattr(memory, "MEMINFO", meminfo)
    out = tmp_path / "mem"
    assert main(["train", "digits", "--out", str(out), "--set", *SETTINGS, "eval.every=2", "memory.interval=0.001",
                 "steps=8"]) == 0
    with open(out / "memory.csv", newline="") as f:
        assert {r["unified_gpu_mib"] for r in csv.DictReader(f)} == {"512.0"}
    growth = [r for r in records(out) if r.get("event") == "memory_growth"]
    assert len(growth) == 1 and growth[0]["unified_gpu_mib_per_1000_steps"] == 0.0
    assert growth[0]["unified_gpu_steady"] is False and "rss_mib_per_1000_steps" in growth[0]
    assert "MiB of the GPU's share of RAM (NvMapMemUsed)" in capsys.readouterr().out


def test_a_full_disk_met_by_the_background_sampler_ends_the_run_in_one_line_naming_memory_csv(tmp_path,
                                                                                             monkeypatch):
    """The sampler's thread appends ``memory.csv`` every ``memory.interval`` s: a full disk there was a thread's
    traceback, naming no file, while the run went on. The thread now keeps the error; the loop raises it at its next
    step (or ``stop`` at the end), naming the file, and the CLI says it in one line, exit 1."""
    import errno
    import os
    import threading

    import torch

    from bigbatch.telemetry import memory
    from tests.helpers import TINY, run_main

    class FillsUp:
        """memory.csv, whose flushes after the ``room``-th meet a full disk (a write on a descriptor: no name)."""

        room = 2

        def __init__(self, *args, **kwargs):
            self.file, self.flushes = open(*args, **kwargs), 0

        def flush(self):
            self.flushes += 1
            if self.flushes > self.room:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self.file.flush()

        def close(self):
            self.file.close()

        def __getattr__(self, name: str):
            return getattr(self.file, name)

    thread_errors = []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    monkeypatch.setattr(memory, "open", lambda path, *args, **kwargs: (
        FillsUp(path, *args, **kwargs) if str(path).endswith("memory.csv") else open(path, *args, **kwargs)),
        raising=False)
    path = tmp_path / "memory.csv"
    sampler = memory.MemorySampler(path, 0.001, torch.device("cpu")).start()  # the header, then the first sample
    sampler._thread.join()  # ends when its sample meets the full disk
    assert thread_errors == [] and sampler.failure is not None
    with pytest.raises(OSError) as raised:
        sampler.check()
    assert raised.value.filename == str(path) and raised.value.errno == errno.ENOSPC
    with pytest.raises(OSError, match="No space left on device"):
        sampler.stop()

    # through the CLI: one line, whichever of the thread and the last sample meets it first
    result = run_main("train", "digits", "--out", str(tmp_path / "run"), "--set", *TINY, "steps=3",
                      "memory.interval=0.001")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {tmp_path / 'run' / 'memory.csv'}: No space left on device"), result.stderr
    assert thread_errors == []
